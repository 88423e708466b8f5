"""Policy routes for the node's service traffic, against a real kernel (netlink via pyroute2)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from lace_proxy.dataplane.routes import PolicyRoutes, Route, RoutingSettings, Rule
from lace_proxy.demo.testbed import (
    GWLINK_NODE4,
    SERVICE_CIDR4,
    SERVICE_CIDR6,
    UPLINK_NODE4,
    UPLINK_NODE6,
    Testbed,
)
from lace_proxy.model import parse_object
from lace_proxy.networks.graph import NetworkGraph, NetworkLayout

from ..lacekit import external
from .proxykit import NODE, Harness, endpoints, service

pytestmark = pytest.mark.netns


def layout() -> NetworkLayout:
    return NetworkGraph([parse_object(external("internet", "0.0.0.0/0"))]).layout()  # type: ignore[list-item]


def test_sync_converges_follows_the_node_address_and_leaves_others_alone(
    make_testbed: Callable[..., Testbed],
) -> None:
    tb = make_testbed(pods=0)
    node = tb.node.ns.name
    # Someone else's rule at the same priority (another table) must survive everything.
    tb.exec(tb.node, ["ip", "rule", "add", "to", "10.9.0.0/16", "lookup", "77", "pref", "1450"])
    routes = PolicyRoutes(RoutingSettings(service_cidrs=(SERVICE_CIDR4, SERVICE_CIDR6)), node)
    assert routes.sync(layout(), (UPLINK_NODE4, UPLINK_NODE6)) == 4
    rules, held = routes.held()
    assert rules == {Rule(4, SERVICE_CIDR4), Rule(6, SERVICE_CIDR6)}
    assert {(r.dst, r.source) for r in held} == {
        (SERVICE_CIDR4, UPLINK_NODE4),
        (SERVICE_CIDR6, UPLINK_NODE6),
    }
    assert routes.sync(layout(), (UPLINK_NODE4, UPLINK_NODE6)) == 0  # converged: no churn
    got = tb.exec(tb.node, ["ip", "route", "get", "10.96.5.5"]).stdout
    assert f"dev up0 table 1450 src {UPLINK_NODE4}" in got, got
    # The node's address moves to another interface: the route follows.
    assert routes.sync(layout(), (GWLINK_NODE4,)) > 0
    got = tb.exec(tb.node, ["ip", "route", "get", "10.96.5.5"]).stdout
    assert f"dev gw0 table 1450 src {GWLINK_NODE4}" in got, got
    assert all(isinstance(r, Route) for r in routes.held()[1])
    # No network model: nothing of ours remains; the other rule does.
    routes.sync(NetworkLayout(), (GWLINK_NODE4,))
    assert routes.held() == (set(), set())
    assert "lookup 77" in tb.exec(tb.node, ["ip", "rule"]).stdout


def test_a_route_the_kernel_refuses_fails_the_sync_which_converges_when_it_can(
    make_testbed: Callable[..., Testbed], tmp_path: Path
) -> None:
    """A netlink error mid-sync: nftables' part is applied whole, the refused route is
    retried (as a full sync that changes nothing in nftables), counted, and converges."""
    tb = make_testbed(pods=1)
    harness = Harness(tb, tmp_path / "m", routing=RoutingSettings(service_cidrs=(SERVICE_CIDR4,)))
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE},
        "status": {"addresses": [{"type": "InternalIP", "address": UPLINK_NODE4}]},
    }
    harness.write("node", node, external("internet", "0.0.0.0/0"))
    harness.write("web", service("web", ["10.96.0.10"]), endpoints("web", tb.pods))
    tb.exec(tb.node, ["ip", "link", "set", "up0", "down"])  # the node address's interface
    try:
        harness.source.poll()
        assert not asyncio.run(harness.proxier.sync())
        error = harness.proxier.stats.last_error or ""
        assert "cannot replace route" in error and "Network is down" in error, error
        failures = harness.proxier.metrics.registry.get_sample_value(
            "lace_proxy_sync_failures_total", {"mode": "full"}
        )
        assert failures == 1
        assert harness.routes is not None and harness.routes.held()[1] == set()
        state = harness.nft.read_back()  # nftables' own batch went in whole
        assert state is not None and any(c.startswith("from-") for c in state.chains)
        assert any(e.startswith("10.96.0.10 . tcp . 80") for e in state.elements["controlled-v4"])
        tb.exec(tb.node, ["ip", "link", "set", "up0", "up"])
        assert asyncio.run(harness.proxier.sync())
        assert harness.proxier.stats.failures_in_a_row == 0
        assert {r.dst for r in harness.routes.held()[1]} == {SERVICE_CIDR4}
    finally:
        tb.exec(tb.node, ["ip", "link", "set", "up0", "up"])
        harness.close()
