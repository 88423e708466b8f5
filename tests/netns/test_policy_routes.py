"""Policy routes for the node's service traffic, against a real kernel (netlink via pyroute2)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from lace_proxy.dataplane.routes import PolicyRoutes, Route, RoutingSettings, Rule
from lace_proxy.model import parse_object
from lace_proxy.networks.graph import NetworkGraph, NetworkLayout
from lace_proxy.sandbox.testbed import (
    GWLINK_NODE4,
    SERVICE_CIDR4,
    SERVICE_CIDR6,
    UPLINK_NODE4,
    UPLINK_NODE6,
    Testbed,
)

from ..lacekit import external

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
