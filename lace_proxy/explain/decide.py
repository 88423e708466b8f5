"""The decision: what happens to one new connection, in the order the nftables chains check
it (see the package docstring), from the table, the network view and the graph."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from lace_proxy.dataplane.nftables.render import allows_all, clusterip_ranges
from lace_proxy.explain import reasons
from lace_proxy.explain.explanation import (
    ALLOWED,
    DENIED,
    DROPPED,
    PASSES,
    REJECTED,
    UNPROXIED,
    BackendInfo,
    Expect,
    Explanation,
    KernelCheck,
)
from lace_proxy.explain.kernel import access_elements, dispatch_expects, unpeered_expect
from lace_proxy.explain.query import Query, State
from lace_proxy.model import POD_NETWORK_TYPES
from lace_proxy.networks.graph import NetworkGraph, NetworkLayout
from lace_proxy.networks.view import Binding
from lace_proxy.prefixes import covered
from lace_proxy.table import CLUSTER_IP, LOAD_BALANCER, NODE_PORT, Access

if TYPE_CHECKING:
    from lace_proxy.table import Backend, Frontend, Plan


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
    return state.proxier.layout()


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
    network, source_reason = reasons.describe_source(graph, q)
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
    e = _replace(e, conditions=reasons.conditions(state, e, binding, labels))
    if elsewhere is not None:
        return _explain_remote_node_port(state, e, plan, f, elsewhere, labels)

    access: Access | None = plan.access
    expects = list(dispatch_expects(plan, f, q))
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
            return _done(e, UNPROXIED, reasons.unproxied(state, q), expects, backends=())
        if access is not None and f.kind == NODE_PORT:
            controlled, element, _ = access_elements(plan, f, None)
            expects.append(Expect((controlled,), element, True, "controlled by the model"))
            reason = "a NodePort on the node's own address is never answered from the node"
            return _done(e, DROPPED, reason, expects, backends=())
        unpeered, local = _host_unpeered(state, _layout(state), q.destination)
        if unpeered is not None and not local:
            expects.append(unpeered_expect(q, True))
            reason = f"the node may not enter pod network {unpeered}: " + reasons.peering_hint(
                graph, unpeered
            )
            return _done(e, DENIED, reason, expects, backends=())

    allowed_by: list[tuple[str, str]] = []
    if access is not None:
        controlled, element, reach = access_elements(plan, f, source)
        expects.append(Expect((controlled,), element, True, "controlled by the model"))
        allowed = source is not None and source in access.sources
        if reach is not None:
            label = f"{source}'s reach set"
            expects.append(Expect((reach,), element, allowed, label))
        if not allowed:
            reason = reasons.denial(state, e, access, labels)
            return _done(e, DENIED, reason, expects, backends=())
        allowed_by = reasons.allowing_policies(state, source, access.network, labels)  # type: ignore[arg-type]
    else:  # plain kube-proxy: the kernel must not restrict it either
        controlled, element, _ = access_elements(plan, f, None)
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
        reason = reasons.allowed_reason(e, allowed_by)
        return _done(e, ALLOWED, reason, expects, backends=backends, allowed_by=allowed_by)
    if verdict == "drop":
        policy = "internal" if f.kind == CLUSTER_IP else "external"
        reason = f"{policy}TrafficPolicy Local and no endpoint on this node: dropped"
        return _done(e, DROPPED, reason, expects, backends=(), allowed_by=allowed_by)
    why = reasons.no_backends(table, plan, e, f)
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
        network, why = reasons.describe_source(
            graph, Query(address, q.destination, q.port, q.protocol)
        )
        label, _, why = why.partition(": ")
        e = _replace(
            e,
            source_network=network,
            source_reason=f"{label}: {node} sees this node's address {address}; {why}",
        )
    if access is not None and (e.source_network not in access.sources):
        reason = reasons.denial(state, e, access, labels)
        return _done(e, DENIED, reason, [], backends=(), kernel_note=note)
    allowed_by = (
        reasons.allowing_policies(state, e.source_network, access.network, labels)  # type: ignore[arg-type]
        if access is not None
        else []
    )
    if f.verdict is None and f.backends:
        reason = reasons.allowed_reason(e, allowed_by)
        if plan.external_local:
            reason += f" (externalTrafficPolicy Local: {node}'s own endpoints answer)"
        return _done(
            e, ALLOWED, reason, [], backends=f.backends, allowed_by=allowed_by, kernel_note=note
        )
    why = reasons.no_backends(state.proxier.table, plan, e, f)
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
            return _done(e, UNPROXIED, reasons.unproxied(state, q), [], backends=())
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
    e = _replace(e, conditions=reasons.conditions(state, e, None, {}))

    if q.from_node and graph.enabled:
        layout = _layout(state)
        unpeered, local = _host_unpeered(state, layout, q.destination)
        if unpeered is not None:
            expects = [unpeered_expect(q, True)]
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
            reason = reasons.peering_hint(graph, unpeered)
            prefix = state.settings.pod_interface_prefix
            if prefix:
                note = (
                    f"unless the node routes {q.destination} out of a pod interface "
                    f"({prefix}*): then it is one of its own pods, always reachable"
                )
                e = _replace(e, notes=(*e.notes, note))
            return _done(e, DENIED, reason, expects, backends=())
        if pod_network is not None:
            names = reasons.peerings(state, layout.host_local or "", pod_network)
            expects = [unpeered_expect(q, False)]
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
                + ", ".join(reasons.peerings(state, src, pod_network))
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
