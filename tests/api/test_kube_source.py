"""The `kube` source over real HTTP, against the API emulator: list, watch, resume, relist."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvloop

from lace_proxy.sandbox.apiserver import ApiServer
from lace_proxy.sources.kube import PROXY_SELECTOR, SOURCE_NAME, ApiConnection, KubeSource

from ..helpers import (
    EMULATOR_TIMING,
    Recorder,
    api_service,
    api_service_cidr,
    api_slice,
    eventually,
)


def node(name: str, zone: str = "a") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone}},
    }


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer(bookmark_interval=0.2) as server:
        yield server


class Running:
    """A KubeSource running on its own loop in a thread, with a recorder as its handler."""

    def __init__(self, api: ApiServer) -> None:
        self.api = api
        self.recorder = Recorder()
        self.source = KubeSource(
            ApiConnection(kubeconfig=str(api.kubeconfig_path)),
            self.recorder,
            "node-a",
            timing=EMULATOR_TIMING,
        )

    def take(self) -> list[tuple[str, str]]:
        return self.recorder.take()


def run(api: ApiServer, scenario: Callable[[Running], Any], runner: Any = asyncio.run) -> None:
    async def main() -> None:
        running = Running(api)
        stop = asyncio.Event()
        task = asyncio.create_task(running.source.run(stop))
        try:
            await scenario(running)
        finally:
            stop.set()
            await task

    runner(main())


async def settle(r: Running, seconds: float = 0.4) -> list[tuple[str, str]]:
    """Let events arrive, then take them."""
    await asyncio.sleep(seconds)
    return r.take()


def test_initial_list_then_changes(api: ApiServer) -> None:
    api.apply(api_service("web"))
    api.apply(api_slice("web-1", "web"))
    api.apply(node("node-a"))
    api.apply(node("node-b"))  # not ours: never delivered

    async def scenario(r: Running) -> None:
        await eventually(lambda: ("synced", SOURCE_NAME) in r.recorder.events)
        events = r.take()
        assert events[-1] == ("synced", SOURCE_NAME)
        assert sorted(events[:-1]) == [
            ("node+", "node-a"),
            ("service+", "default/web"),
            ("slice+", "default/web-1"),
        ]
        api.apply(api_service("web", port=81))
        api.apply(api_slice("web-2", "web", "10.0.0.2"))
        api.delete("EndpointSlice", "default", "web-1")
        await eventually(lambda: len(r.recorder.events) >= 3)
        assert sorted(await settle(r)) == [
            ("service+", "default/web"),
            ("slice+", "default/web-2"),
            ("slice-", "default/web-1"),
        ]
        assert r.recorder.objects["default/web"].ports[0].port == 81

    run(api, scenario)


def test_the_source_runs_on_uvloop_as_the_proxy_does(api: ApiServer) -> None:
    api.apply(api_service("web"))

    async def scenario(r: Running) -> None:
        loop = asyncio.get_running_loop()
        assert type(loop).__module__.startswith("uvloop")
        await eventually(lambda: ("service+", "default/web") in r.recorder.events)
        api.apply(api_service("web", port=83))
        await eventually(lambda: r.recorder.objects["default/web"].ports[0].port == 83)

    run(api, scenario, runner=uvloop.run)


def test_changes_arrive_in_order_and_deletes_are_delivered(api: ApiServer) -> None:
    async def scenario(r: Running) -> None:
        await eventually(lambda: ("synced", SOURCE_NAME) in r.recorder.events)
        r.take()
        api.apply(api_service("a"))
        api.apply(api_service("b"))
        api.delete("Service", "default", "a")
        await eventually(lambda: len(r.recorder.events) == 3)
        assert r.take() == [
            ("service+", "default/a"),
            ("service+", "default/b"),
            ("service-", "default/a"),
        ]

    run(api, scenario)


def test_other_proxies_and_headless_services_are_filtered_by_the_server(api: ApiServer) -> None:
    api.apply(api_service("mine"))
    api.apply(api_service("theirs", **{"service.kubernetes.io/service-proxy-name": "other"}))
    api.apply(api_service("headless", **{"service.kubernetes.io/headless": ""}))

    async def scenario(r: Running) -> None:
        await eventually(lambda: ("synced", SOURCE_NAME) in r.recorder.events)
        assert ("service+", "default/mine") in r.take()
        lists = [q for q in api.requests() if q.path == "/api/v1/services"]
        assert all(q.query.get("labelSelector") == PROXY_SELECTOR for q in lists)
        assert "default/theirs" not in r.recorder.objects
        assert "default/headless" not in r.recorder.objects

    run(api, scenario)


def test_a_dropped_watch_resumes_from_the_last_version_without_relisting(
    api: ApiServer,
) -> None:
    api.apply(api_service("web"))

    async def scenario(r: Running) -> None:
        await eventually(lambda: ("synced", SOURCE_NAME) in r.recorder.events)
        r.take()
        await asyncio.to_thread(api.wait_for_watches, 3)
        lists_before = _lists(api)
        api.drop_watches()
        api.apply(api_service("web", port=82))  # changed while disconnected
        await eventually(lambda: r.recorder.events == [("service+", "default/web")])
        r.take()
        assert _lists(api) == lists_before  # resumed by watching, not by listing again
        assert await settle(r) == []  # nothing re-delivered

    run(api, scenario)


def test_bookmarks_move_the_resume_point(api: ApiServer) -> None:
    api.apply(api_service("web"))

    async def scenario(r: Running) -> None:
        await eventually(lambda: ("synced", SOURCE_NAME) in r.recorder.events)
        api.apply(node("node-z"))  # moves the global version; not visible to services
        await asyncio.sleep(0.6)  # bookmarks (every 0.2 s) carry the new version
        reflector = next(x for x in r.source.reflectors if x.resource.name == "services")
        assert int(reflector.resource_version or 0) >= api.resource_version

    run(api, scenario)


def test_410_gone_relists_and_delivers_only_the_difference(api: ApiServer) -> None:
    api.apply(api_service("keep"))
    api.apply(api_service("gone"))
    api.apply(api_service("changed"))

    async def scenario(r: Running) -> None:
        await eventually(lambda: ("synced", SOURCE_NAME) in r.recorder.events)
        r.take()
        await asyncio.to_thread(api.wait_for_watches, 3)
        lists_before = _lists(api)
        api.unavailable(True, refuse=True)  # changes happen while we cannot watch
        api.delete("Service", "default", "gone")
        api.apply(api_service("changed", port=90))
        api.apply(api_service("new"))
        api.expire_history()
        api.unavailable(False)
        await eventually(lambda: len(r.recorder.events) >= 3, timeout=8)
        events = sorted(await settle(r))
        assert events == [
            ("service+", "default/changed"),
            ("service+", "default/new"),
            ("service-", "default/gone"),
        ]  # and nothing for "keep": the relist is diffed, not replayed
        assert _lists(api) > lists_before
        reflector = next(x for x in r.source.reflectors if x.resource.name == "services")
        assert reflector.relists >= 1
        assert set(r.recorder.objects) >= {"default/changed", "default/new"}
        assert r.recorder.objects["default/changed"].ports[0].port == 90

    run(api, scenario)


def test_an_unreachable_api_delivers_nothing_then_converges(api: ApiServer) -> None:
    api.apply(api_service("web"))

    async def scenario(r: Running) -> None:
        await eventually(lambda: ("synced", SOURCE_NAME) in r.recorder.events)
        r.take()
        api.unavailable(True)  # 503s from now on
        api.drop_watches()  # and the open watches break
        await asyncio.sleep(0.5)
        assert r.take() == []
        api.unavailable(False)
        api.apply(api_service("web", port=85))
        await eventually(lambda: r.recorder.objects["default/web"].ports[0].port == 85, 8)
        reflector = next(x for x in r.source.reflectors if x.resource.name == "services")
        assert reflector.watch_restarts >= 1

    run(api, scenario)


def test_a_stalled_api_is_noticed_by_the_read_timeout(api: ApiServer) -> None:
    api.apply(api_service("web"))

    async def scenario(r: Running) -> None:
        await eventually(lambda: ("synced", SOURCE_NAME) in r.recorder.events)
        api.stall(3.0)  # open watches go silent; our reads time out after 1.5 s
        await asyncio.sleep(2.5)
        reflector = next(x for x in r.source.reflectors if x.resource.name == "services")
        assert reflector.watch_restarts >= 1
        api.stall(0)
        api.apply(api_service("web", port=86))
        await eventually(lambda: r.recorder.objects["default/web"].ports[0].port == 86, 8)

    run(api, scenario)


def test_a_slow_api_still_works(api: ApiServer) -> None:
    api.latency(0.3)
    api.apply(api_service("web"))

    async def scenario(r: Running) -> None:
        await eventually(lambda: ("synced", SOURCE_NAME) in r.recorder.events, timeout=8)
        api.apply(api_service("web", port=87))
        await eventually(lambda: r.recorder.objects["default/web"].ports[0].port == 87, 8)

    run(api, scenario)


def test_an_invalid_update_keeps_the_last_good_version(api: ApiServer) -> None:
    api.apply(api_service("web"))

    async def scenario(r: Running) -> None:
        await eventually(lambda: ("synced", SOURCE_NAME) in r.recorder.events)
        r.take()
        api.apply(api_service("web", port=70000))
        await eventually(lambda: r.source.rejections.counts.get("invalid_port") == 1)
        assert r.take() == []
        assert r.recorder.objects["default/web"].ports[0].port == 80
        api.apply(api_service("web", port=88))
        await eventually(lambda: r.recorder.objects["default/web"].ports[0].port == 88)

    run(api, scenario)


def _lists(api: ApiServer) -> int:
    return sum(1 for q in api.requests() if q.query.get("watch") not in ("true", "1"))


def network(name: str, prefix: str = "10.251.0.0/24") -> dict[str, Any]:
    return {
        "apiVersion": "lace-cni.io/v1alpha1",
        "kind": "Network",
        "metadata": {"name": name},
        "spec": {"type": "l3", "ipv4Subnet": {"prefix": prefix}},
    }


def test_lace_resources_are_watched_once_the_api_serves_them(api: ApiServer) -> None:
    async def scenario(r: Running) -> None:
        # No CRDs: the source still syncs (the Lace resources are simply empty).
        await eventually(lambda: ("synced", SOURCE_NAME) in r.recorder.events)
        r.take()
        api.set_lace_crds(True)
        api.apply(network("default"))
        await eventually(lambda: ("Network+", "default") in r.recorder.events)
        assert r.recorder.objects["Network/default"].ipv4_prefix == "10.251.0.0/24"
        api.apply(network("default", "10.252.0.0/24"))
        await eventually(
            lambda: r.recorder.objects["Network/default"].ipv4_prefix == "10.252.0.0/24"
        )
        api.set_lace_crds(False)  # CRDs removed: their objects are gone
        await eventually(lambda: ("Network-", "default") in r.recorder.events)

    run(api, scenario)


def test_service_cidrs_are_watched_and_a_bad_one_is_rejected(api: ApiServer) -> None:

    async def scenario(r: Running) -> None:
        api.apply(api_service_cidr("10.96.0.0/16"))
        await eventually(lambda: ("servicecidr+", "kubernetes") in r.recorder.events)
        assert r.recorder.objects["ServiceCIDR/kubernetes"].cidrs == ("10.96.0.0/16",)
        r.take()
        api.apply(api_service_cidr("10.96.0.0/16", "fd00:96::/112"))
        await eventually(
            lambda: (
                r.recorder.objects["ServiceCIDR/kubernetes"].cidrs
                == ("10.96.0.0/16", "fd00:96::/112")
            )
        )
        api.delete("ServiceCIDR", None, "kubernetes")
        await eventually(lambda: ("servicecidr-", "kubernetes") in r.recorder.events)

    run(api, scenario)


def test_too_many_requests_are_waited_out_as_client_go_does(api: ApiServer) -> None:
    """429 with Retry-After (the apiserver's answer when overloaded, or while a CRD's storage
    starts): each request waits and is sent again, as client-go's REST client does; the
    source syncs with no failure counted."""
    api.apply(api_service("web"))
    api.throttle(4, retry_after=1)

    async def scenario(r: Running) -> None:
        started = asyncio.get_running_loop().time()
        await eventually(lambda: ("synced", SOURCE_NAME) in r.recorder.events)
        assert asyncio.get_running_loop().time() - started >= 1.0  # Retry-After was honoured
        assert ("service+", "default/web") in r.take()
        assert [x.watch_restarts for x in r.source.reflectors] == [0] * len(r.source.reflectors)

    run(api, scenario)
