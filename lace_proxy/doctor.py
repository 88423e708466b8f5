"""`lace-proxy doctor`: what will happen to a pod's traffic out of the cluster, and why it
may fail (DESIGN.md §4); and whether this node is fit for lace-proxy.

`egress` reads the node's routing table once (`RoutingSnapshot`, as the egress SNAT does)
and answers for one pod and destination: the route the node selects, the source address the
far end will see, and whether the return path can work. `node` checks the kernel features
for the mode, sysctls, MTUs against the other nodes', and kube-proxy's leftovers. Both read,
never change; each finding says what to do.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute

from lace_proxy.dataplane.egress import nft_interface_name
from lace_proxy.dataplane.ipvs import virtual_services
from lace_proxy.dataplane.nft import Nft, NftError, enter_netns
from lace_proxy.egress.routing import Route, RoutingSnapshot, covered, read_snapshot
from lace_proxy.migration import kube_proxy_chain

PROBLEM, NOTE = "problem", "note"


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


# -- doctor node ---------------------------------------------------------------------------------

#: Sysctls doctor node reads (/proc/sys/net of the reading thread's namespace).
NODE_SYSCTLS = (
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.rp_filter",
    "net.ipv4.conf.all.route_localnet",
    "net.netfilter.nf_conntrack_max",
    "net.netfilter.nf_conntrack_count",
)
OK = "ok"


@dataclass(frozen=True)
class NodeFacts:
    """What doctor node reads of the kernel, as data (`read_node_facts`)."""

    nft_error: str | None = None  # why `nft list tables` failed; None: nftables works
    tables: tuple[tuple[str, str], ...] = ()  # (family, name)
    kube_chains: tuple[str, ...] = ()  # "family table chain" of chains named KUBE-*
    sysctls: Mapping[str, int | None] = field(default_factory=dict)  # None: absent
    ipvs: bool = False  # /proc/net/ip_vs exists
    modules: frozenset[str] = frozenset()  # loaded or built-in kernel modules
    interfaces: tuple[tuple[str, int], ...] = ()  # (name, MTU)
    uplink: str | None = None  # the interface of the default route (IPv4, else IPv6)
    kube_ipvs0_services: int | None = None  # None: no kube-ipvs0; else IPVS services on it


@dataclass(frozen=True)
class Check:
    check: str
    status: str  # ok, problem, note
    message: str
    action: str = ""

    def to_dict(self) -> dict[str, str]:
        return {k: v for k, v in vars(self).items() if v}


@dataclass(frozen=True)
class NodeReport:
    mode: str
    checks: tuple[Check, ...]

    @property
    def exit_code(self) -> int:
        return 1 if any(c.status == PROBLEM for c in self.checks) else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "checks": [c.to_dict() for c in self.checks],
            "ok": self.exit_code == 0,
        }

    def to_text(self) -> str:
        lines = [f"mode         {self.mode}"]
        for c in self.checks:
            lines.append(f"{c.status:<12} {c.check}: {c.message}")
            if c.action:
                lines.append(f"{'':<12} what to do: {c.action}")
        return "\n".join(lines)


@dataclass(frozen=True)
class NodeSettingsView:
    """What doctor node needs of the configuration and the Node objects."""

    mode: str = "nftables"
    scheduler: str = "rr"
    pod_interface_prefix: str = ""
    node_mtus: Mapping[str, int] = field(default_factory=dict)  # other nodes' published MTUs
    own_mtu: int | None = None  # this node's published MTU (its Node's annotation)


def diagnose_node(facts: NodeFacts, s: NodeSettingsView) -> NodeReport:
    """Kernel features for the mode, sysctls, MTUs, and kube-proxy's leftovers."""
    checks = [_nftables(facts), _conntrack(facts)]
    if s.mode == "ipvs":
        checks += _ipvs(facts, s.scheduler)
    checks += _sysctls(facts)
    checks += _mtus(facts, s)
    checks += _leftovers(facts)
    return NodeReport(s.mode, tuple(checks))


def _nftables(facts: NodeFacts) -> Check:
    if facts.nft_error is not None:
        return Check(
            "nftables",
            PROBLEM,
            f"nftables does not answer: {facts.nft_error}",
            "install nftables (the nft binary) and load nf_tables (modprobe nf_tables)",
        )
    return Check("nftables", OK, f"nftables answers ({len(facts.tables)} tables)")


