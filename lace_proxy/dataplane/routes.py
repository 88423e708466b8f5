"""Policy routes that steer the node's own service traffic to the proxy (DESIGN.md §3).

With Network objects present and `node.serviceCIDRs` set, lace-proxy owns one rule priority
and one routing table:

    <priority>   from all to <serviceCIDR> iif lo lookup <table>
    table <table>: <serviceCIDR> dev <the node address's interface> src <the node address>

so a ClusterIP is routable from the node whatever other routes it has (no gateway needed),
and the node's connections to it carry the node's address; nftables translates them in
output. (Neither a `local` route nor one via `lo` will do: the kernel then sends no ICMP
error about a connection the network model refuses, and the node's client would hang.) The
node address is the Node's InternalIP of the family; without one there is no route. Without
serviceCIDRs there is no rule, and the node's service traffic follows its ordinary routes
(the uplink); without Network objects lace-proxy owns no rules or routes (plain kube-proxy).

Which pod networks the node may enter is decided in nftables, not here: a prohibit rule
cannot tell a new connection from a reply, and would also refuse the node's answers (and
ICMP errors) to pods of those networks.

Sync reads what the kernel holds (rules at that priority for that table from `lo`, routes in
that table), adds what is missing before it removes what is no longer wanted, and touches
nothing else. Routes and addresses are read by rtnetlink.RtnlChannel, the kernel leaving out
other tables (in IPVS mode, the local table's route of each service address); pyroute2 reads
the few rules and makes every change.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from lace_proxy.dataplane.rtnetlink import RtnlChannel
from lace_proxy.networks.graph import NetworkLayout

log = logging.getLogger(__name__)

RTN_UNICAST = 1
RT_SCOPE_LINK = 253
RTPROT_STATIC = 4
FAMILIES = {4: 2, 6: 10}  # IP version -> AF_INET / AF_INET6


@dataclass(frozen=True)
class RoutingSettings:
    """lace.routing: where lace-proxy's rule and routes live (see the module docstring)."""

    table: int = 1450
    priority: int = 1450
    service_cidrs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 1 <= self.table < 2**31 or self.table in (253, 254, 255):
            raise ValueError(f"routing table {self.table} is reserved or out of range")
        if not 1 <= self.priority <= 32765:
            raise ValueError(f"rule priority {self.priority} is not in 1-32765")
        for cidr in self.service_cidrs:
            ipaddress.ip_network(cidr)


class Rule(NamedTuple):
    family: int  # 4 or 6
    dst: str  # a CIDR


class Route(NamedTuple):
    family: int
    dst: str  # a CIDR
    source: str  # the node address: preferred source
    oif: int  # the interface holding it


