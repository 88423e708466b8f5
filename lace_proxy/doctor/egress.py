"""`doctor egress`: what will happen to one pod's traffic out of the cluster, and why it may
fail (DESIGN.md §4), from one read of the node's routing table (`RoutingSnapshot`, as the
egress SNAT reads it): the route the node selects, the source address the far end will see,
and whether the return path can work. The pod's own connections to the destination: one to a
Service that the proxy sends there is service traffic, which the egress SNAT leaves alone."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lace_proxy.dataplane.egress_snat import nft_interface_name
from lace_proxy.doctor.severity import NOTE, PROBLEM
from lace_proxy.egress.routing import Route, RoutingSnapshot, covered


@dataclass(frozen=True)
class Finding:
    """Something about the path: a problem (exit 1) or a note, with what to do about it."""

    code: str
    severity: str
    message: str
    action: str

    def to_dict(self) -> dict[str, str]:
        return {
            "code": self.code,
            "severity": self.severity,
            "message": self.message,
            "action": self.action,
        }


@dataclass(frozen=True)
class EgressSettingsView:
    """What the doctor needs of the configuration (lace.egress, clusterCIDR,
    detectLocal.interfaceNamePrefix) and of this node's Node object (podCIDRs)."""

    enabled: bool = True
    pod_cidrs: tuple[str, ...] = ()
    non_masquerade_cidrs: tuple[str, ...] = ()
    routable_prefixes: tuple[str, ...] = ()
    pod_interface_prefix: str = ""
    node_pod_cidrs: tuple[str, ...] = ()


@dataclass(frozen=True)
class EgressReport:
    pod: str
    destination: str
    route: Route | None
    translated: bool
    source: str | None  # what the far end sees (None: nothing leaves)
    why: str
    path_mtu: int = 0
    findings: tuple[Finding, ...] = field(default=())

    @property
    def exit_code(self) -> int:
        return 1 if any(f.severity == PROBLEM for f in self.findings) else 0

    def to_dict(self) -> dict[str, Any]:
        route = None
        if self.route is not None:
            r = self.route
            route = {
                "kind": r.kind,
                "dst": r.dst,
                "gateway": r.gateway,
                "interface": r.interface,
                "prefsrc": r.prefsrc,
                "metric": r.metric,
            }
        return {
            "pod": self.pod,
            "destination": self.destination,
            "route": route,
            "translated": self.translated,
            "source": self.source,
            "why": self.why,
            "pathMTU": self.path_mtu,
            "findings": [f.to_dict() for f in self.findings],
            "ok": self.exit_code == 0,
        }

    def to_text(self) -> str:
        r = self.route
        if r is None:
            route = "none"
        else:
            via = f" via {r.gateway}" if r.gateway else ""
            src = f" src {r.prefsrc}" if r.prefsrc else ""
            dev = f" dev {r.interface}" if r.interface else ""
            route = f"{r.kind + ' ' if r.kind != 'unicast' else ''}{r.dst}{via}{dev}{src}" + (
                f" metric {r.metric}" if r.metric else ""
            )
        lines = [
            f"pod          {self.pod}",
            f"destination  {self.destination}",
            f"route        {route}",
            f"source       {self.source or '-'} ({self.why})",
        ]
        if self.path_mtu:
            lines.append(f"path MTU     {self.path_mtu}")
        for f in self.findings:
            lines.append(f"{f.severity:<12} {f.code}: {f.message}")
            lines.append(f"{'':<12} what to do: {f.action}")
        if not self.findings:
            lines.append("verdict      the return path can work")
        return "\n".join(lines)


