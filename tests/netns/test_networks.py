"""The Lace network model on real traffic (what is in place so far: service bindings)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lace_proxy.sandbox.testbed import UPLINK_NODE4, Testbed, request_tcp

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