def _conntrack(facts: NodeFacts) -> Check:
    count = facts.sysctls.get("net.netfilter.nf_conntrack_count")
    limit = facts.sysctls.get("net.netfilter.nf_conntrack_max")
    if count is None or limit is None:
        return Check(
            "conntrack",
            NOTE,
            "connection tracking is not loaded yet (net.netfilter.nf_conntrack_max is missing;"
            " nftables loads it with the first rule that needs it)",
            "where modules cannot be loaded on demand: modprobe nf_conntrack (NAT and the "
            "service rules need it)",
        )
    if limit and count > 0.9 * limit:
        return Check(
            "conntrack",
            PROBLEM,
            f"the conntrack table is {count}/{limit} full: new connections will be dropped",
            "raise conntrack.maxPerCore / conntrack.min (or net.netfilter.nf_conntrack_max)",
        )
    return Check("conntrack", OK, f"{count} of {limit} conntrack entries in use")


def _ipvs(facts: NodeFacts, scheduler: str) -> list[Check]:
    if not facts.ipvs:
        return [
            Check(
                "ipvs",
                PROBLEM,
                "mode ipvs, but the kernel has no IPVS (/proc/net/ip_vs is missing)",
                "load ip_vs (modprobe ip_vs), or use mode nftables",
            )
        ]
    checks = [Check("ipvs", OK, "IPVS is loaded")]
    if f"ip_vs_{scheduler}" not in facts.modules:
        checks.append(
            Check(
                "ipvs_scheduler",
                NOTE,
                f"the scheduler module ip_vs_{scheduler} is not loaded yet (the kernel loads it "
                "with the first virtual service, where module loading is allowed)",
                f"modprobe ip_vs_{scheduler} where modules cannot be loaded on demand",
            )
        )
    return checks


def _sysctls(facts: NodeFacts) -> list[Check]:
    get = facts.sysctls.get
    checks = []
    if get("net.ipv4.ip_forward") != 1:
        checks.append(
            Check(
                "ip_forward",
                PROBLEM,
                f"net.ipv4.ip_forward is {get('net.ipv4.ip_forward')}: the node does not route "
                "pod or service traffic",
                "set net.ipv4.ip_forward=1",
            )
        )
    else:
        checks.append(Check("ip_forward", OK, "net.ipv4.ip_forward is 1"))
    keys = ["net.ipv4.conf.all.rp_filter"]
    if facts.uplink is not None:
        keys.append(f"net.ipv4.conf.{facts.uplink}.rp_filter")
    # The kernel applies the larger of `all` and the interface's own; 1 is strict.
    strict = [k for k in keys if get(k) == 1] if max(get(k) or 0 for k in keys) == 1 else []
    if strict:
        checks.append(
            Check(
                "rp_filter",
                NOTE,
                f"{' and '.join(strict)} strict (1): replies that come back another way than "
                "they left (through another node, a second uplink) are dropped",
                "use loose mode (2) where paths are asymmetric",
            )
        )
    if get("net.ipv4.conf.all.route_localnet") == 1:
        checks.append(
            Check(
                "route_localnet",
                NOTE,
                "net.ipv4.conf.all.route_localnet is 1 (kube-proxy sets it for NodePorts on "
                "127.0.0.1); lace-proxy does not serve NodePorts on loopback",
                "set it back to 0 unless something else needs it",
            )
        )
    return checks


def _mtus(facts: NodeFacts, s: NodeSettingsView) -> list[Check]:
    mtus = dict(facts.interfaces)
    if facts.uplink is None or facts.uplink not in mtus:
        return [Check("mtu", NOTE, "no default route: the uplink's MTU is unknown")]
    uplink = mtus[facts.uplink]
    checks = []
    if s.pod_interface_prefix:
        bigger = sorted(
            name
            for name, mtu in facts.interfaces
            if name.startswith(s.pod_interface_prefix) and mtu > uplink
        )
        if bigger:
            checks.append(
                Check(
                    "mtu",
                    PROBLEM,
                    f"pod interfaces {', '.join(bigger)} have a larger MTU than the uplink "
                    f"{facts.uplink} ({uplink}): large packets leaving the node are fragmented "
                    "or dropped",
                    f"set the pod network's MTU to {uplink} or less (the CNI's MTU setting)",
                )
            )
    if s.own_mtu is not None and s.own_mtu != uplink:
        checks.append(
            Check(
                "mtu",
                PROBLEM,
                f"this node's Node object says MTU {s.own_mtu}, its uplink {facts.uplink} has "
                f"{uplink}",
                "fix the interface's MTU, or the CNI's published value",
            )
        )
    others = {name: mtu for name, mtu in s.node_mtus.items() if mtu != uplink}
    if others:
        listed = ", ".join(f"{n} {m}" for n, m in sorted(others.items()))
        checks.append(
            Check(
                "mtu",
                PROBLEM,
                f"other nodes' MTUs differ from this node's uplink ({uplink}): {listed}; "
                "traffic between them is fragmented or dropped",
                "give every node's pod network uplink the same MTU",
            )
        )
    if not checks:
        checks.append(Check("mtu", OK, f"uplink {facts.uplink} MTU {uplink}, consistent"))
    return checks