def diagnose_egress(
    snapshot: RoutingSnapshot,
    settings: EgressSettingsView,
    pod: str,
    destination: str,
    nodes: Mapping[str, Sequence[str]] | None = None,
) -> EgressReport:
    """The path of a new connection from `pod` to `destination` leaving this node.

    `nodes`: the other nodes' names and addresses (a next hop among them is flagged)."""
    route = snapshot.lookup(destination)
    findings: list[Finding] = []
    if route is None:
        findings.append(
            Finding(
                "no_route",
                PROBLEM,
                f"this node has no route to {destination}: the packet is dropped here",
                f"add a route to {destination} (or a default route)",
            )
        )
        return EgressReport(pod, destination, None, False, None, "no route", 0, tuple(findings))

    if route.kind != "unicast":
        findings.append(
            Finding(
                "dropped_by_route",
                PROBLEM,
                f"the node's route to {destination} is `{route.kind} {route.dst}`: the packet "
                "is dropped here",
                f"remove or narrow the {route.kind} route {route.dst} if {destination} "
                "should be reachable",
            )
        )
        return EgressReport(
            pod, destination, route, False, None, f"{route.kind} route", 0, tuple(findings)
        )
    translated, source, why = _translation(snapshot, settings, route, pod, destination)
    if not covered(pod, settings.pod_cidrs) and settings.pod_cidrs:
        findings.append(
            Finding(
                "not_a_pod_address",
                NOTE,
                f"{pod} is outside clusterCIDR ({', '.join(settings.pod_cidrs)}): lace-proxy "
                "does not translate its traffic",
                "add the pod's CIDR to clusterCIDR if it is a pod address",
            )
        )
    pod_route = snapshot.lookup(pod)
    if pod_route is not None and pod_route.gateway is not None:
        findings.append(
            Finding(
                "pod_not_on_this_node",
                NOTE,
                f"{pod} is reached through {pod_route.gateway}: it is not a pod of this node, "
                "whose routes decide its egress",
                "run `lace-proxy doctor egress` on the pod's own node",
            )
        )
    routable = settings.routable_prefixes
    if source is not None and routable and not covered(source, routable):
        prefixes = ", ".join(routable)
        findings.append(
            Finding(
                "source_not_routable",
                PROBLEM,
                f"{destination} sees {source}, outside the routable prefixes ({prefixes}): "
                "its replies may not find their way back",
                f"route {route.dst} through a platform interface whose address is routable "
                f"(a route with `src` in {prefixes}), or advertise {source}'s prefix to "
                f"the network of {destination}",
            )
        )
    node = _node_of(route.gateway, nodes or {})
    if node is not None and translated:
        findings.append(
            Finding(
                "next_hop_is_a_node",
                PROBLEM,
                f"the next hop {route.gateway} is node {node}, which forwards without "
                f"re-sourcing: {destination} sees {source}, and its replies must route back to "
                "this node, not to " + node,
                f"route {route.dst} via a platform gateway of this node instead, or make sure "
                f"{destination}'s network routes {source} back to this node",
            )
        )
    elif node is not None:
        findings.append(
            Finding(
                "next_hop_is_a_node",
                NOTE,
                f"the next hop {route.gateway} is node {node}: untranslated here, what "
                f"{destination} sees depends on that node's own source NAT",
                f"run `lace-proxy doctor egress` on {node} for the rest of the path",
            )
        )
    path_mtu = snapshot.mtu(route)
    pod_mtu = dict(snapshot.mtus).get(pod_route.interface, 0) if pod_route else 0
    if path_mtu and pod_mtu > path_mtu:
        findings.append(
            Finding(
                "mtu_mismatch",
                PROBLEM,
                f"the pod's interface ({pod_route.interface if pod_route else '?'}) has MTU "
                f"{pod_mtu}, the path through {route.interface} {path_mtu}: larger packets are "
                "fragmented, or dropped where path MTU discovery is blocked",
                f"set the pod network's MTU to {path_mtu} or less (the CNI's MTU setting)",
            )
        )
    return EgressReport(pod, destination, route, translated, source, why, path_mtu, tuple(findings))


def _translation(
    snapshot: RoutingSnapshot, s: EgressSettingsView, route: Route, pod: str, destination: str
) -> tuple[bool, str | None, str]:
    """Whether the egress SNAT translates the connection, the source the far end sees, why."""
    if not s.enabled:
        return False, pod, "lace.egress.enabled is false: untranslated (unless the CNI masquerades)"
    if not covered(pod, s.pod_cidrs):
        return False, pod, "not a pod address (clusterCIDR): untranslated"
    if covered(destination, (*s.pod_cidrs, *s.non_masquerade_cidrs)):
        return False, pod, "destination in clusterCIDR or nonMasqueradeCIDRs: untranslated"
    prefix, out = s.pod_interface_prefix, route.interface
    derived = snapshot.pod_interfaces((*s.pod_cidrs, *s.node_pod_cidrs))
    if (prefix and out.startswith(prefix)) or (out in derived and nft_interface_name(out)):
        return False, pod, f"routed to {out}, a pod interface (a pod of this node): untranslated"
    source = snapshot.source(route)
    if source is None:
        return False, pod, f"the route on {route.interface} has no source address: untranslated"
    how = "the route's src" if route.prefsrc else f"{route.interface}'s address"
    return True, source, f"source-NATed to the route's preferred source ({how})"


def _node_of(gateway: str | None, nodes: Mapping[str, Sequence[str]]) -> str | None:
    if gateway is None:
        return None
    ip = ipaddress.ip_address(gateway)
    for name, addresses in nodes.items():
        if any(ipaddress.ip_address(a) == ip for a in addresses):
            return name
    return None
