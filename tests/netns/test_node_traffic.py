"""DESIGN.md §3's node-traffic table on real packets, in the two-node testbed (cluster.py).

One proxy per node (each its own pipeline and manifest folder, fed the same objects). Every
row is tested both ways: with the policy or setting it takes, and without it.

Networks: `default` (10.251.0.0/16: a1, a2, b1), `blue` (10.254.0.0/16: ablue, bblue),
`underlay` (the node addresses, external), `campus` (near's, external), `internet` (0/0),
and the `host-local` network of traffic the nodes originate.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lace_proxy.dataplane.routes import RoutingSettings
from lace_proxy.demo.testbed import Host, Result, request_tcp
from testkit.cluster_testbed import (
    A1_4,
    ABLUE4,
    B1_4,
    BBLUE4,
    NEAR_CIDR4,
    NODE_A4,
    NODE_B4,
    POD_CIDRS,
    SERVICE_CIDR4,
    UNDERLAY_CIDR4,
    ClusterTestbed,
)

from ..conftest import MODES
from ..lacekit import external, l3, net, routing, service_binding, service_routing
from .proxykit import Harness, endpoints, service

pytestmark = pytest.mark.netns

WEB_VIP = "10.96.0.40"
METRICS_VIP = "10.96.0.41"
WEB_NODE_PORT = 30080  # the nodes' own servers listen there too: an untranslated packet shows
METRICS_NODE_PORT = 30081
NETWORKS = [
    l3("default", "10.251.0.0/16"),
    l3("blue", "10.254.0.0/16"),
    external("underlay", UNDERLAY_CIDR4),
    external("campus", NEAR_CIDR4),
    external("internet", "0.0.0.0/0"),
    net("host-local", "hostLocal"),
]
HOST_PEERING = routing("host-to-default", "host-local", "default")


def node_object(name: str, address: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        # Node.spec.podCIDRs: the default network's block only (the node's "own pods").
        "spec": {"podCIDRs": [POD_CIDRS[name][0]]},
        "status": {"addresses": [{"type": "InternalIP", "address": address}]},
    }


def web(tb: ClusterTestbed) -> list[dict[str, Any]]:
    """A NodePort service in the default network, one endpoint on each node."""
    svc = service("web", [WEB_VIP], type="NodePort", node_port=WEB_NODE_PORT)
    svc["metadata"]["labels"] = {"app": "web"}
    a = endpoints("web", [tb.pods["a1"]], node="node-a", name="web-a")
    b = endpoints("web", [tb.pods["b1"]], node="node-b", name="web-b")
    return [svc, a, b]


def node_metrics(tb: ClusterTestbed) -> list[dict[str, Any]]:
    """A service backed by hostNetwork pods: its endpoints are the node addresses."""
    svc = service("lace-node-metrics", [METRICS_VIP], type="NodePort", node_port=METRICS_NODE_PORT)
    sl = endpoints("lace-node-metrics", [tb.nodes["node-a"]], node="node-a", name="m-a")
    sl["endpoints"] += endpoints("x", [tb.nodes["node-b"]], node="node-b")["endpoints"]
    return [svc, sl]


class Cluster:
    """A proxy on each node of a ClusterTestbed, fed the same manifests."""

    def __init__(
        self,
        tb: ClusterTestbed,
        folder: Path,
        *,
        service_cidrs: bool = True,
        pod_interfaces: str = "",
        mode: str = "nftables",
    ) -> None:
        routing_settings = RoutingSettings(service_cidrs=(SERVICE_CIDR4,) if service_cidrs else ())
        self.proxies = {
            name: Harness(
                tb,
                folder / name,
                node=host,
                node_name=name,
                routing=routing_settings,
                cluster_cidrs=("10.251.0.0/16", "10.254.0.0/16"),
                service_cidrs=routing_settings.service_cidrs,
                pod_interface_prefix=pod_interfaces,
                mode=mode,
            )
            for name, host in tb.nodes.items()
        }
        self.write("nodes", node_object("node-a", NODE_A4), node_object("node-b", NODE_B4))
        self.write("web", *web(tb))

    def write(self, name: str, *objects: dict[str, Any]) -> None:
        for proxy in self.proxies.values():
            proxy.write(name, *objects)

    def remove(self, name: str) -> None:
        for proxy in self.proxies.values():
            proxy.remove(name)

    def sync(self) -> None:
        for proxy in self.proxies.values():
            proxy.sync()

    def close(self) -> None:
        for proxy in self.proxies.values():
            proxy.close()


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    """The proxies' mode: nftables here, IPVS inside the VM (tests/vm)."""
    return str(request.param)


@pytest.fixture
def lace(cluster: ClusterTestbed, tmp_path: Path, mode: str) -> Iterator[Cluster]:
    c = Cluster(cluster, tmp_path, mode=mode)
    try:
        c.write("networks", *NETWORKS)
        c.sync()
        yield c
    finally:
        c.close()


def answered_by(result: Result, *names: str) -> bool:
    return result.reply is not None and result.reply.name in names