def _net(cidr: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    return ipaddress.ip_network(cidr, strict=False)


class PolicyRoutes:
    """Keeps this node's Lace rules and routes as the network model wants them."""

    def __init__(self, settings: RoutingSettings, netns: str | None = None) -> None:
        self.settings = settings
        self.netns = netns

    def desired(
        self, layout: NetworkLayout, addresses: Iterable[str], interfaces: dict[str, int]
    ) -> tuple[set[Rule], set[Route]]:
        """The rules and table routes for this network model and these node addresses.

        `interfaces` maps this node's local addresses to the index of the interface holding
        them; a node address it does not hold gets no route.
        """
        if not layout.enabled:
            return set(), set()
        sources: dict[int, str] = {}
        for address in addresses:
            if address in interfaces:
                sources.setdefault(ipaddress.ip_address(address).version, address)
        nets = [_net(c) for c in self.settings.service_cidrs]
        rules = {Rule(n.version, str(n)) for n in nets}
        routes = {
            Route(n.version, str(n), sources[n.version], interfaces[sources[n.version]])
            for n in nets
            if n.version in sources
        }
        return rules, routes

    def sync(self, layout: NetworkLayout, addresses: Iterable[str]) -> int:
        """Make the kernel hold exactly the desired rules and routes; returns the changes."""
        with RtnlChannel(netns=self.netns) as rtnl:
            # Which interface holds each address: wanted only with the model on (in IPVS
            # mode, the dummy interface's thousands are among them).
            held = rtnl.addresses() if layout.enabled else []
            held_routes = self._routes(rtnl)
        interfaces = {address: index for index, address in held}
        rules, routes = self.desired(layout, addresses, interfaces)
        with IPRoute(netns=self.netns) if self.netns else IPRoute() as ipr:
            held_rules = self._rules(ipr)
            changes = 0
            for rule in sorted(rules - held_rules):
                self._rule(ipr, "add", rule)
                changes += 1
            for route in sorted(routes - held_routes):
                self._route(ipr, "replace", route)
                changes += 1
            for rule in sorted(held_rules - rules):
                self._rule(ipr, "del", rule)
                changes += 1
            for route in sorted(held_routes - routes):
                if route.dst not in {r.dst for r in routes}:  # else replaced above
                    self._route(ipr, "del", route)
                changes += 1
        if changes:
            log.info("policy routing: %d rule/route changes", changes)
        return changes

    def held(self) -> tuple[set[Rule], set[Route]]:
        """What the kernel holds at our priorities and in our table."""
        with RtnlChannel(netns=self.netns) as rtnl:
            routes = self._routes(rtnl)
        with IPRoute(netns=self.netns) if self.netns else IPRoute() as ipr:
            return self._rules(ipr), routes

    def cleanup(self) -> int:
        """Remove every rule and route of ours; returns how many there were."""
        return self.sync(NetworkLayout(), ())

    def _rules(self, ipr: Any) -> set[Rule]:
        p, t = self.settings.priority, self.settings.table
        rules: set[Rule] = set()
        for version, family in FAMILIES.items():
            for msg in ipr.get_rules(family=family):
                # Ours: our priority, our table, locally originated only (nothing else there
                # is touched, whoever made it).
                if (msg.get("priority"), msg.get("table"), msg.get("iifname")) != (p, t, "lo"):
                    continue
                dst = msg.get("dst") or ("0.0.0.0" if version == 4 else "::")
                rules.add(Rule(version, f"{dst}/{msg['dst_len']}"))
        return rules

    def _routes(self, rtnl: RtnlChannel) -> set[Route]:
        t = self.settings.table
        routes: set[Route] = set()
        for version, family in FAMILIES.items():
            for msg in rtnl.routes(family, t):
                dst = f"{msg.get('dst')}/{msg['dst_len']}"
                routes.add(Route(version, str(_net(dst)), msg.get("prefsrc"), msg.get("oif")))
        return routes

    def _rule(self, ipr: Any, command: str, rule: Rule) -> None:
        net = _net(rule.dst)
        kwargs: dict[str, Any] = {
            "family": FAMILIES[rule.family],
            "priority": self.settings.priority,
            "iifname": "lo",
            "dst": str(net.network_address),
            "dst_len": net.prefixlen,
            "table": self.settings.table,
        }
        try:
            ipr.rule(command, **kwargs)
        except NetlinkError as exc:
            raise RuntimeError(f"cannot {command} policy rule {rule}: {exc}") from exc

    def _route(self, ipr: Any, command: str, route: Route) -> None:
        kwargs: dict[str, Any] = {
            "family": FAMILIES[route.family],
            "dst": route.dst,
            "table": self.settings.table,
            "type": RTN_UNICAST,
            "scope": RT_SCOPE_LINK,
            "oif": route.oif,
            "proto": RTPROT_STATIC,
        }
        if command != "del":
            kwargs["prefsrc"] = route.source
        try:
            ipr.route(command, **kwargs)
        except NetlinkError as exc:
            raise RuntimeError(f"cannot {command} route {route}: {exc}") from exc