def _leftovers(facts: NodeFacts) -> list[Check]:
    checks = []
    cleanup = "stop kube-proxy, then run `lace-proxy cleanup --kube-proxy` on this node"
    kube_tables = [f"{f} {n}" for f, n in facts.tables if n == "kube-proxy"]
    if kube_tables:
        checks.append(
            Check(
                "kube_proxy_nftables",
                PROBLEM,
                f"kube-proxy's nftables tables are here ({', '.join(kube_tables)}): their "
                "rules would translate service traffic before lace-proxy's",
                cleanup,
            )
        )
    if facts.kube_chains:
        shown = ", ".join(facts.kube_chains[:5]) + (" …" if len(facts.kube_chains) > 5 else "")
        checks.append(
            Check(
                "kube_proxy_iptables",
                PROBLEM,
                f"kube-proxy's iptables chains are here ({len(facts.kube_chains)}: {shown})",
                cleanup,
            )
        )
    if facts.kube_ipvs0_services is not None:
        checks.append(
            Check(
                "kube_ipvs0",
                PROBLEM,
                f"kube-proxy's kube-ipvs0 interface is here, with {facts.kube_ipvs0_services} "
                "IPVS virtual services on its addresses: it answers for the service addresses",
                cleanup,
            )
        )
    if not checks:
        checks.append(Check("kube_proxy", OK, "no kube-proxy leftovers"))
    return checks


def read_node_facts(nft: Nft, netns: str | None = None) -> NodeFacts:
    """Read what doctor node checks, in `netns` (a thread enters it) or here; changes nothing."""
    if netns is None:
        return _read_facts(nft)
    with ThreadPoolExecutor(1) as worker:
        return worker.submit(_read_facts_in, netns, nft).result()


def _read_facts_in(name: str, nft: Nft) -> NodeFacts:
    enter_netns(name)  # the worker thread dies with the pool
    return _read_facts(nft)


def _read_facts(nft: Nft) -> NodeFacts:
    nft_error, tables, chains = None, [], []
    try:
        for item in nft.ruleset().get("nftables", []):
            if "table" in item:
                tables.append((item["table"]["family"], item["table"]["name"]))
            elif "chain" in item and kube_proxy_chain(str(item["chain"]["name"])):
                c = item["chain"]
                chains.append(f"{c['family']} {c['table']} {c['name']}")
    except (NftError, OSError) as exc:
        nft_error = str(exc)
    ipvs = Path("/proc/thread-self/net/ip_vs").exists()
    with IPRoute() as ipr:
        snapshot = read_snapshot(ipr)
        links = ipr.link_lookup(ifname="kube-ipvs0")
    default = snapshot.lookup("0.0.0.0") or snapshot.lookup("::")
    uplink = default.interface if default and default.network.prefixlen == 0 else None
    keys = [*NODE_SYSCTLS, *([f"net.ipv4.conf.{uplink}.rp_filter"] if uplink else [])]
    sysctls = {key: _sysctl(key) for key in keys}
    kube_ipvs0 = None
    if links:
        on_it = {a.address for a in snapshot.addresses if a.interface == "kube-ipvs0"}
        kube_ipvs0 = sum(vs.address in on_it for vs in virtual_services()) if ipvs else 0
    return NodeFacts(
        nft_error,
        tuple(tables),
        tuple(chains),
        sysctls,
        ipvs,
        _modules(),
        snapshot.mtus,
        uplink,
        kube_ipvs0,
    )


def _sysctl(key: str) -> int | None:
    head, _, rest = key.partition(".conf.")
    if rest:  # an interface's name may hold dots itself (eth0.100)
        name, _, leaf = rest.rpartition(".")
        path = Path("/proc/sys", head.replace(".", "/"), "conf", name, leaf)
    else:
        path = Path("/proc/sys", key.replace(".", "/"))
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _modules() -> frozenset[str]:
    """Loaded modules, and those built into the running kernel."""
    names = set()
    with contextlib.suppress(OSError):
        names |= {line.split()[0] for line in Path("/proc/modules").read_text().splitlines()}
    builtin = Path("/lib/modules", os.uname().release, "modules.builtin")
    with contextlib.suppress(OSError):
        names |= {Path(line).name.removesuffix(".ko") for line in builtin.read_text().splitlines()}
    return frozenset(names)