def denied(result: Result) -> bool:
    """Refused by the network model: ICMP administratively prohibited."""
    return result.icmp is not None and (result.icmp.type, result.icmp.code) == (3, 13)


def node(tb: ClusterTestbed, name: str) -> Host:
    return tb.nodes[name]


# -- row 1: from the node to a pod address ------------------------------------------------------


def test_node_to_pod_needs_host_local_peering_except_its_own_pods(
    cluster: ClusterTestbed, lace: Cluster
) -> None:
    a = node(cluster, "node-a")
    # Not peered: another node's pod is out of reach; the node's own pods stay reachable.
    assert denied(request_tcp(a, B1_4, 8080))
    assert answered_by(request_tcp(a, A1_4, 8080), "a1")
    # Only new connections from the node are refused: pods still get the node's answers.
    assert answered_by(request_tcp(cluster.pods["bblue"], NODE_A4, 8080), "node-a")
    lace.write("peering", HOST_PEERING)
    lace.sync()
    reply = request_tcp(a, B1_4, 8080)
    assert answered_by(reply, "b1") and reply.reply is not None
    assert reply.reply.peer == NODE_A4  # routed, not translated
    # Peering covers the peered network only.
    assert denied(request_tcp(a, BBLUE4, 8080))
    lace.remove("peering")
    lace.sync()
    assert denied(request_tcp(a, B1_4, 8080))


def test_a_peered_longer_prefix_inside_an_unpeered_network_is_reachable(
    cluster: ClusterTestbed, lace: Cluster
) -> None:
    """Classification decides: b1's /24 belongs to `lab` (longer prefix), peered from host-local,
    though it lies inside `default` (not peered)."""
    lace.write("lab", l3("lab", POD_CIDRS["node-b"][0]))
    lace.write("peering", routing("host-to-lab", "host-local", "lab"))
    lace.sync()
    a = node(cluster, "node-a")
    assert answered_by(request_tcp(a, B1_4, 8080), "b1")
    assert denied(request_tcp(a, BBLUE4, 8080))
    # The kernel holds the addresses that classify into unpeered networks, read back exactly.
    held = lace.proxies["node-a"].nft.read_back()
    assert held is not None
    assert held.elements["host-unpeered-v4"] == {
        "10.251.0.0/23",
        "10.251.3.0-10.251.255.255",
        "10.254.0.0/16",
    }


def test_the_node_reaches_its_own_pods_of_every_network_through_pod_interfaces(
    cluster: ClusterTestbed, tmp_path: Path, mode: str
) -> None:
    """Node.spec.podCIDRs name the default network's block only; with the pod interfaces'
    prefix (detectLocal.interfaceNamePrefix) the node's own blue pod is exempt too."""
    a = node(cluster, "node-a")
    for prefix in ("", "v"):  # pod veths: va1, vablue, vb1, ... (the uplink is eth0)
        c = Cluster(cluster, tmp_path / (prefix or "none"), pod_interfaces=prefix, mode=mode)
        try:
            c.write("networks", *NETWORKS)
            c.sync()
            reply = request_tcp(a, ABLUE4, 8080)
            assert answered_by(reply, "ablue") if prefix else denied(reply), (prefix, reply)
            assert answered_by(request_tcp(a, A1_4, 8080), "a1")  # in its podCIDRs
            assert denied(request_tcp(a, BBLUE4, 8080))  # another node's: not a local pod
        finally:
            c.close()


def test_without_networks_the_node_reaches_every_pod_and_lace_owns_no_rules(
    cluster: ClusterTestbed, tmp_path: Path, mode: str
) -> None:
    c = Cluster(cluster, tmp_path, mode=mode)
    try:
        c.sync()
        assert answered_by(request_tcp(node(cluster, "node-a"), BBLUE4, 8080), "bblue")
        assert answered_by(request_tcp(node(cluster, "node-a"), WEB_VIP, 80), "a1", "b1")
        routes = c.proxies["node-a"].routes
        assert routes is not None and routes.held() == (set(), set())
    finally:
        c.close()


# -- row 2: from the node to a ClusterIP --------------------------------------------------------


def test_node_to_cluster_ip_needs_peering_and_service_cidrs(
    cluster: ClusterTestbed, lace: Cluster, mode: str
) -> None:
    a = node(cluster, "node-a")
    route = cluster.exec(a, ["ip", "route", "get", WEB_VIP]).stdout
    if mode == "nftables":
        # The policy route makes the ClusterIP routable from the node with its own address.
        assert f"dev eth0 table 1450 src {NODE_A4}" in route, route
    else:  # the address is local (lace-ipvs0); masquerade gives the connection a source
        assert route.startswith(f"local {WEB_VIP} dev lo table local"), route
    assert denied(request_tcp(a, WEB_VIP, 80))  # serviceCIDRs, no peering
    lace.write("peering", HOST_PEERING)
    lace.sync()
    replies = [request_tcp(a, WEB_VIP, 80) for _ in range(12)]
    assert {r.reply.name for r in replies if r.reply} == {"a1", "b1"}, replies
    # The other node's endpoint saw node-a's own address: its answer can come back.
    assert {r.reply.peer for r in replies if r.reply and r.reply.name == "b1"} == {NODE_A4}
    lace.remove("peering")
    lace.sync()
    assert denied(request_tcp(a, WEB_VIP, 80))


