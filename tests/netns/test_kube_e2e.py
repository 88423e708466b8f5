"""End to end: the API emulator, the kube source, the proxier and real traffic in a netns."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from lace_proxy.dataplane.conntrack import Conntrack
from lace_proxy.dataplane.nft import Nft
from lace_proxy.dataplane.nftables import NftablesBackend, NftablesSettings
from lace_proxy.health import ProxierHealth
from lace_proxy.metrics import ProxyMetrics
from lace_proxy.proxier import Proxier
from lace_proxy.sandbox.apiserver import ApiServer
from lace_proxy.sandbox.testbed import POD_CIDR4, Testbed, request_tcp
from lace_proxy.sources.kube import SOURCE_NAME, ApiConnection, KubeSource, Timing
from lace_proxy.table import ServiceTable

from ..helpers import eventually
from .proxykit import NODE, endpoints, names, service
from .test_nftables_proxy import VIP4

pytestmark = pytest.mark.netns

FAST = Timing(read_timeout=2.0, backoff_initial=0.05, backoff_max=0.3)


def test_services_from_the_api_carry_traffic_and_follow_endpoints(
    make_testbed: Callable[..., Testbed],
) -> None:
    tb = make_testbed(pods=3)

    async def answers(n: int = 30) -> set[str]:
        def go() -> set[str]:
            return set(names([request_tcp(tb.client, VIP4, 80, timeout=0.5) for _ in range(n)]))

        return await asyncio.to_thread(go)

    async def same(expected: set[str]) -> bool:
        return await answers() == expected

    with ApiServer(bookmark_interval=0.2) as api:
        backend = NftablesBackend(
            NftablesSettings(cluster_cidrs=(POD_CIDR4,)),
            Nft(tb.node.ns.name),
            Conntrack(tb.node.ns.name),
        )
        proxier = Proxier(ServiceTable(NODE), backend, sources=[SOURCE_NAME], min_sync_period=0.05)
        source = KubeSource(
            ApiConnection(kubeconfig=str(api.kubeconfig_path)), proxier, NODE, timing=FAST
        )

        async def main() -> None:
            stop = asyncio.Event()
            running = asyncio.gather(source.run(stop), proxier.run(stop))
            try:
                api.apply(service("web", [VIP4]))
                api.apply(endpoints("web", tb.pods[:2], name="web-a"))
                api.apply(endpoints("web", tb.pods[2:], name="web-b"))
                await eventually(lambda: same({"pod1", "pod2", "pod3"}))
                # pod3 starts terminating: while others are ready it gets no new traffic.
                api.apply(
                    endpoints(
                        "web",
                        tb.pods[2:],
                        name="web-b",
                        ready=False,
                        serving=True,
                        terminating=True,
                    )
                )
                await eventually(lambda: same({"pod1", "pod2"}))
                # The ready ones go: the terminating (still serving) endpoint takes over.
                api.delete("EndpointSlice", "default", "web-a")
                await eventually(lambda: same({"pod3"}))
                # Then it is deleted too: the service has no endpoints and is refused.
                api.delete("EndpointSlice", "default", "web-b")
                await eventually(lambda: same({"refused"}))
            finally:
                stop.set()
                await running

        asyncio.run(main())
        backend.cleanup()


def test_an_api_outage_keeps_traffic_flowing_degrades_health_and_converges(
    make_testbed: Callable[..., Testbed],
) -> None:
    tb = make_testbed(pods=3)

    async def same(expected: set[str]) -> bool:
        def go() -> set[str]:
            return set(names([request_tcp(tb.client, VIP4, 80, timeout=0.5) for _ in range(30)]))

        return await asyncio.to_thread(go) == expected

    with ApiServer(bookmark_interval=0.2) as api:
        metrics = ProxyMetrics()
        health = ProxierHealth(0.5, metrics)  # unhealthy after 2 x syncPeriod = 1 s
        backend = NftablesBackend(NftablesSettings(), Nft(tb.node.ns.name))
        proxier = Proxier(
            ServiceTable(NODE),
            backend,
            sources=[SOURCE_NAME],
            min_sync_period=0.05,
            sync_period=0.5,
            metrics=metrics,
            health=health,
        )
        source = KubeSource(
            ApiConnection(kubeconfig=str(api.kubeconfig_path)),
            proxier,
            NODE,
            timing=FAST,
            on_contact=health.source_contact,
        )

        async def main() -> None:
            stop = asyncio.Event()
            running = asyncio.gather(source.run(stop), proxier.run(stop))
            try:
                api.apply(service("web", [VIP4]))
                api.apply(endpoints("web", tb.pods, name="web-a"))
                await eventually(lambda: same({"pod1", "pod2", "pod3"}))
                assert health.healthz()[0] == 200
                api.unavailable(True, refuse=True)
                api.apply(endpoints("web", tb.pods[:1], name="web-a"))  # unseen for now
                await asyncio.sleep(1.5)
                assert await same({"pod1", "pod2", "pod3"})  # the kernel keeps serving
                assert health.healthz()[0] == 503
                assert health.livez()[0] == 200  # restarting would not bring the API back
                api.unavailable(False)
                await eventually(lambda: same({"pod1"}), timeout=10)
                await eventually(lambda: health.healthz()[0] == 200)
            finally:
                stop.set()
                await running

        asyncio.run(main())
        backend.cleanup()
