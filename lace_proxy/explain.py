"""`lace-proxy explain`: what happens to one new connection, and why, from the table and kernel.

An operator asking "why can't X reach Y?" needs four answers at once: which network the source
is in, what the destination is (a service frontend, a pod, nothing of ours), which network the
service is bound to, and which policy lets the connection through or what is missing. This
module gives them from the same state the proxy programs (the proxier's table, its network view
and graph, the settings the renderer uses), so that the answer is the kernel's answer, not a
second opinion. The decision is the graph's (`NetworkGraph.classify`, `allowed_sources` via
the plans' `Access`, `layout()` for the node's own traffic); this module only names the
policies behind it and orders the kernel's checks as the nftables chains do:

* output (the node's own traffic, `node`): ClusterIPs outside node.serviceCIDRs are not
  proxied at all; a NodePort on the node's own address is dropped; a pod network host-local is
  not peered to is refused unless the address is in the node's own podCIDRs; then the
  host-local network's reach sets decide, then the endpoint checks (reject/drop).
* prerouting (everything else): the source's network (`classify`) and its reach sets, then
  loadBalancerSourceRanges, then the endpoint checks. Pod-to-pod traffic is the CNI's.
* an address of the service CIDRs that no Service holds is dropped, whoever sends to it.

`check_kernel` compares what `explain` expects of the kernel's sets with what
`NftablesBackend.read_back()` reports, using the renderer's own element text.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from lace_proxy.dataplane.nftables import NftablesSettings
from lace_proxy.dataplane.nftables.kernel import KernelState
from lace_proxy.dataplane.nftables.render import (
    Rendered,
    Renderer,
    allows_all,
    clusterip_ranges,
    element_key,
    name_hash,
)
from lace_proxy.model import (
    POD_NETWORK_TYPES,
    LaceObject,
    NetworkBindingPolicy,
    NetworkRoutingPolicy,
    ServiceRoutingPolicy,
)
from lace_proxy.networks.graph import Condition, NetworkGraph, NetworkLayout
from lace_proxy.networks.view import Binding
from lace_proxy.prefixes import covered
from lace_proxy.table import CLUSTER_IP, LOAD_BALANCER, NODE_PORT, Access
from lace_proxy.table.changeset import backend_state

if TYPE_CHECKING:
    from lace_proxy.proxier import Proxier
    from lace_proxy.table import Backend, Frontend, Plan, ServiceTable

NODE = "node"
PROTOCOLS = ("TCP", "UDP", "SCTP")

#: Verdicts, and whether the connection goes through (exit code 0) or not (1).
ALLOWED = "allowed"  # lace-proxy forwards it to a backend
PASSES = "passes"  # not lace-proxy's to decide: it lets it through untouched
DENIED = "denied"  # the network model refuses it (ICMP admin-prohibited)
DROPPED = "dropped"  # silently dropped (a timeout for the client)
REJECTED = "rejected"  # refused for want of endpoints / service port (port-unreachable)
UNPROXIED = "unproxied"  # the node's connection to a ClusterIP outside node.serviceCIDRs
GOES_THROUGH = (ALLOWED, PASSES)

#: Plan attributes `Renderer.render_access` reads (both table twins have them).
_ACCESS_FIELDS = ("family", "protocol", "port", "node_port", "cluster_ip", "external_ips", "lb_ips")

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class QueryError(ValueError):
    """Unusable SRC or DST on the command line (exit code 2)."""


# -- input --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Query:
    """One new connection: SRC (an address, or NODE for the node's own traffic) to DST."""

    source: str
    destination: str
    port: int
    protocol: str = "TCP"

    @property
    def from_node(self) -> bool:
        return self.source == NODE

    @property
    def family(self) -> int:
        return ipaddress.ip_address(self.destination).version

    def __str__(self) -> str:
        dst = f"[{self.destination}]" if self.family == 6 else self.destination
        return f"{self.source} -> {dst}:{self.port}/{self.protocol}"


def _address(text: str, what: str) -> str:
    """A canonical IP address (brackets allowed around IPv6), else QueryError."""
    raw = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        return str(ipaddress.ip_address(raw))
    except ValueError:
        raise QueryError(f"{what} {text!r} is not an IP address") from None


def parse_query(source: str, destination: str) -> Query:
    """SRC (an IP or `node`) and DST (`IP:PORT[/PROTO]`, IPv6 as `[IP]:PORT`), validated."""
    src = NODE if source.lower() == NODE else _address(source, "SRC")
    rest, slash, proto = destination.partition("/")
    protocol = proto.upper() if slash else "TCP"
    if protocol not in PROTOCOLS:
        raise QueryError(f"DST {destination!r}: protocol {proto!r} is not TCP, UDP or SCTP")
    if rest.startswith("["):
        host, sep, port_text = rest[1:].partition("]:")
        if not sep:
            raise QueryError(f"DST {destination!r}: write an IPv6 destination as [IP]:PORT")
    else:
        host, sep, port_text = rest.rpartition(":")
        if not sep:
            raise QueryError(f"DST {destination!r} has no port: write IP:PORT[/PROTO]")
        if ":" in host:
            raise QueryError(f"DST {destination!r}: write an IPv6 destination as [IP]:PORT")
    dst = _address(host, "DST address")
    if not (port_text.isascii() and port_text.isdigit()) or not 1 <= int(port_text) <= 65535:
        raise QueryError(f"DST {destination!r}: port {port_text!r} is not in 1-65535")
    if src != NODE and ipaddress.ip_address(src).version != ipaddress.ip_address(dst).version:
        raise QueryError(f"SRC {source} and DST {dst} are of different IP families")
    return Query(src, dst, int(port_text), protocol)


@dataclass(frozen=True)
class NodeFacts:
    """What explain needs to know of a node: where its NodePorts answer.

    Its podCIDRs reach explain through the proxier (they are part of the kernel's layout).
    """

    name: str
    addresses: tuple[str, ...] = ()  # every address of the node (NodePorts answer there)
    internal_ips: tuple[str, ...] = ()  # InternalIPs: nodePortAddresses "primary", routes


@dataclass(frozen=True)
class State:
    """Everything `explain` reads: the proxier's computed state and what the kernel is given.

    `proxier` is a Proxier whose table has been built and committed (`plans()` are what the
    dataplane would program). `rejections` are the objects validation refused while loading.
    """

    proxier: Proxier
    settings: NftablesSettings
    node: NodeFacts
    other_nodes: tuple[NodeFacts, ...] = ()
    rejections: tuple[str, ...] = ()


# -- output -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BackendInfo:
    """An endpoint that may answer, with the conditions it was chosen under."""

    ip: str
    port: int
    ready: bool
    serving: bool
    terminating: bool
    local: bool

    def __str__(self) -> str:
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        state = "ready" if self.ready else ("terminating" if self.terminating else "not-ready")
        serving = ",serving" if self.serving else ""
        return f"{host}:{self.port} ({state}{serving},{'local' if self.local else 'remote'})"


@dataclass(frozen=True)
class Expect:
    """One thing the kernel must hold (or must not) for the verdict to be what it is.

    `containers`: the set or map names, any of which may hold it; `element` is the renderer's
    text (a map element is matched by its key). With `covers`, an interval set must (not) hold
    a prefix covering the address `element`. `programmed` marks the frontend's own dispatch:
    missing, the connection is "not programmed" rather than "differs".
    """

    containers: tuple[str, ...]
    element: str
    present: bool
    what: str
    covers: bool = False
    programmed: bool = False


@dataclass(frozen=True)
class KernelCheck:
    """Whether the kernel agrees with the table's verdict."""

    status: str  # "agrees" | "differs" | "not programmed" | "not checked"
    detail: str = ""

    def __str__(self) -> str:
        text = {
            "agrees": "kernel agrees",
            "differs": "kernel differs",
            "not programmed": "not programmed",
            "not checked": "not checked",
        }[self.status]
        return f"{text}: {self.detail}" if self.detail else text


@dataclass(frozen=True)
class Explanation:
    """The answer, in parts an operator reads top to bottom (and `to_dict` for scripts)."""

    query: Query
    networks_enabled: bool
    source_network: str | None
    source_reason: str
    destination_kind: str  # a frontend kind, "pod", "node", "ClusterIP (other port)", "none"
    destination: str
    service: str | None = None
    service_port_name: str | None = None
    destination_network: str | None = None  # the pod network of a pod address
    bound_network: str | None = None
    bound_by: str | None = None
    binding_reason: str | None = None
    verdict: str = PASSES
    reason: str = ""
    allowed_by: tuple[tuple[str, str], ...] = ()  # (kind, name); ("own network", network)
    backends: tuple[BackendInfo, ...] = ()
    no_backends: str | None = None
    excluded: tuple[tuple[str, str], ...] = ()
    conditions: tuple[Condition, ...] = ()
    rejections: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    expects: tuple[Expect, ...] = ()
    kernel: KernelCheck = field(default_factory=lambda: KernelCheck("not checked"))

    @property
    def goes_through(self) -> bool:
        return self.verdict in GOES_THROUGH

    @property
    def exit_code(self) -> int:
        """0: it goes through; 1: refused, dropped, unanswered or not proxied."""
        return 0 if self.goes_through else 1

    def to_dict(self) -> dict[str, Any]:
        """A stable JSON document (keys never depend on the case)."""
        q = self.query
        return {
            "query": {
                "source": q.source,
                "destination": q.destination,
                "port": q.port,
                "protocol": q.protocol,
            },
            "networkModel": self.networks_enabled,
            "source": {"network": self.source_network, "reason": self.source_reason},
            "destination": {
                "kind": self.destination_kind,
                "description": self.destination,
                "service": self.service,
                "portName": self.service_port_name,
                "network": self.destination_network,
            },
            "binding": {
                "network": self.bound_network,
                "boundBy": self.bound_by,
                "reason": self.binding_reason,
            },
            "verdict": self.verdict,
            "allowed": self.goes_through,
            "reason": self.reason,
            "allowedBy": [{"kind": k, "name": n} for k, n in self.allowed_by],
            "backends": [backend_state(b) for b in self.backends],
            "noBackends": self.no_backends,
            "excluded": [{"address": a, "reason": r} for a, r in self.excluded],
            "conditions": [
                {"code": c.code, "subject": c.subject, "message": c.message}
                for c in self.conditions
            ],
            "rejected": list(self.rejections),
            "notes": list(self.notes),
            "kernel": {"status": self.kernel.status, "detail": self.kernel.detail},
            "exitCode": self.exit_code,
        }

    def to_text(self) -> str:
        """Aligned `label  value` lines; lists continue under an empty label."""
        rows: list[tuple[str, str]] = [
            ("connection", str(self.query)),
            ("source", self.source_reason),
            ("destination", self.destination),
        ]
        if self.binding_reason is not None:
            rows.append(("bound to", self.binding_reason))
        rows.append(("verdict", self.verdict))
        rows.append(("why", self.reason))
        if self.service is not None or self.backends:
            rows += _many("backends", [str(b) for b in self.backends] or [self.no_backends or "-"])
        rows += _many("excluded", [f"{a}: {r}" for a, r in self.excluded])
        rows += _many("condition", [f"{c.subject} {c.code}: {c.message}" for c in self.conditions])
        rows += _many("rejected", list(self.rejections))
        rows += _many("note", list(self.notes))
        rows.append(("kernel", str(self.kernel)))
        width = max(len(label) for label, _ in rows)
        return "\n".join(f"{label.ljust(width)}  {value}".rstrip() for label, value in rows)


def _many(label: str, values: Sequence[str]) -> list[tuple[str, str]]:
    return [(label if i == 0 else "", v) for i, v in enumerate(values)]


# -- the decision -------------------------------------------------------------------------------


def _net(cidr: str) -> IPNetwork:
    return ipaddress.ip_network(cidr, strict=False)


def _describe_source(graph: NetworkGraph, q: Query) -> tuple[str | None, str]:
    """The source's network (the graph's classification) and why, in words."""
    if not graph.enabled:
        return None, "any: no Network objects (plain kube-proxy)"
    if q.from_node:
        network = graph.classify("", local=True)
        if network is None:
            return None, "no identity: the node's own traffic, and no hostLocal Network exists"
        return network, f"{network}: the node's own traffic (its hostLocal network)"
    network = graph.classify(q.source)
    if network is None:
        return None, "no identity: the source lies in no network"
    ip = ipaddress.ip_address(q.source)
    prefixes = [_net(p) for p in graph.networks[network].prefixes]
    best = max(
        (p for p in prefixes if p.version == ip.version and ip in p), key=lambda p: p.prefixlen
    )
    if graph.networks[network].type in POD_NETWORK_TYPES:
        return network, f"{network}: a pod network, by prefix {best}"
    return network, f"{network}: an external network, by longest-prefix match over {best}"


def _labels(graph: NetworkGraph, network: str) -> dict[str, str]:
    return dict(graph.networks[network].labels)


def _policies(lace: Mapping[tuple[str, str], LaceObject], kind: type) -> list[Any]:
    return [obj for (_, name), obj in sorted(lace.items()) if isinstance(obj, kind)]


def _peerings(state: State, src: str, dest: str) -> list[str]:
    """The NetworkRoutingPolicies that peer `src` to `dest` (naming what the graph decided)."""
    graph: NetworkGraph = state.proxier.networks.graph
    if src not in graph.networks or dest not in graph.networks:
        return []
    s, d = _labels(graph, src), _labels(graph, dest)
    return [
        p.name
        for p in _policies(state.proxier.lace, NetworkRoutingPolicy)
        if p.src_selector.matches(s) and p.dest_selector.matches(d)
    ]


def _grants(
    state: State, src: str, dest: str, service_labels: Mapping[str, str]
) -> tuple[list[str], list[str]]:
    """ServiceRoutingPolicies granting `src` the services of `dest`: (picking this service,
    whose serviceSelector misses it)."""
    graph: NetworkGraph = state.proxier.networks.graph
    if src not in graph.networks or dest not in graph.networks:
        return [], []
    s, d = _labels(graph, src), _labels(graph, dest)
    picks: list[str] = []
    misses: list[str] = []
    for p in _policies(state.proxier.lace, ServiceRoutingPolicy):
        if p.src_selector.matches(s) and p.dest_selector.matches(d):
            sel = p.service_selector
            (picks if sel.everything or sel.matches(service_labels) else misses).append(p.name)
    return picks, misses


def _find_frontend(state: State, q: Query) -> tuple[Plan, Frontend, str | None] | None:
    """(plan, frontend, node name for another node's NodePort) that DST:PORT/PROTO hits."""
    table = state.proxier.table
    own = _node_port_addresses(state)
    others = {a: n.name for n in state.other_nodes for a in n.addresses}
    for plan in sorted(table.plans(), key=lambda p: p.id):
        if plan.family != q.family or plan.protocol != q.protocol:
            continue
        for f in plan.frontends():
            if f.kind == NODE_PORT:
                if f.port != q.port:
                    continue
                if q.destination in own:
                    return plan, f, None
                if q.destination in others:
                    return plan, f, others[q.destination]
            elif f.address == q.destination and f.port == q.port:
                return plan, f, None
    return None


def _node_port_addresses(state: State) -> set[str]:
    """The node's addresses that answer NodePorts (as `Skeleton.nodeport_match`)."""
    s = state.settings
    addresses = state.node.internal_ips if s.node_port_primary else state.node.addresses
    return {
        a
        for a in addresses
        if not ipaddress.ip_address(a).is_loopback
        and (not s.node_port_cidrs or covered(a, s.node_port_cidrs))
    }


def _layout(state: State) -> NetworkLayout:
    """The layout the kernel is given (with this node's podCIDRs): what output checks."""
    return state.proxier._layout()


def _unallocated(state: State, address: str) -> str | None:
    """The service CIDR holding `address`, named with where it comes from, if any (the
    `clusterip-ranges` sets: ServiceCIDR objects, else lace.serviceCIDRs)."""
    layout = _layout(state)
    cidr = next(
        (c for c in clusterip_ranges(layout, state.settings) if covered(address, [c])), None
    )
    if cidr is None:
        return None
    if not layout.service_cidrs:
        return f"{cidr} (lace.serviceCIDRs; the cluster has no ServiceCIDR objects)"
    owners = sorted(
        name for name, obj in state.proxier.service_cidrs.items() if covered(address, obj.cidrs)
    )
    return f"{cidr} (ServiceCIDR {', '.join(owners)})"


def _host_unpeered(state: State, layout: NetworkLayout, address: str) -> tuple[str | None, bool]:
    """(the pod network host-local is not peered to that `address` classifies into, whether it
    is in the node's own podCIDRs): the `host-unpeered` and `local-pod-cidrs` sets of output."""
    network = state.proxier.networks.graph.classify(address)
    pod_networks = {n for _, n in layout.pod_prefixes}
    if network in pod_networks and network not in layout.host_peers:
        return network, covered(address, layout.local_pod_cidrs)
    return None, False


def explain(state: State, q: Query) -> Explanation:
    """What happens to a new connection `q`, from the table, the network view and the graph."""
    view = state.proxier.networks
    graph: NetworkGraph = view.graph
    network, source_reason = _describe_source(graph, q)
    notes: list[str] = []
    if not q.from_node and q.source in state.node.addresses:
        notes.append(
            f"{q.source} is this node's own address: what the node itself originates is "
            "host-local (explain it with SRC `node`)"
        )
    if not state.node.addresses:
        notes.append(
            f"this node's addresses are unknown (no Node {state.node.name} in the manifests; "
            "give --node-address): NodePorts cannot be recognised"
        )
    base = Explanation(
        query=q,
        networks_enabled=graph.enabled,
        source_network=network,
        source_reason=source_reason,
        destination_kind="none",
        destination="",
        rejections=state.rejections,
        notes=tuple(notes),
    )
    found = _find_frontend(state, q)
    if found is not None:
        return _explain_frontend(state, base, *found)
    return _explain_address(state, base)


def _explain_frontend(
    state: State, e: Explanation, plan: Plan, f: Frontend, elsewhere: str | None
) -> Explanation:
    """DST is a frontend of a service port: the network model, then the endpoint checks."""
    q = e.query
    view = state.proxier.networks
    graph: NetworkGraph = view.graph
    table = state.proxier.table
    svc = table.service(plan.service)
    labels = dict(svc.labels) if svc is not None else {}
    port = plan.port_name or str(plan.port)
    where = f" on {elsewhere}" if elsewhere else ""
    e = _replace(
        e,
        destination_kind=f.kind,
        destination=f"{f.kind}{where} of service {plan.service} port {port} "
        f"({plan.port}/{plan.protocol})",
        service=plan.service,
        service_port_name=plan.port_name,
    )
    binding: Binding | None = view.bindings.get(plan.service) if graph.enabled else None
    if binding is not None:
        if binding.network is None:
            why = (
                "its endpoints lie in no network"
                if binding.excluded
                else "it has no endpoints to take a network from"
            )
            text = f"none: {why}, so it carries nothing"
        elif binding.bound_by:
            text = f"{binding.network}: bound by NetworkBindingPolicy {binding.bound_by}"
        else:
            text = f"{binding.network}: its endpoints' pod network"
        e = _replace(
            e,
            bound_network=binding.network,
            bound_by=binding.bound_by,
            binding_reason=text,
            excluded=binding.excluded,
        )
    e = _replace(e, conditions=_conditions(state, e, binding, labels))
    if elsewhere is not None:
        return _explain_remote_node_port(state, e, plan, f, elsewhere, labels)

    access: Access | None = plan.access
    expects = list(_dispatch_expects(plan, f, q))
    source = e.source_network
    backends = f.backends
    v = f"v{plan.family}"

    # The node's own traffic: the output chains (unproxied, host-access) in their order.
    if q.from_node and graph.enabled:
        if f.kind == CLUSTER_IP and not covered(q.destination, state.settings.service_cidrs):
            expects = [
                Expect(
                    (f"cluster-ips-{v}",), q.destination, True, "the ClusterIPs", programmed=True
                ),
                Expect((f"service-cidrs-{v}",), q.destination, False, "node.serviceCIDRs", True),
            ]
            return _done(e, UNPROXIED, _unproxied(state, q), expects, backends=())
        if access is not None and f.kind == NODE_PORT:
            controlled, element, _ = _access_elements(plan, f, None)
            expects.append(Expect((controlled,), element, True, "controlled by the model"))
            reason = "a NodePort on the node's own address is never answered from the node"
            return _done(e, DROPPED, reason, expects, backends=())
        unpeered, local = _host_unpeered(state, _layout(state), q.destination)
        if unpeered is not None and not local:
            expects.append(_unpeered_expect(q, True))
            reason = f"the node may not enter pod network {unpeered}: " + _peering_hint(
                graph, unpeered
            )
            return _done(e, DENIED, reason, expects, backends=())

    allowed_by: list[tuple[str, str]] = []
    if access is not None:
        controlled, element, reach = _access_elements(plan, f, source)
        expects.append(Expect((controlled,), element, True, "controlled by the model"))
        allowed = source is not None and source in access.sources
        if reach is not None:
            label = f"{source}'s reach set"
            expects.append(Expect((reach,), element, allowed, label))
        if not allowed:
            reason = _denial(state, e, access, labels)
            return _done(e, DENIED, reason, expects, backends=())
        allowed_by = _allowed_by(state, source, access.network, labels)  # type: ignore[arg-type]
    else:  # plain kube-proxy: the kernel must not restrict it either
        controlled, element, _ = _access_elements(plan, f, None)
        expects.append(Expect((controlled,), element, False, "controlled by the model"))

    ranges = plan.lb_source_ranges
    if f.kind == LOAD_BALANCER and ranges and not allows_all(ranges):
        listed = ", ".join(ranges)
        if not q.from_node and not covered(q.source, ranges):
            reason = f"{q.source} is not in loadBalancerSourceRanges ({listed})"
            return _done(e, DROPPED, reason, expects, backends=(), allowed_by=allowed_by)
        # The node's connection leaves from its address, or (a VIP-style load balancer put
        # the IP on the node) from the IP itself, which the ranges let in with the node.
        if q.from_node and not any(covered(a, ranges) for a in state.node.internal_ips):
            reason = (
                f"loadBalancerSourceRanges ({listed}) cover no InternalIP of this node: its "
                "own connection is dropped"
            )
            return _done(e, DROPPED, reason, expects, backends=(), allowed_by=allowed_by)

    # Which endpoints: externalTrafficPolicy Local short-circuits pods (clusterCIDR) and the
    # node itself to every endpoint.
    verdict, backends = f.verdict, f.backends
    if f.kind != CLUSTER_IP and plan.external_local:
        inside = q.from_node or covered(q.source, state.settings.cluster_cidrs)
        if inside and plan.cluster_backends:
            verdict, backends = None, plan.cluster_backends
    if verdict is None and backends:
        reason = _allowed_reason(e, allowed_by)
        return _done(e, ALLOWED, reason, expects, backends=backends, allowed_by=allowed_by)
    if verdict == "drop":
        policy = "internal" if f.kind == CLUSTER_IP else "external"
        reason = f"{policy}TrafficPolicy Local and no endpoint on this node: dropped"
        return _done(e, DROPPED, reason, expects, backends=(), allowed_by=allowed_by)
    why = _no_backends(table, plan, e, f)
    return _done(
        e, REJECTED, f"no endpoints: {why}", expects, backends=(), allowed_by=allowed_by, none=why
    )


def _explain_remote_node_port(
    state: State, e: Explanation, plan: Plan, f: Frontend, node: str, labels: Mapping[str, str]
) -> Explanation:
    """Another node's NodePort: decided there, where the node's traffic has its address."""
    q = e.query
    graph: NetworkGraph = state.proxier.networks.graph
    note = f"decided by {node}'s kernel; this node's kernel has no say"
    access: Access | None = plan.access
    if q.from_node and graph.enabled:
        own = [a for a in state.node.internal_ips if ipaddress.ip_address(a).version == q.family]
        if not own:
            reason = (
                f"{node} sees this node's address, which is unknown (no InternalIP of the "
                "family in its Node object)"
            )
            return _done(e, DENIED, reason, [], backends=(), kernel_note=note)
        address = own[0]
        network, why = _describe_source(graph, Query(address, q.destination, q.port, q.protocol))
        label, _, why = why.partition(": ")
        e = _replace(
            e,
            source_network=network,
            source_reason=f"{label}: {node} sees this node's address {address}; {why}",
        )
    if access is not None and (e.source_network not in access.sources):
        reason = _denial(state, e, access, labels)
        return _done(e, DENIED, reason, [], backends=(), kernel_note=note)
    allowed_by = (
        _allowed_by(state, e.source_network, access.network, labels)  # type: ignore[arg-type]
        if access is not None
        else []
    )
    if f.verdict is None and f.backends:
        reason = _allowed_reason(e, allowed_by)
        if plan.external_local:
            reason += f" (externalTrafficPolicy Local: {node}'s own endpoints answer)"
        return _done(
            e, ALLOWED, reason, [], backends=f.backends, allowed_by=allowed_by, kernel_note=note
        )
    why = _no_backends(state.proxier.table, plan, e, f)
    return _done(e, REJECTED, f"no endpoints: {why}", [], backends=(), none=why, kernel_note=note)


def _explain_address(state: State, e: Explanation) -> Explanation:
    """DST is not a frontend: a pod, the node, a ClusterIP's other port, or nothing of ours."""
    q = e.query
    graph: NetworkGraph = state.proxier.networks.graph
    table = state.proxier.table
    v = f"v{q.family}"
    cluster_ip_of = [
        p for p in table.plans() if p.family == q.family and p.cluster_ip == q.destination
    ]
    if cluster_ip_of:
        ports = ", ".join(sorted({f"{p.port}/{p.protocol}" for p in cluster_ip_of}))
        e = _replace(
            e,
            destination_kind="ClusterIP (other port)",
            destination=f"ClusterIP of service {cluster_ip_of[0].service}, not on "
            f"{q.port}/{q.protocol} (its ports: {ports})",
            service=cluster_ip_of[0].service,
        )
        if (
            q.from_node
            and graph.enabled
            and not covered(q.destination, state.settings.service_cidrs)
        ):
            return _done(e, UNPROXIED, _unproxied(state, q), [], backends=())
        expects = [
            Expect((f"cluster-ips-{v}",), q.destination, True, "the ClusterIPs", programmed=True)
        ]
        reason = "a ClusterIP answers only on its service ports: anything else is refused"
        return _done(e, REJECTED, reason, expects, backends=())
    unallocated = _unallocated(state, q.destination)
    if unallocated is not None:
        e = _replace(
            e,
            destination_kind="unallocated ClusterIP",
            destination=f"an address of service CIDR {unallocated} that no Service holds",
        )
        expects = [
            Expect(
                (f"clusterip-ranges-{v}",), q.destination, True, "the service CIDRs", covers=True
            )
        ]
        reason = (
            "no Service holds this address of the service CIDRs: new connections to it are "
            "dropped (neither forwarded nor sent out of the node's uplink)"
        )
        return _done(e, DROPPED, reason, expects, backends=())

    pod_network = graph.classify(q.destination) if graph.enabled else None
    if pod_network is not None and graph.networks[pod_network].type not in POD_NETWORK_TYPES:
        pod_network = None
    if q.destination in state.node.addresses:
        e = _replace(
            e,
            destination_kind="node",
            destination=f"this node's address, not a "
            f"NodePort of any service on {q.port}/{q.protocol}",
        )
    elif pod_network is not None:
        e = _replace(
            e,
            destination_kind="pod",
            destination=f"a pod address in network {pod_network}",
            destination_network=pod_network,
        )
    elif q.destination in {a for n in state.other_nodes for a in n.addresses}:
        node = next(n.name for n in state.other_nodes if q.destination in n.addresses)
        e = _replace(
            e,
            destination_kind="node",
            destination=f"{node}'s address, not a NodePort of any service on {q.port}/{q.protocol}",
        )
    else:
        e = _replace(e, destination="no service frontend and no pod address: not lace-proxy's")
    e = _replace(e, conditions=_conditions(state, e, None, {}))

    if q.from_node and graph.enabled:
        layout = _layout(state)
        unpeered, local = _host_unpeered(state, layout, q.destination)
        if unpeered is not None:
            expects = [_unpeered_expect(q, True)]
            if local:
                expects.append(
                    Expect(
                        (f"local-pod-cidrs-{v}",), q.destination, True, "the node's podCIDRs", True
                    )
                )
                reason = "the node reaches its own podCIDRs always (kubelet probes)"
                return _done(e, ALLOWED, reason, expects, backends=())
            if layout.local_pod_cidrs:
                expects.append(
                    Expect(
                        (f"local-pod-cidrs-{v}",), q.destination, False, "the node's podCIDRs", True
                    )
                )
            reason = _peering_hint(graph, unpeered)
            prefix = state.settings.pod_interface_prefix
            if prefix:
                note = (
                    f"unless the node routes {q.destination} out of a pod interface "
                    f"({prefix}*): then it is one of its own pods, always reachable"
                )
                e = _replace(e, notes=(*e.notes, note))
            return _done(e, DENIED, reason, expects, backends=())
        if pod_network is not None:
            names = _peerings(state, layout.host_local or "", pod_network)
            expects = [_unpeered_expect(q, False)]
            reason = f"allowed: NetworkRoutingPolicy {', '.join(names)} " + (
                f"(peers {layout.host_local} to {pod_network})"
            )
            allowed_by = [("NetworkRoutingPolicy", n) for n in names]
            return _done(e, ALLOWED, reason, expects, backends=(), allowed_by=allowed_by)

    if pod_network is not None and e.source_network is not None and not q.from_node:
        src = e.source_network
        if src == pod_network:
            model = f"the network model allows it (own network {src})"
        elif pod_network in graph.peers(src):
            model = (
                "the network model allows it (NetworkRoutingPolicy "
                + ", ".join(_peerings(state, src, pod_network))
                + ")"
            )
        else:
            model = (
                f"the network model isolates it (it needs a NetworkRoutingPolicy from {src} "
                f"to {pod_network})"
            )
        reason = f"lace-proxy lets pod traffic pass: {model}, which the CNI enforces"
        return _done(e, PASSES, reason, [], backends=())
    return _done(e, PASSES, "lace-proxy does not handle it: it passes untouched", [], backends=())


# -- wording and expectations -------------------------------------------------------------------


def _replace(e: Explanation, **changes: Any) -> Explanation:
    return replace(e, **changes)


def _done(
    e: Explanation,
    verdict: str,
    reason: str,
    expects: Sequence[Expect],
    *,
    backends: Iterable[Backend],
    allowed_by: Sequence[tuple[str, str]] = (),
    none: str | None = None,
    kernel_note: str | None = None,
) -> Explanation:
    infos = tuple(
        BackendInfo(b.ip, b.port, b.ready, b.serving, b.terminating, b.local)
        for b in sorted(backends, key=lambda b: (b.ip, b.port))
    )
    if e.service is not None and not infos and none is None:
        none = f"none: the connection is {verdict} before it reaches an endpoint"
    # A policy that selects nothing may be the grant someone meant: shown when refused.
    conditions = tuple(c for c in e.conditions if verdict == DENIED or c.code != "selects_nothing")
    return _replace(
        e,
        conditions=conditions,
        verdict=verdict,
        reason=reason,
        expects=tuple(expects),
        backends=infos,
        no_backends=none,
        allowed_by=tuple(allowed_by),
        kernel=KernelCheck("not checked", kernel_note or ""),
    )


def _allowed_by(
    state: State, source: str, network: str | None, labels: Mapping[str, str]
) -> list[tuple[str, str]]:
    """Why `source` is among the service's allowed sources: its own network, and each policy."""
    if network is None:
        return []
    out: list[tuple[str, str]] = []
    if source == network:
        out.append(("own network", network))
    out += [("NetworkRoutingPolicy", n) for n in _peerings(state, source, network)]
    out += [("ServiceRoutingPolicy", n) for n in _grants(state, source, network, labels)[0]]
    return out


def _allowed_reason(e: Explanation, allowed_by: Sequence[tuple[str, str]]) -> str:
    if not e.networks_enabled:
        return "no Network objects: every source reaches every frontend"
    if not allowed_by:
        return "allowed (the plan lets the source in, though no policy names it)"
    parts = []
    for kind, name in allowed_by:
        if kind == "own network":
            parts.append(f"own network ({name})")
        elif kind == "NetworkRoutingPolicy":
            parts.append(
                f"NetworkRoutingPolicy {name} (peers {e.source_network} to {e.bound_network})"
            )
        else:
            parts.append(
                f"ServiceRoutingPolicy {name} (grants {e.source_network} the services of "
                f"{e.bound_network})"
            )
    return "allowed: " + "; ".join(parts)


def _denial(state: State, e: Explanation, access: Access, labels: Mapping[str, str]) -> str:
    """What is missing, phrased as what the operator can do about it."""
    src, bound, svc = e.source_network, access.network, e.service
    if src is None:
        if e.query.from_node:
            target = f" and peer it to {bound}" if bound else ""
            return (
                "no identity: no hostLocal Network is declared, so the node's own traffic "
                f"reaches no frontend (declare one{target})"
            )
        return "no identity: the source lies in no network"
    if bound is None:
        return (
            f"{svc} is bound to no network, so no network may reach it: bind it with a "
            "NetworkBindingPolicy to a network covering its endpoints (node addresses: internet)"
        )
    text = (
        f"needs a NetworkRoutingPolicy from {src} to {bound} (or a ServiceRoutingPolicy "
        f"granting {src} the services of {bound})"
    )
    misses = _grants(state, src, bound, labels)[1]
    for name in misses:
        text += (
            f"; ServiceRoutingPolicy {name} grants {src} the services of {bound}, but its "
            f"serviceSelector does not pick {svc}"
        )
    return text


def _unproxied(state: State, q: Query) -> str:
    """Why the node's connection to a ClusterIP outside node.serviceCIDRs is not served."""
    fate = (
        "leaves by its own routes"
        if state.settings.translate
        else "is refused as unroutable (IPVS would take it: the address is local)"
    )
    return (
        f"needs node.serviceCIDRs (lace.serviceCIDRs) to cover {q.destination}: "
        f"without it the node's connection {fate}"
    )


def _peering_hint(graph: NetworkGraph, network: str) -> str:
    if graph.host_local is None:
        return (
            f"needs a hostLocal Network and a NetworkRoutingPolicy from it to {network} "
            "(the node's own pods stay reachable)"
        )
    return f"needs a NetworkRoutingPolicy from {graph.host_local} to {network}"


def _no_backends(table: ServiceTable, plan: Plan, e: Explanation, f: Frontend) -> str:
    """Why a frontend has no endpoint to send to."""
    if e.excluded:
        return "every endpoint is excluded by the network model (see excluded)"
    endpoints = [ep for sl in table.slices_of(plan.service) for ep in sl.endpoints]
    if not endpoints:
        return "the service has no endpoints"
    if f.kind == CLUSTER_IP and plan.internal_local:
        return "internalTrafficPolicy Local and no endpoint on this node"
    return f"{len(endpoints)} endpoints, none ready or serving+terminating"


def _conditions(
    state: State, e: Explanation, binding: Binding | None, labels: Mapping[str, str]
) -> tuple[Condition, ...]:
    """The network-model conditions that bear on this connection.

    The service's own (e.g. two bindings); conditions on the networks involved (source,
    bound network, destination pod network); binding policies with a rule for this
    service (e.g. to a network that does not exist); and policies that select nothing,
    which may be the grant someone meant to write.
    """
    graph: NetworkGraph = state.proxier.networks.graph
    if not graph.enabled:
        return ()
    involved = {n for n in (e.source_network, e.bound_network, e.destination_network) if n}
    binding_policies: set[str] = set()
    if e.service is not None:
        namespace, _, name = e.service.partition("/")
        for p in _policies(state.proxier.lace, NetworkBindingPolicy):
            if "service" in p.match_kinds and any(
                r.selector.matches(namespace, name, labels) for r in p.rules
            ):
                binding_policies.add(p.name)
    out = list(binding.conditions) if binding is not None else []
    for c in graph.conditions:
        kind, _, name = c.subject.partition("/")
        if (
            (
                kind == "Network"
                and (name in involved or any(f"Network {n}:" in c.message for n in involved))
            )
            or (kind == "NetworkBindingPolicy" and name in binding_policies)
            or c.code == "selects_nothing"
        ):
            out.append(c)
    return tuple(sorted(set(out)))


def _access_elements(plan: Plan, f: Frontend, network: str | None) -> tuple[str, str, str | None]:
    """(controlled set, the frontend's element, `network`'s reach set) as the renderer writes
    them: `Renderer.render_access` on the plan, as if `network` were its only source."""
    view = SimpleNamespace(
        **{name: getattr(plan, name) for name in _ACCESS_FIELDS},
        access=Access(None, (network,) if network else ()),
    )
    out = Rendered()
    Renderer.render_access(view, out)
    v = f"v{plan.family}"
    if f.kind == NODE_PORT:
        controlled = f"controlled-nodeports-{v}"
        (element,) = out.elements[controlled]
        reach = f"reach-nodeports-{name_hash(network)}-{v}" if network else None
    else:
        controlled = f"controlled-{v}"
        element = next(x for x in out.elements[controlled] if x.split(" . ")[0] == f.address)
        reach = f"reach-{name_hash(network)}-{v}" if network else None
    if reach is not None and element not in out.elements.get(reach, ()):
        raise AssertionError(f"explain and the renderer disagree on {reach}")  # a bug here
    return controlled, element, reach


def _dispatch_expects(plan: Plan, f: Frontend, q: Query) -> list[Expect]:
    """The frontend's dispatch element: in the kernel at all, whatever its verdict."""
    _, element, _ = _access_elements(plan, f, None)
    v = f"v{plan.family}"
    maps: tuple[str, ...]
    if f.kind == NODE_PORT:
        maps = (f"service-nodeports-{v}", f"no-endpoint-nodeports-{v}")
    else:
        maps = (f"service-ips-{v}", f"no-endpoint-services-{v}", f"no-local-endpoint-services-{v}")
    return [Expect(maps, element, True, "the service's dispatch", programmed=True)]


def _unpeered_expect(q: Query, present: bool) -> Expect:
    v = f"v{q.family}"
    what = "the pod networks host-local is not peered to"
    return Expect((f"host-unpeered-{v}",), q.destination, present, what, covers=True)


# -- the kernel ---------------------------------------------------------------------------------


def _holds(elements: set[str], expect: Expect) -> bool:
    if not expect.covers:
        return any(element_key(x) == expect.element for x in elements)
    ip = ipaddress.ip_address(expect.element)
    for x in elements:
        first, _, last = element_key(x).partition("-")  # a prefix, or a range "first-last"
        try:
            if last:
                low, high = ipaddress.ip_address(first), ipaddress.ip_address(last)
                if low.version == ip.version and low <= ip <= high:  # type: ignore[operator]
                    return True
            elif ip in _net(first):
                return True
        except (ValueError, TypeError):
            continue
    return False


def check_kernel(e: Explanation, kernel: KernelState | None, table: str) -> Explanation:
    """The explanation with the kernel's opinion: do its sets say what the table says?"""
    if e.kernel.detail and not e.expects:
        return e  # decided elsewhere (another node's kernel)
    if kernel is None:
        return _replace(e, kernel=KernelCheck("not programmed", f"no table inet {table}"))
    if not e.expects:
        return _replace(
            e, kernel=KernelCheck("agrees", "nothing of lace-proxy's applies to this connection")
        )
    missing, wrong, right = [], [], []
    for x in e.expects:
        holders = [c for c in x.containers if c in kernel.elements]
        holding = [c for c in holders if _holds(kernel.elements[c], x)]
        held = bool(holding)
        where = "/".join(x.containers)
        if held == x.present:
            named = holding[0] if held else where
            right.append(f"{named} ({x.what}) {'holds' if held else 'lacks'} {x.element}")
        elif x.programmed and x.present:
            missing.append(f"{x.element} is not in {where} ({x.what})")
        elif not holders and x.present:
            wrong.append(f"no set {where} ({x.what}) to hold {x.element}")
        else:
            expected = "should hold" if x.present else "should not hold"
            found = "lacks it" if not held else "holds it"
            wrong.append(f"{where} ({x.what}) {expected} {x.element} but {found}")
    if missing:
        return _replace(e, kernel=KernelCheck("not programmed", "; ".join(missing)))
    if wrong:
        return _replace(e, kernel=KernelCheck("differs", "; ".join(wrong)))
    return _replace(e, kernel=KernelCheck("agrees", "; ".join(right)))
