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
    outside = external_networks(layout) if layout.enabled else frozenset()
    out: dict[str, set[str]] = {}
    if announce.cluster_ips == "aggregate":
        for cidr in sorted({str(ipaddress.ip_network(c, strict=False)) for c in service_cidrs}):
            out[cidr] = set()
    for plan in plans:
        advertise = plan.bgp.advertise if plan.bgp is not None else None
        if advertise is False:
            continue
        access = plan.access
        if access is not None and not outside.intersection(access.sources):
            continue  # nothing outside may reach it (or it is bound to no network)
        communities = plan.bgp.communities if plan.bgp is not None else ()
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
        for address in addresses:
            prefix = f"{address}/{128 if ':' in address else 32}"
            out.setdefault(prefix, set()).update(communities)
    return {prefix: tuple(sorted(c)) for prefix, c in sorted(out.items())}
