"""The node's routing table as egress needs it: which route a destination takes, and the
address that route prefers as source.

A `RoutingSnapshot` is read in one go (routes of the main table, the addresses of the
interfaces they leave by, the interfaces) and then queried without the kernel, so the SNAT
ranges and `doctor egress` agree with each other. The preferred source of a route is its
`src` (RTA_PREFSRC) when it has one, else what the kernel picks for the node's own packets on
that route: an address of the outgoing interface in the gateway's (or destination's) subnet,
else that interface's first primary address of global scope; with none, no source (the SNAT
table then masquerades, leaving the choice to the kernel). IPv6 source selection is
approximated the same way (not RFC 6724).

Only the main table's unicast routes count (policy rules that send pod traffic elsewhere are
not followed); of a multipath route, the first next hop.

The same snapshot names the node's pod interfaces (`pod_interfaces`): where the node routes a
pod prefix on-link, a pod lives behind the interface, whatever else it is addressed by.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from lace_proxy.dataplane.rtnetlink import RtnlChannel
from lace_proxy.prefixes import disjoint_ranges

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

MAIN_TABLE = 254
RTN_UNICAST = 1
DROPPING = {6: "blackhole", 7: "unreachable", 8: "prohibit"}  # RTN_* route types
RT_SCOPE_UNIVERSE = 0
IFA_F_SECONDARY = 0x01
RTAX_MTU = "RTAX_MTU"
_FAMILY: dict[int, int] = {socket.AF_INET: 4, socket.AF_INET6: 6}


@dataclass(frozen=True)
class Route:
    """A route of the main table: unicast, or one that drops (blackhole, unreachable,
    prohibit: no interface, no source)."""

    dst: str  # a CIDR ("0.0.0.0/0" for the default route)
    gateway: str | None
    interface: str
    prefsrc: str | None
    metric: int = 0
    mtu: int = 0  # the route's own MTU (0: the interface's)
    kind: str = "unicast"  # or "blackhole", "unreachable", "prohibit"

    @functools.cached_property
    def network(self) -> IPNetwork:
        return ipaddress.ip_network(self.dst)


@dataclass(frozen=True)
class Address:
    """An address of an interface, as `ip addr` shows it."""

    interface: str
    address: str
    prefixlen: int
    primary: bool = True
    scope: int = RT_SCOPE_UNIVERSE

    @property
    def network(self) -> IPNetwork:
        return ipaddress.ip_network(f"{self.address}/{self.prefixlen}", strict=False)


@dataclass(frozen=True)
class RoutingSnapshot:
    """Routes, addresses and interface MTUs read at one moment."""

    routes: tuple[Route, ...] = ()
    addresses: tuple[Address, ...] = ()
    mtus: tuple[tuple[str, int], ...] = ()  # (interface, MTU)

    def lookup(self, destination: str) -> Route | None:
        """The route the node selects for `destination`: longest prefix, then lowest metric."""
        ip = ipaddress.ip_address(destination)
        value, bits = int(ip), ip.max_prefixlen
        for prefixlen, by_network in self._index.get(ip.version, ()):
            route = by_network.get(value >> (bits - prefixlen) if prefixlen else 0)
            if route is not None:
                return route
        return None

    @functools.cached_property
    def _index(self) -> dict[int, list[tuple[int, dict[int, Route]]]]:
        """Per family, the prefix lengths longest first, each with its networks' best route
        (lowest metric): a lookup is one dict probe per length, not a scan of every route."""
        by_length: dict[tuple[int, int], dict[int, Route]] = {}
        for route in sorted(self.routes, key=lambda r: -r.metric):  # lower metrics win
            net = route.network
            key = int(net.network_address) >> (net.max_prefixlen - net.prefixlen)
            by_length.setdefault((net.version, net.prefixlen), {})[key] = route
        index: dict[int, list[tuple[int, dict[int, Route]]]] = {}
        for (version, prefixlen), networks in sorted(by_length.items(), key=lambda i: -i[0][1]):
            index.setdefault(version, []).append((prefixlen, networks))
        return index

    def source(self, route: Route) -> str | None:
        """The route's preferred source address (see the module docstring)."""
        if route.kind != "unicast":
            return None
        if route.prefsrc:
            return route.prefsrc
        version = route.network.version
        mine = [
            a
            for a in self.addresses
            if a.interface == route.interface
            and ipaddress.ip_address(a.address).version == version
            and a.scope == RT_SCOPE_UNIVERSE
        ]
        toward = route.gateway or str(route.network.network_address)
        for a in mine:
            if a.primary and ipaddress.ip_address(toward) in a.network:
                return a.address
        primary = [a for a in mine if a.primary]
        return primary[0].address if primary else None

    def mtu(self, route: Route) -> int:
        """The path MTU the route gives: its own, else its interface's (0: unknown)."""
        return route.mtu or dict(self.mtus).get(route.interface, 0)

    def source_ranges(self, family: int) -> list[tuple[str, str, str]]:
        """Disjoint (first, last, source) address ranges covering every destination of
        `family` that has a route with a preferred source: the SNAT map.

        The routes' longest-prefix match flattened (`lace_proxy.prefixes`).
        """

        def source_of(address: str) -> str | None:
            route = self.lookup(address)
            return self.source(route) if route else None

        return disjoint_ranges(family, (r.network for r in self.routes), source_of)

    def pod_interfaces(self, pod_prefixes: Iterable[str]) -> tuple[str, ...]:
        """The interfaces the node reaches pods by directly (sorted): those of on-link routes
        (no gateway) inside a pod prefix. An interface that also routes through a gateway is
        an uplink or a tunnel to other routers, even where pods share its subnet (a flat
        network), so it never counts: its traffic leaves the node."""
        nets = [ipaddress.ip_network(p, strict=False) for p in pod_prefixes]

        def in_pods(net: IPNetwork) -> bool:
            return any(net.network_address in n and net.prefixlen >= n.prefixlen for n in nets)

        uplinks = {r.interface for r in self.routes if r.gateway is not None}
        found = {
            r.interface
            for r in self.routes
            if r.kind == "unicast"
            and r.gateway is None
            and r.interface not in uplinks
            and in_pods(r.network)
        }
        return tuple(sorted(found))


