"""End to end: the real kube-apiserver, the kube source, the proxier and real traffic in a netns.

The proxier runs in the test's process (the root namespace, where the apiserver listens on
loopback) and programs the node's namespace; the Services get their ClusterIPs from the server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lace_proxy.dataplane.conntrack import Conntrack
from lace_proxy.dataplane.nft import Nft
from lace_proxy.dataplane.nftables.backend import NftablesBackend
from lace_proxy.dataplane.nftables.settings import NftablesSettings
from lace_proxy.demo.testbed import POD_CIDR4, Testbed, request_tcp
from lace_proxy.health import ProxierHealth
from lace_proxy.metrics import ProxyMetrics
from lace_proxy.proxier import Proxier
from lace_proxy.sources.kube import SOURCE_NAME, ApiConnection, KubeSource
from lace_proxy.table import ServiceTable
from testkit.controlplane.cluster import ControlPlane
from testkit.controlplane.faults import Cut

from ..helpers import eventually
from ..kubekit import REAL, Rest
from .proxykit import NODE, endpoints, names, service

pytestmark = pytest.mark.netns


def create(admin: Rest, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    """Create proxykit's object in `namespace`; a Service's ClusterIP is the server's choice."""
    obj["metadata"]["namespace"] = namespace
    if obj["kind"] == "Service":
        del obj["spec"]["clusterIPs"]
    return admin.create(obj)


def test_services_from_the_api_carry_traffic_and_follow_endpoints(
    make_testbed: Callable[..., Testbed],
    control_plane: ControlPlane,
    admin: Rest,
    namespace: str,
) -> None:
    tb = make_testbed(pods=3)
    vip = create(admin, namespace, service("web", []))["spec"]["clusterIP"]

    async def same(expected: set[str]) -> bool:
        def go() -> set[str]:
            return set(names([request_tcp(tb.client, vip, 80, timeout=0.5) for _ in range(30)]))

        return await asyncio.to_thread(go) == expected

    backend = NftablesBackend(
        NftablesSettings(cluster_cidrs=(POD_CIDR4,)),
        Nft(tb.node.ns.name),
        Conntrack(tb.node.ns.name),
    )
    proxier = Proxier(ServiceTable(NODE), backend, sources=[SOURCE_NAME], min_sync_period=0.05)
    source = KubeSource(
        ApiConnection(kubeconfig=str(control_plane.admin_kubeconfig)), proxier, NODE, timing=REAL
    )

    async def main() -> None:
        stop = asyncio.Event()
        running = asyncio.gather(source.run(stop), proxier.run(stop))
        try:
            create(admin, namespace, endpoints("web", tb.pods[:2], name="web-a"))
            create(admin, namespace, endpoints("web", tb.pods[2:], name="web-b"))
            await eventually(lambda: same({"pod1", "pod2", "pod3"}))
            # pod3 starts terminating: while others are ready it gets no new traffic.
            terminating = endpoints(
                "web", tb.pods[2:], name="web-b", ready=False, serving=True, terminating=True
            )
            admin.merge(
                "EndpointSlice", "web-b", {"endpoints": terminating["endpoints"]}, namespace
            )
            await eventually(lambda: same({"pod1", "pod2"}))
            # The ready ones go: the terminating (still serving) endpoint takes over.
            admin.delete("EndpointSlice", "web-a", namespace)
            await eventually(lambda: same({"pod3"}))
            # Then it is deleted too: the service has no endpoints and is refused.
            admin.delete("EndpointSlice", "web-b", namespace)
            await eventually(lambda: same({"refused"}))
        finally:
            stop.set()
            await running

    try:
        asyncio.run(main())
    finally:
        backend.cleanup()


def test_an_api_outage_keeps_traffic_flowing_degrades_health_and_converges(
    make_testbed: Callable[..., Testbed],
    control_plane: ControlPlane,
    admin: Rest,
    namespace: str,
    cuts: Callable[[ControlPlane], Cut],
    tmp_path: Path,
) -> None:
    """The proxy's way to the apiserver is cut (its connections destroyed in the kernel, new
    ones reset) while an endpoint goes: the kernel keeps serving all three, health says the
    API is lost, liveness does not; once healed the proxy converges."""
    tb = make_testbed(pods=3)
    vip = create(admin, namespace, service("web", []))["spec"]["clusterIP"]
    cut = cuts(control_plane)

    async def same(expected: set[str]) -> bool:
        def go() -> set[str]:
            return set(names([request_tcp(tb.client, vip, 80, timeout=0.5) for _ in range(30)]))

        return await asyncio.to_thread(go) == expected

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
        ApiConnection(kubeconfig=str(cut.kubeconfig(tmp_path / "cut.kubeconfig"))),
        proxier,
        NODE,
        timing=REAL,
        on_contact=health.source_contact,
    )

    async def main() -> None:
        stop = asyncio.Event()
        running = asyncio.gather(source.run(stop), proxier.run(stop))
        try:
            create(admin, namespace, endpoints("web", tb.pods, name="web-a"))
            await eventually(lambda: same({"pod1", "pod2", "pod3"}))
            assert health.healthz()[0] == 200
            cut.cut()
            one = endpoints("web", tb.pods[:1], name="web-a")
            admin.merge(
                "EndpointSlice", "web-a", {"endpoints": one["endpoints"]}, namespace
            )  # unseen
            await asyncio.sleep(1.5)
            assert await same({"pod1", "pod2", "pod3"})  # the kernel keeps serving
            assert health.healthz()[0] == 503
            assert health.livez()[0] == 200  # restarting would not bring the API back
            cut.heal()
            await eventually(lambda: same({"pod1"}), timeout=10)
            await eventually(lambda: health.healthz()[0] == 200)
        finally:
            stop.set()
            await running

    try:
        asyncio.run(main())
    finally:
        backend.cleanup()
