"""The sync loop against a real kernel: initial sync, coalescing, resync, refused transactions."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from lace_proxy.dataplane.nft import Nft
from lace_proxy.dataplane.nftables.backend import NftablesBackend
from lace_proxy.dataplane.nftables.settings import NftablesSettings
from lace_proxy.demo.testbed import Testbed, request_tcp
from lace_proxy.health import ProxierHealth
from lace_proxy.metrics import ProxyMetrics
from lace_proxy.model.parse import parse_endpoint_slice, parse_service
from lace_proxy.proxier import Proxier
from lace_proxy.table import ServiceTable

from ..helpers import eventually
from .proxykit import NODE, VIP4, endpoints, names, service

pytestmark = pytest.mark.netns


@pytest.fixture
def tb(make_testbed: Callable[..., Testbed]) -> Testbed:
    return make_testbed(pods=3)


def make(tb: Testbed, **timing: float) -> tuple[Proxier, NftablesBackend]:
    backend = NftablesBackend(NftablesSettings(), Nft(tb.node.ns.name))
    proxier = Proxier(ServiceTable(NODE), backend, sources=["a", "b"], **timing)
    return proxier, backend


def run(proxier: Proxier, scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run the sync loop while the scenario plays, then stop it."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.create_task(proxier.run(stop))
        try:
            await scenario()
        finally:
            stop.set()
            await loop

    asyncio.run(main())


async def answers(tb: Testbed, n: int = 20) -> set[str]:
    def go() -> set[str]:
        return set(names([request_tcp(tb.client, VIP4, 80, timeout=0.5) for _ in range(n)]))

    return await asyncio.to_thread(go)


def web(tb: Testbed, proxier: Proxier, pods: int = 3) -> None:
    proxier.service_upserted(parse_service(service("web", [VIP4])))
    proxier.slice_upserted(parse_endpoint_slice(endpoints("web", tb.pods[:pods])))


def test_nothing_is_programmed_before_every_source_has_synced(tb: Testbed) -> None:
    proxier, backend = make(tb, min_sync_period=0.05)

    async def scenario() -> None:
        web(tb, proxier)
        proxier.synced("a")
        await asyncio.sleep(0.3)
        assert backend.read_back() is None  # "b" has not delivered its initial state
        proxier.synced("b")
        await eventually(lambda: backend.read_back() is not None)
        assert await answers(tb) == {"pod1", "pod2", "pod3"}

    run(proxier, scenario)


def test_changes_coalesce_within_min_sync_period(tb: Testbed) -> None:
    proxier, _ = make(tb, min_sync_period=0.5)

    async def scenario() -> None:
        web(tb, proxier)
        proxier.synced("a")
        proxier.synced("b")
        await eventually(lambda: proxier.stats.syncs == 1)
        for i in range(40):  # a burst of endpoint changes
            proxier.slice_upserted(parse_endpoint_slice(endpoints("web", tb.pods[: 1 + i % 3])))
            await asyncio.sleep(0.005)
        proxier.slice_upserted(parse_endpoint_slice(endpoints("web", tb.pods[1:2])))
        await eventually(lambda: proxier.table.pending == 0)
        assert await answers(tb) == {"pod2"}
        assert proxier.stats.syncs <= 3, proxier.stats  # 41 changes, not 41 syncs

    run(proxier, scenario)


def test_periodic_full_syncs_happen_even_while_changes_keep_coming(tb: Testbed) -> None:
    proxier, _ = make(tb, min_sync_period=0.05, sync_period=0.5)

    async def scenario() -> None:
        web(tb, proxier)
        proxier.synced("a")
        proxier.synced("b")
        await eventually(lambda: proxier.stats.syncs >= 1)
        first = proxier.stats.full_syncs
        for i in range(25):  # a change every 0.1 s for 2.5 s
            proxier.slice_upserted(parse_endpoint_slice(endpoints("web", tb.pods[: 1 + i % 3])))
            await asyncio.sleep(0.1)
        assert proxier.stats.full_syncs - first >= 3, proxier.stats

    run(proxier, scenario)


def test_periodic_full_sync_repairs_drift(tb: Testbed) -> None:
    proxier, backend = make(tb, min_sync_period=0.05, sync_period=0.3)
    backend.verify_every = 3  # every third full sync reads every element back

    async def scenario() -> None:
        web(tb, proxier)
        proxier.synced("a")
        proxier.synced("b")
        await eventually(lambda: _eq(answers(tb, 6), {"pod1", "pod2", "pod3"}))
        # Someone flushes our frontends behind our back.
        tb.exec(tb.node, ["nft", "flush", "set", "inet", "lace-proxy", "frontends-lb-v4"])
        assert await answers(tb, 3) != {"pod1", "pod2", "pod3"}
        full_before = proxier.stats.full_syncs
        await eventually(lambda: proxier.stats.full_syncs >= full_before + 3, timeout=5)
        assert await answers(tb) == {"pod1", "pod2", "pod3"}

    run(proxier, scenario)


async def _eq(coro: Coroutine[Any, Any, set[str]], expected: set[str]) -> bool:
    return await coro == expected


def test_a_refused_transaction_keeps_serving_and_recovers(tb: Testbed, tmp_path: Path) -> None:
    proxier, _ = make(tb, min_sync_period=0.05)

    async def scenario() -> None:
        web(tb, proxier)
        proxier.synced("a")
        proxier.synced("b")
        await eventually(lambda: _eq(answers(tb, 10), {"pod1", "pod2", "pod3"}))
        # Someone deletes one of our elements behind our back: the next change, which
        # deletes that element too, is refused by the kernel (ENOENT) as a whole.
        element = f"{{ {VIP4} . tcp . 80 }}"
        delete = ["nft", "delete", "element", "inet", "lace-proxy", "endpoints-2-v4", element]
        tb.exec(tb.node, delete)
        failures = proxier.stats.failures
        proxier.slice_upserted(parse_endpoint_slice(endpoints("web", tb.pods[:2])))
        await eventually(lambda: proxier.stats.failures > failures)
        # The refused change is retried as a full sync, which replaces the table whole.
        await eventually(lambda: _eq(answers(tb), {"pod1", "pod2"}))
        await eventually(lambda: proxier.stats.last_error is None)  # the loop has seen it too

    run(proxier, scenario)


def test_a_table_held_by_someone_else_is_retried_with_backoff_until_released(
    tb: Testbed,
) -> None:
    # Another program owns a table of our name (nft's "owner" flag: only its netlink
    # socket may change it, and the table goes when that socket closes): every sync is
    # refused by the kernel with EPERM until it lets go.
    holder = subprocess.Popen(
        ["ip", "netns", "exec", tb.node.ns.name, "nft", "-i"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert holder.stdin is not None
    holder.stdin.write("add table inet lace-proxy { flags owner; }\n")
    holder.stdin.flush()
    metrics = ProxyMetrics()
    health = ProxierHealth(0.5, metrics)  # unhealthy after 2 x syncPeriod = 1 s
    backend = NftablesBackend(NftablesSettings(), Nft(tb.node.ns.name))
    proxier = Proxier(
        ServiceTable(NODE),
        backend,
        sources=["a", "b"],
        min_sync_period=0.05,
        sync_period=0.5,
        metrics=metrics,
        health=health,
    )
    failures = "lace_proxy_sync_failures_total"

    async def scenario() -> None:
        try:
            await eventually(lambda: b"owner" in _ruleset(tb))
            await asyncio.sleep(0.1)  # the loop's start counts as an update (kube-proxy)
            web(tb, proxier)
            proxier.synced("a")
            proxier.synced("b")
            await eventually(lambda: proxier.stats.failures_in_a_row >= 4, timeout=10)
            # The table is read back over netlink; the kernel refuses to let us change it.
            assert "Operation not permitted" in (proxier.stats.last_error or "")
            # Backoff: the retries have slowed down, up to syncPeriod.
            assert proxier.retry_delay() >= 0.4
            assert metrics.registry.get_sample_value(failures, {"mode": "full"}) >= 4
            await eventually(lambda: health.healthz()[0] == 503, timeout=5)
        finally:
            holder.stdin.close()  # its socket closes: the kernel removes its table
            holder.wait(timeout=10)
        await eventually(lambda: _eq(answers(tb), {"pod1", "pod2", "pod3"}), timeout=10)
        # (The kernel has it before the loop has seen the sync end.)
        await eventually(lambda: proxier.stats.failures_in_a_row == 0)
        assert proxier.stats.last_error is None
        assert proxier.retry_delay() == proxier.min_sync_period
        assert health.healthz()[0] == 200

    run(proxier, scenario)


def _ruleset(tb: Testbed) -> bytes:
    return tb.exec(tb.node, ["nft", "list", "ruleset"]).stdout.encode()


def test_the_takeover_runs_once_when_the_first_sync_serves(tb: Testbed) -> None:
    """`run --cleanup-kube-proxy`'s hook: called once, after the first sync succeeded (the
    kernel then serves every endpoint), and a full sync follows it."""
    seen: list[set[str]] = []
    backend = NftablesBackend(NftablesSettings(), Nft(tb.node.ns.name))

    def takeover() -> None:
        seen.append(set(names([request_tcp(tb.client, VIP4, 80, timeout=0.5) for _ in range(20)])))

    proxier = Proxier(
        ServiceTable(NODE), backend, sources=["a", "b"], min_sync_period=0.05, takeover=takeover
    )

    async def scenario() -> None:
        web(tb, proxier)
        proxier.synced("a")
        proxier.synced("b")
        await eventually(lambda: proxier.stats.full_syncs == 2)
        proxier.slice_upserted(parse_endpoint_slice(endpoints("web", tb.pods[:1])))
        await eventually(lambda: proxier.table.pending == 0 and proxier.stats.syncs == 3)
        assert seen == [{"pod1", "pod2", "pod3"}]

    run(proxier, scenario)