def read_snapshot(rtnl: RtnlChannel) -> RoutingSnapshot:
    """Read the main table's unicast routes, the MTUs, and the addresses of the interfaces
    those routes go out of (the only ones a source is picked from: in IPVS mode, the dummy
    interface's thousands are never read)."""
    links = rtnl.links()
    names = {link.ifindex: link.name for link in links}
    routes = []
    for family in _FAMILY:
        for msg in rtnl.routes(family, MAIN_TABLE):
            route = _route(msg, names)
            if route is not None:
                routes.append(route)
    addresses = []
    routed = {r.interface for r in routes}
    for index in sorted(i for i, name in names.items() if name in routed):
        for a in rtnl.interface_addresses(index):
            primary = not a.flags & IFA_F_SECONDARY
            addresses.append(Address(names[index], a.address, a.prefixlen, primary, a.scope))
    mtus = tuple((link.name, link.mtu) for link in links)
    return RoutingSnapshot(tuple(routes), tuple(addresses), mtus)


def _route(msg: Any, names: dict[int, str]) -> Route | None:
    kind = DROPPING.get(int(msg["type"]), "unicast")
    if int(msg["type"]) != RTN_UNICAST and kind == "unicast":
        return None  # local, broadcast, multicast, ...: not where pod traffic goes out
    if msg.get("RTA_TABLE", MAIN_TABLE) != MAIN_TABLE:
        return None
    version = _FAMILY[int(msg["family"])]
    dst = msg.get("RTA_DST") or ("0.0.0.0" if version == 4 else "::")
    network = str(ipaddress.ip_network(f"{dst}/{msg['dst_len']}", strict=False))
    if kind != "unicast":
        return Route(network, None, "", None, int(msg.get("RTA_PRIORITY") or 0), kind=kind)
    gateway, oif = msg.get("RTA_GATEWAY"), msg.get("RTA_OIF")
    multipath = msg.get("RTA_MULTIPATH")
    if oif is None and multipath:  # ECMP: the first next hop
        hop = multipath[0]
        gateway, oif = hop.get("RTA_GATEWAY"), hop["oif"]
    if oif is None or int(oif) not in names:
        return None
    metrics = msg.get("RTA_METRICS")
    mtu = int(metrics.get(RTAX_MTU) or 0) if metrics is not None else 0
    return Route(
        network,
        str(gateway) if gateway else None,
        names[int(oif)],
        str(msg.get("RTA_PREFSRC")) if msg.get("RTA_PREFSRC") else None,
        int(msg.get("RTA_PRIORITY") or 0),
        mtu,
    )


def covered(address: str, cidrs: Iterable[str]) -> bool:
    """Whether `address` lies in any of `cidrs` (of its family)."""
    ip = ipaddress.ip_address(address)
    return any(
        ip in net
        for net in (ipaddress.ip_network(c, strict=False) for c in cidrs)
        if net.version == ip.version
    )
