"""What this node announces: a route (/32, /128) for each service address that traffic
arriving here for it would be served, and the service CIDRs as aggregates if asked.

- An external address (load-balancer ingress IP, ExternalIP) is announced while this node
  serves it with a ready endpoint: under `externalTrafficPolicy: Local` a local one (so the
  route is withdrawn by the sync that sees the last one go, or only terminating ones left,
  as the health check node port turns 503), under `Cluster` one anywhere. A ClusterIP
  likewise, by its internal policy, when `announce.clusterIPs` is `perService`. The service
  CIDRs as aggregates (`aggregate`) stand for the whole range and are announced by every
  node.
- The kinds announced are `lace.bgp.announce`'s; a service's annotation
  lace-proxy.lace-cni.io/bgp-advertise turns all of its addresses on or off, and its
  communities annotation gives its routes' communities (an address several services share
  carries all of theirs).
- Under the Lace network model an address is announced only if some external network may
  reach the service (an address nothing outside may reach would draw traffic that is dropped).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from lace_proxy.config.bgp import LaceBgpAnnounceConfig
from lace_proxy.networks.graph import NetworkLayout
from lace_proxy.table import Plan

#: A route: the prefix ("10.96.0.10/32"), and its communities (canonical, sorted).
Routes = dict[str, tuple[str, ...]]


def external_networks(layout: NetworkLayout) -> frozenset[str]:
    """The networks of the layout whose prefixes are outside the pod networks' (the
    `external` networks: the internet and the like)."""
    pods = {network for _, network in layout.pod_prefixes}
    return frozenset(n for *_, n in layout.ranges if n not in pods and n != layout.host_local)


def routes(
    plans: Iterable[Plan],
    announce: LaceBgpAnnounceConfig,
    layout: NetworkLayout,
    service_cidrs: Iterable[str] = (),
) -> Routes:
    """Every route this node announces (see the module's docstring)."""
    return RouteCache(announce).routes(plans, layout, service_cidrs)


class RouteCache:
    """`routes`, kept per plan between syncs: the table hands out an unchanged plan as the
    very same object, so a sync works out only the plans that changed (at 30k services,
    working out every plan was 0.2-0.4 s of Python), and merges them only if any did."""

    def __init__(self, announce: LaceBgpAnnounceConfig) -> None:
        self.announce = announce
        self._outside: frozenset[str] | None = None  # the layout's external networks
        # By plan id: the plan as worked out, its prefixes and their communities.
        self._of_plan: dict[str, tuple[Plan, tuple[str, ...], tuple[str, ...]]] = {}
        self._aggregates: tuple[str, ...] = ()
        self._routes: Routes = {}

    def routes(
        self, plans: Iterable[Plan], layout: NetworkLayout, service_cidrs: Iterable[str] = ()
    ) -> Routes:
        """Every route this node announces, for these plans."""
        outside = external_networks(layout) if layout.enabled else frozenset()
        changed = outside != self._outside
        if changed:
            self._of_plan.clear()  # what outside networks may reach has changed
            self._outside = outside
        ids = set()
        for plan in plans:
            ids.add(plan.id)
            held = self._of_plan.get(plan.id)
            if held is None or held[0] is not plan:
                self._of_plan[plan.id] = (plan, *self._plan_routes(plan, outside))
                changed = True
        if len(ids) != len(self._of_plan):  # some plans are gone
            for pid in [pid for pid in self._of_plan if pid not in ids]:
                del self._of_plan[pid]
            changed = True
        aggregates: tuple[str, ...] = ()
        if self.announce.cluster_ips == "aggregate":
            aggregates = tuple(
                sorted({str(ipaddress.ip_network(c, strict=False)) for c in service_cidrs})
            )
        if changed or aggregates != self._aggregates:
            self._aggregates = aggregates
            out: dict[str, set[str]] = {cidr: set() for cidr in aggregates}
            for _, prefixes, communities in self._of_plan.values():
                for prefix in prefixes:
                    out.setdefault(prefix, set()).update(communities)
            self._routes = {prefix: tuple(sorted(c)) for prefix, c in sorted(out.items())}
        return self._routes

    def _plan_routes(
        self, plan: Plan, outside: frozenset[str]
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """One plan's prefixes and their communities."""
        announce = self.announce
        advertise = plan.bgp.advertise if plan.bgp is not None else None
        access = plan.access
        if advertise is False or (access is not None and not outside.intersection(access.sources)):
            return (), ()  # opted out; or nothing outside may reach it (or no network)
        addresses: list[str] = []
        if plan.external_verdict is None and any(b.ready for b in plan.external_backends):
            if advertise or announce.load_balancer_ips:
                addresses += plan.lb_ips
            if advertise or announce.external_ips:
                addresses += plan.external_ips
        if (
            (advertise or announce.cluster_ips == "perService")
            and plan.internal_verdict is None
            and any(b.ready for b in plan.internal_backends)
        ):
            addresses.append(plan.cluster_ip)
        prefixes = tuple(f"{a}/{128 if ':' in a else 32}" for a in addresses)
        return prefixes, plan.bgp.communities if plan.bgp is not None and prefixes else ()