def test_without_service_cidrs_node_service_traffic_is_not_proxied(
    cluster: ClusterTestbed, tmp_path: Path, mode: str
) -> None:
    c = Cluster(cluster, tmp_path, service_cidrs=False, mode=mode)
    try:
        c.write("networks", *NETWORKS)
        c.write("peering", HOST_PEERING)
        c.sync()
        result = request_tcp(node(cluster, "node-a"), WEB_VIP, 80)
        if mode == "nftables":
            assert result.outcome == "escaped", result
        else:  # IPVS would take it (the address is local): refused as unroutable instead
            assert result.icmp is not None and (result.icmp.type, result.icmp.code) == (3, 0)
        # Pods are still served: only the node's own traffic is left alone.
        assert answered_by(request_tcp(cluster.pods["a2"], WEB_VIP, 80), "a1", "b1")
    finally:
        c.close()


# -- row 3: from the node to another node's NodePort -------------------------------------------


def test_node_to_another_nodes_node_port_needs_a_grant_to_its_address_network(
    cluster: ClusterTestbed, lace: Cluster
) -> None:
    a = node(cluster, "node-a")
    assert denied(request_tcp(a, NODE_B4, WEB_NODE_PORT))
    # Host-local peering does not count: node-b sees node-a's address, in `underlay`.
    lace.write("peering", HOST_PEERING)
    lace.sync()
    assert denied(request_tcp(a, NODE_B4, WEB_NODE_PORT))
    lace.write("grant", service_routing("underlay-web", "underlay", "default", {"app": "web"}))
    lace.sync()
    assert answered_by(request_tcp(a, NODE_B4, WEB_NODE_PORT), "a1", "b1")
    # A grant to another network's sources is not one to underlay's.
    lace.write("grant", service_routing("campus-web", "campus", "default", {"app": "web"}))
    lace.sync()
    assert denied(request_tcp(a, NODE_B4, WEB_NODE_PORT))
    assert answered_by(request_tcp(cluster.near, NODE_B4, WEB_NODE_PORT), "a1", "b1")
    # Peering underlay to default grants it too (pods and services).
    lace.write("grant", routing("underlay-to-default", "underlay", "default"))
    lace.sync()
    assert answered_by(request_tcp(a, NODE_B4, WEB_NODE_PORT), "a1", "b1")


# -- row 4: from the node to a NodePort on its own address ------------------------------------


def test_node_port_on_the_nodes_own_address_is_never_answered(
    cluster: ClusterTestbed, lace: Cluster
) -> None:
    a = node(cluster, "node-a")
    lace.write("peering", HOST_PEERING)
    lace.write("grant", routing("underlay-to-default", "underlay", "default"))
    lace.sync()
    assert request_tcp(a, NODE_A4, WEB_NODE_PORT, timeout=0.5).outcome == "timeout"
    # The same NodePort from the other node is answered, so the service itself works.
    assert answered_by(request_tcp(node(cluster, "node-b"), NODE_A4, WEB_NODE_PORT), "a1", "b1")


# -- pods of other networks, and services backed by hostNetwork pods --------------------------


def test_pods_of_a_network_not_peered_reach_the_service_once_peered(
    cluster: ClusterTestbed, lace: Cluster
) -> None:
    ablue = cluster.pods["ablue"]
    assert denied(request_tcp(ablue, WEB_VIP, 80))
    assert denied(request_tcp(ablue, NODE_A4, WEB_NODE_PORT))
    assert answered_by(request_tcp(cluster.pods["a2"], WEB_VIP, 80), "a1", "b1")
    lace.write("peering", routing("blue-to-default", "blue", "default"))
    lace.sync()
    assert answered_by(request_tcp(ablue, WEB_VIP, 80), "a1", "b1")
    assert answered_by(request_tcp(cluster.pods["bblue"], WEB_VIP, 80), "a1", "b1")


def test_host_network_service_carries_nothing_until_bound_to_internet(
    cluster: ClusterTestbed, lace: Cluster
) -> None:
    lace.write("metrics", *node_metrics(cluster))
    lace.sync()
    # Its endpoints (node addresses) are in no pod network: bound to none, it has no
    # endpoints and no network may reach it.
    assert denied(request_tcp(cluster.far, NODE_A4, METRICS_NODE_PORT))
    binding = lace.proxies["node-a"].proxier.networks.bindings["default/lace-node-metrics"]
    assert binding.network is None and len(binding.excluded) == 2
    binding_policy = service_binding("node-metrics", "internet", {"name": "lace-node-metrics"})
    lace.write("binding", binding_policy)
    lace.sync()
    replies = [request_tcp(cluster.far, NODE_A4, METRICS_NODE_PORT) for _ in range(12)]
    assert {r.reply.name for r in replies if r.reply} == {"node-a", "node-b"}, replies
    # Bound to internet, it is internet's: a pod of `default` is not let in.
    assert denied(request_tcp(cluster.pods["a1"], METRICS_VIP, 80))
