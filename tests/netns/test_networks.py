"""The Lace network model on real traffic (what is in place so far: service bindings)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lace_proxy.demo.testbed import (
    POD_CIDR4,
    POD_CIDR6,
    SERVICE_CIDR4,
    SERVICE_CIDR6,
    UPLINK_NODE4,
    UPLINK_NODE6,
    Result,
    Testbed,
    request_tcp,
)

from ..conftest import MODES
from ..lacekit import external, l3, net, routing, service_routing
from .proxykit import Harness, endpoints, service

pytestmark = pytest.mark.netns

GV = "lace-cni.io/v1alpha1"
VIP = "10.96.0.30"
NETWORKS = [
    {
        "apiVersion": GV,
        "kind": "Network",
        "metadata": {"name": "default"},
        "spec": {"type": "l3", "ipv4Subnet": {"prefix": "10.251.0.0/24"}},
    },
    {
        "apiVersion": GV,
        "kind": "Network",
        "metadata": {"name": "internet"},
        "spec": {"type": "external", "externalPrefixes": ["0.0.0.0/0", "::/0"]},
    },
]
BINDING = {
    "apiVersion": GV,
    "kind": "NetworkBindingPolicy",
    "metadata": {"name": "node-metrics"},
    "spec": {
        "matchKind": ["service"],
        "rules": [{"network": "internet", "selector": {"name": "lace-node-metrics"}}],
    },
}


def node_metrics(tb: Testbed) -> list[dict[str, Any]]:
    """A service backed by a hostNetwork pod: its endpoint is the node's own address."""
    slice_ = endpoints("lace-node-metrics", [tb.node], name="lace-node-metrics-v4")
    return [service("lace-node-metrics", [VIP]), slice_]


def test_host_network_service_carries_nothing_until_bound_to_internet(
    make_testbed: Callable[..., Testbed], tmp_path: Path
) -> None:
    tb = make_testbed(pods=1)
    proxy = Harness(tb, tmp_path / "manifests")
    try:
        proxy.write("metrics", *node_metrics(tb))
        proxy.sync()
        # No Network objects: plain kube-proxy, the node's server answers.
        reply = request_tcp(tb.client, VIP, 80)
        assert reply.reply is not None and reply.reply.name == "node", reply
        assert reply.reply.ip == UPLINK_NODE4
        # Networks declared: the node address lies in no pod network, so nothing serves it.
        proxy.write("networks", *NETWORKS)
        proxy.sync()
        assert request_tcp(tb.client, VIP, 80).outcome == "refused"
        binding = proxy.proxier.networks.bindings["default/lace-node-metrics"]
        assert binding.network is None and binding.excluded
        # Bound to internet, which covers node addresses: served again.
        proxy.write("binding", BINDING)
        proxy.sync()
        reply = request_tcp(tb.client, VIP, 80)
        assert reply.reply is not None and reply.reply.name == "node", reply
        assert proxy.proxier.networks.bindings["default/lace-node-metrics"].network == "internet"
        # Networks removed again: plain kube-proxy.
        proxy.remove("networks")
        proxy.remove("binding")
        proxy.sync()
        assert request_tcp(tb.client, VIP, 80).outcome == "reply"
    finally:
        proxy.close()


WEB_VIP4, WEB_VIP6 = "10.96.0.31", "fd00:96::31"
ADMIN_PROHIBITED = {4: (3, 13), 6: (1, 1)}  # what a connection the model refuses gets


def access_networks() -> list[dict[str, Any]]:
    return [
        l3("default", POD_CIDR4, POD_CIDR6),
        external("internet", "0.0.0.0/0", "::/0"),
        external("underlay", "10.250.0.0/24", "fd00:250::/64"),
    ]


def web(tb: Testbed) -> list[dict[str, Any]]:
    svc = service("web", [WEB_VIP4, WEB_VIP6], type="NodePort", node_port=30080)
    svc["metadata"]["labels"] = {"app": "web"}
    return [svc, endpoints("web", tb.pods), endpoints("web", tb.pods, v6=True)]


def denied(result: Result, family: int = 4) -> bool:
    return result.outcome == "refused" and (
        result.icmp is not None and (result.icmp.type, result.icmp.code) == ADMIN_PROHIBITED[family]
    )


