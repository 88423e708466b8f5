"""The routing snapshot egress reads: which route a destination takes, its preferred source,
and the disjoint SNAT ranges (pure; read from a real kernel in tests/netns/test_egress.py)."""

from __future__ import annotations

import ipaddress
import itertools

from lace_proxy.egress.routing import Address, Route, RoutingSnapshot

SNAPSHOT = RoutingSnapshot(
    routes=(
        Route("0.0.0.0/0", "10.250.0.254", "eth0", None),
        Route("10.250.0.0/24", None, "eth0", "10.250.0.11"),
        Route("198.18.0.0/16", "192.0.2.1", "eth1", None),
        Route("198.18.1.0/24", "192.0.2.1", "eth1", "172.16.0.11"),
        Route("198.18.2.0/24", "192.0.2.1", "eth1", None, metric=200),
        Route("198.18.2.0/24", "10.250.0.254", "eth0", None, metric=100),
        Route("::/0", "fd00::1", "eth0", None),
    ),
    addresses=(
        Address("eth0", "10.250.0.11", 24),
        Address("eth0", "10.250.0.99", 24, primary=False),
        Address("eth1", "203.0.113.7", 24),  # first, but not in the gateway's subnet
        Address("eth1", "192.0.2.11", 24),
        Address("eth0", "fd00::11", 64),
        Address("eth0", "fe80::1", 64, scope=253),
    ),
    mtus=(("eth0", 1500), ("eth1", 9000)),
)


def test_longest_prefix_then_lowest_metric() -> None:
    assert SNAPSHOT.lookup("8.8.8.8") == SNAPSHOT.routes[0]
    assert SNAPSHOT.lookup("198.18.1.5") == SNAPSHOT.routes[3]
    assert SNAPSHOT.lookup("198.18.9.5") == SNAPSHOT.routes[2]
    route = SNAPSHOT.lookup("198.18.2.5")
    assert route is not None and (route.interface, route.metric) == ("eth0", 100)
    assert RoutingSnapshot().lookup("8.8.8.8") is None


def test_preferred_source() -> None:
    source = SNAPSHOT.source
    assert source(SNAPSHOT.routes[3]) == "172.16.0.11"  # the route's own src
    assert source(SNAPSHOT.routes[2]) == "192.0.2.11"  # eth1's address in the gateway's subnet
    assert source(SNAPSHOT.routes[0]) == "10.250.0.11"  # primary, not the secondary
    assert source(SNAPSHOT.routes[6]) == "fd00::11"  # global scope, not link-local
    assert source(Route("10.9.0.0/16", None, "eth9", None)) is None
    assert SNAPSHOT.mtu(SNAPSHOT.routes[2]) == 9000
    assert SNAPSHOT.mtu(Route("10.9.0.0/16", None, "eth0", None, mtu=1400)) == 1400


def test_source_ranges_are_disjoint_and_agree_with_lookup() -> None:
    ranges = SNAPSHOT.source_ranges(4)
    bounds = [(int(ipaddress.ip_address(a)), int(ipaddress.ip_address(b))) for a, b, _ in ranges]
    assert bounds[0][0] == 0 and bounds[-1][1] == 2**32 - 1
    assert all(b1 + 1 == a2 for (_, b1), (a2, _) in itertools.pairwise(bounds))
    assert [(a, s) for a, _, s in ranges] == [
        ("0.0.0.0", "10.250.0.11"),  # the default route and 10.250.0.0/24 merged
        ("198.18.0.0", "192.0.2.11"),
        ("198.18.1.0", "172.16.0.11"),
        ("198.18.2.0", "10.250.0.11"),  # the lower metric's route, on eth0
        ("198.18.3.0", "192.0.2.11"),
        ("198.19.0.0", "10.250.0.11"),
    ]
    for probe in (
        "0.0.0.1",
        "10.250.0.5",
        "198.18.0.1",
        "198.18.1.255",
        "198.18.2.1",
        "198.19.0.0",
    ):
        route = SNAPSHOT.lookup(probe)
        assert route is not None
        (source,) = [s for a, b, s in ranges if _within(probe, a, b)]
        assert source == SNAPSHOT.source(route), probe
    assert SNAPSHOT.source_ranges(6) == [
        ("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "fd00::11")
    ]


def _within(address: str, first: str, last: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ipaddress.ip_address(first) <= ip <= ipaddress.ip_address(last)


def test_pod_interfaces_route_a_pod_prefix_on_link() -> None:
    snapshot = RoutingSnapshot(
        routes=(
            Route("0.0.0.0/0", "10.250.0.254", "eth0", None),
            Route("10.251.2.0/24", "10.250.0.12", "eth0", None),  # another node's pods
            Route("10.251.1.11/32", None, "cali1", None),  # a pod of this node
            Route("fd00:251:0:1::12/128", None, "cali2", None),
            Route("10.253.1.11/32", None, "cali3", None),  # outside every pod prefix
            Route("10.244.0.0/24", None, "cni0", "10.244.0.1"),  # a bridge: the podCIDR
            Route("10.244.1.0/24", "10.244.1.0", "flannel.1", None),  # a tunnel to pods
            Route("10.0.0.0/8", None, "tun0", None),  # holds pod prefixes, is not in one
            Route("10.240.0.0/16", None, "eth1", None),  # pods share eth1's flat network,
            Route("172.20.0.0/16", "10.240.0.1", "eth1", None),  # which leads elsewhere too
            Route("10.251.0.0/16", None, "", None, kind="blackhole"),
        )
    )
    pods = ("10.251.0.0/16", "fd00:251::/48", "10.244.0.0/16", "10.240.0.0/16")
    assert snapshot.pod_interfaces(pods) == ("cali1", "cali2", "cni0")
    assert snapshot.pod_interfaces(("10.253.1.0/24",)) == ("cali3",)  # e.g. a node's podCIDR
    assert snapshot.pod_interfaces(()) == ()
