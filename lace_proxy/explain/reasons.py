"""The words of an explanation: the policies a decision rests on, what is missing and what
the operator can do about it, why no endpoint answers, and the conditions that bear on it.

The decision itself is the graph's; these only name what is behind it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from lace_proxy.explain.explanation import Explanation
from lace_proxy.explain.query import Query, State
from lace_proxy.model import (
    POD_NETWORK_TYPES,
    LaceObject,
    NetworkBindingPolicy,
    NetworkRoutingPolicy,
    ServiceRoutingPolicy,
)
from lace_proxy.networks.graph import Condition, NetworkGraph
from lace_proxy.networks.view import Binding
from lace_proxy.table import CLUSTER_IP, Access

if TYPE_CHECKING:
    from lace_proxy.table import Frontend, Plan, ServiceTable


def _net(cidr: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    return ipaddress.ip_network(cidr, strict=False)


def describe_source(graph: NetworkGraph, q: Query) -> tuple[str | None, str]:
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


def peerings(state: State, src: str, dest: str) -> list[str]:
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


def grants(
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


def allowing_policies(
    state: State, source: str, network: str | None, labels: Mapping[str, str]
) -> list[tuple[str, str]]:
    """Why `source` is among the service's allowed sources: its own network, and each policy."""
    if network is None:
        return []
    out: list[tuple[str, str]] = []
    if source == network:
        out.append(("own network", network))
    out += [("NetworkRoutingPolicy", n) for n in peerings(state, source, network)]
    out += [("ServiceRoutingPolicy", n) for n in grants(state, source, network, labels)[0]]
    return out


def allowed_reason(e: Explanation, allowed_by: Sequence[tuple[str, str]]) -> str:
    """The reason an allowed connection gets in, naming each policy in `allowed_by`."""
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


def denial(state: State, e: Explanation, access: Access, labels: Mapping[str, str]) -> str:
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
    misses = grants(state, src, bound, labels)[1]
    for name in misses:
        text += (
            f"; ServiceRoutingPolicy {name} grants {src} the services of {bound}, but its "
            f"serviceSelector does not pick {svc}"
        )
    return text


def unproxied(state: State, q: Query) -> str:
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


def peering_hint(graph: NetworkGraph, network: str) -> str:
    """What would let the node's own traffic into pod network `network`."""
    if graph.host_local is None:
        return (
            f"needs a hostLocal Network and a NetworkRoutingPolicy from it to {network} "
            "(the node's own pods stay reachable)"
        )
    return f"needs a NetworkRoutingPolicy from {graph.host_local} to {network}"


def no_backends(table: ServiceTable, plan: Plan, e: Explanation, f: Frontend) -> str:
    """Why a frontend has no endpoint to send to."""
    if e.excluded:
        return "every endpoint is excluded by the network model (see excluded)"
    endpoints = [ep for sl in table.slices_of(plan.service) for ep in sl.endpoints]
    if not endpoints:
        return "the service has no endpoints"
    if f.kind == CLUSTER_IP and plan.internal_local:
        return "internalTrafficPolicy Local and no endpoint on this node"
    return f"{len(endpoints)} endpoints, none ready or serving+terminating"


def conditions(
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