@pytest.mark.parametrize("mode", MODES)
def test_frontends_answer_only_the_networks_allowed_to_reach_them(
    make_testbed: Callable[..., Testbed], tmp_path: Path, mode: str
) -> None:
    tb = make_testbed(pods=2)
    proxy = Harness(tb, tmp_path / "manifests", mode=mode)
    try:
        proxy.write("web", *web(tb))
        proxy.write("networks", *access_networks())
        proxy.sync()
        for vip, family in ((WEB_VIP4, 4), (WEB_VIP6, 6)):
            # A pod of the service's own network reaches it; the client's network does not.
            answer = request_tcp(tb.pods[0], vip, 80)
            assert answer.outcome == "reply", answer
            result = request_tcp(tb.client, vip, 80)
            assert denied(result, family), result
        for node_ip, family in ((UPLINK_NODE4, 4), (UPLINK_NODE6, 6)):
            result = request_tcp(tb.client, node_ip, 30080)
            assert denied(result, family), result
            # Not a frontend: the node's own server still answers on another port.
            assert request_tcp(tb.client, node_ip, 8080).outcome == "reply"

        # Peering the client's network to the pods' network grants the service.
        proxy.write("peering", routing("underlay-to-default", "underlay", "default"))
        proxy.sync()
        for address in (WEB_VIP4, WEB_VIP6):
            assert request_tcp(tb.client, address, 80).outcome == "reply"
        for address in (UPLINK_NODE4, UPLINK_NODE6):
            reply = request_tcp(tb.client, address, 30080)
            assert reply.reply is not None and reply.reply.name.startswith("pod"), reply

        # A ServiceRoutingPolicy grants only the services its selector picks.
        proxy.remove("peering")
        proxy.write("grant", service_routing("underlay-db", "underlay", "default", {"app": "db"}))
        proxy.sync()
        assert denied(request_tcp(tb.client, WEB_VIP4, 80))
        proxy.write("grant", service_routing("underlay-web", "underlay", "default", {"app": "web"}))
        proxy.sync()
        assert request_tcp(tb.client, WEB_VIP4, 80).outcome == "reply"
        assert request_tcp(tb.pods[1], WEB_VIP4, 80).outcome == "reply"

        # The same state from a full sync (as after a restart or the periodic reconcile).
        proxy.sync(full=True)
        assert request_tcp(tb.client, WEB_VIP6, 80).outcome == "reply"
        proxy.remove("grant")
        proxy.sync(full=True)
        assert denied(request_tcp(tb.client, WEB_VIP6, 80), 6)

        # Networks gone: plain kube-proxy, everyone is served again.
        proxy.remove("networks")
        proxy.sync()
        assert request_tcp(tb.client, WEB_VIP4, 80).outcome == "reply"
        held = proxy.nft.read_back()
        assert held is not None and held.elements["controlled-v4"] == set()
    finally:
        proxy.close()


def test_node_traffic_to_services_needs_service_cidrs_and_host_local_peering(
    make_testbed: Callable[..., Testbed], tmp_path: Path
) -> None:
    tb = make_testbed(pods=1)
    plain = Harness(tb, tmp_path / "plain")
    try:
        plain.write("web", *web(tb))
        plain.write("networks", *access_networks(), net("host-local", "hostLocal"))
        plain.write("peering", routing("host-to-default", "host-local", "default"))
        plain.sync()
        # Without node.serviceCIDRs the node's service traffic is not the proxy's: it leaves
        # by the node's routes (the testbed's uplink router rejects it distinctively).
        assert request_tcp(tb.node, WEB_VIP4, 80).outcome == "escaped"
        assert request_tcp(tb.node, WEB_VIP6, 80).outcome == "escaped"
    finally:
        plain.close()
    proxy = Harness(tb, tmp_path / "cidrs", service_cidrs=(SERVICE_CIDR4, SERVICE_CIDR6))
    try:
        proxy.write("web", *web(tb))
        proxy.write("networks", *access_networks())
        proxy.sync()
        # No host-local network: the node's traffic has no identity and reaches no service.
        assert denied(request_tcp(tb.node, WEB_VIP4, 80))
        proxy.write("host", net("host-local", "hostLocal"))
        proxy.sync()
        assert denied(request_tcp(tb.node, WEB_VIP4, 80))  # declared, not peered
        proxy.write("peering", routing("host-to-default", "host-local", "default"))
        proxy.sync()
        for vip in (WEB_VIP4, WEB_VIP6):
            reply = request_tcp(tb.node, vip, 80)
            assert reply.reply is not None and reply.reply.name == "pod1", reply
        # A NodePort on the node's own address is never answered from the node.
        for address in (UPLINK_NODE4, UPLINK_NODE6):
            assert request_tcp(tb.node, address, 30080, timeout=0.5).outcome == "timeout"
    finally:
        proxy.close()
