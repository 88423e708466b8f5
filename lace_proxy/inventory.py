"""The services and endpoints a proxier holds, as operators read them (`lace-proxy services`,
`lace-proxy endpoints`, and the running proxy's state socket).

Services show what the table committed: each frontend with the backends it forwards to.
Endpoints show every endpoint the sources delivered, before the network model narrowed them,
with the traffic that uses it or, when nothing does, why: the table picks and this module
explains the pick afterwards, from the plan's policies and the endpoint's conditions.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from lace_proxy.model import EndpointSlice, Service
from lace_proxy.model.endpointslice import Endpoint
from lace_proxy.proxier import Proxier
from lace_proxy.table import Backend, Plan

Doc = dict[str, Any]


def _host_port(address: str | None, port: int) -> str:
    host = "*" if address is None else (f"[{address}]" if ":" in address else address)
    return f"{host}:{port}"


def _state(ready: bool, serving: bool, terminating: bool) -> str:
    """kube-proxy's reading of the conditions: ready; else serving and terminating; else not."""
    if ready:
        return "ready"
    if serving and terminating:
        return "terminating"
    return "not-ready"


def _plans_by_service(proxier: Proxier) -> dict[str, list[Plan]]:
    out: dict[str, list[Plan]] = {}
    for plan in proxier.table.plans():
        out.setdefault(plan.service, []).append(plan)
    return out


def _service_keys(proxier: Proxier) -> list[str]:
    return sorted({*proxier.table.service_keys(), *proxier.delivered_slices()})


def _skipped(svc: Service) -> str | None:
    """Why kube-proxy (and so lace-proxy) leaves a service alone, or None."""
    if svc.type == "ExternalName":
        return "ExternalName service: DNS only"
    if svc.headless or not svc.cluster_ips:
        return "headless service: no ClusterIP"
    if svc.proxy_name is not None:
        return f"handed to another proxy (service-proxy-name {svc.proxy_name})"
    return None


def services(proxier: Proxier) -> list[Doc]:
    """Every service the sources delivered, with its committed frontends and backends."""
    plans = _plans_by_service(proxier)
    conflicts = proxier.table.conflicts
    out = []
    for key in _service_keys(proxier):
        svc = proxier.table.service(key)
        if svc is None:
            continue  # slices whose service has not arrived: `endpoints` shows them
        binding = proxier.networks.bindings.get(key)
        frontends = []
        for plan in sorted(plans.get(key, ()), key=lambda p: p.id):
            for f in plan.frontends():
                frontends.append(
                    {
                        "kind": f.kind,
                        "frontend": f"{_host_port(f.address, f.port)}/{f.protocol}",
                        "port": plan.port_name,
                        "family": f"IPv{f.family}",
                        "action": f.verdict or "forward",
                        "backends": [
                            {
                                "endpoint": _host_port(b.ip, b.port),
                                "state": _state(b.ready, b.serving, b.terminating),
                                "local": b.local,
                            }
                            for b in f.backends
                        ],
                    }
                )
        out.append(
            {
                "namespace": svc.namespace,
                "name": svc.name,
                "type": svc.type,
                "clusterIPs": list(svc.cluster_ips),
                "skipped": _skipped(svc),
                "network": binding.network if binding else None,
                "boundBy": binding.bound_by if binding else None,
                "reachableFrom": sorted(binding.sources) if binding else None,
                "internalTrafficPolicy": svc.internal_traffic_policy,
                "externalTrafficPolicy": svc.external_traffic_policy,
                "sessionAffinityTimeout": svc.affinity_timeout if svc.session_affinity else None,
                "conflicts": list(conflicts.get(key, ())),
                "frontends": frontends,
                "excludedEndpoints": len(binding.excluded) if binding else 0,
            }
        )
    return out


def _family(sl: EndpointSlice) -> int | None:
    return {"IPv4": 4, "IPv6": 6}.get(sl.address_type)


def _kinds(plan: Plan) -> list[tuple[str, bool, tuple[Backend, ...]]]:
    """The traffic a plan carries: (name, whose policy is Local, the backends it uses)."""
    kinds = [("cluster", plan.internal_local, plan.internal_backends)]
    if plan.node_port or plan.external_ips or plan.lb_ips:
        kinds.append(("external", plan.external_local, plan.external_backends))
    return kinds


def _why_unused(ep: Endpoint, plan: Plan, node: str, zone: str | None) -> str:
    """The most specific reason the table gave none of the plan's traffic to this endpoint."""
    if not ep.ready and not (ep.serving and ep.terminating):
        return "not ready"
    local_only = all(local for _, local, _ in _kinds(plan))
    if local_only and ep.node_name != node:
        return f"on node {ep.node_name or '(none)'}: the traffic policy is Local"
    if not ep.ready:
        return "terminating: ready endpoints are used first"
    if ep.hint_nodes is not None and node not in ep.hint_nodes:
        return f"topology hints for nodes {','.join(ep.hint_nodes)}, not this node"
    if ep.hint_zones is not None and zone not in ep.hint_zones:
        where = f"this node is in {zone}" if zone else "this node has no zone"
        return f"topology hints for zones {','.join(ep.hint_zones)}; {where}"
    return "not selected"


def _no_plan(
    svc: Service | None, family: int, port_name: str, protocol: str, conflict: bool
) -> str:
    if svc is None:
        return "no such service"
    skipped = _skipped(svc)
    if skipped is not None:
        return skipped
    if not any((":" in ip) == (family == 6) for ip in svc.cluster_ips):
        return f"the service has no IPv{family} ClusterIP"
    if conflict:
        return "the service's ClusterIP is held by another service"
    return f"the service has no port {port_name or '(unnamed)'}/{protocol}"


def endpoints(proxier: Proxier) -> list[Doc]:
    """Every delivered endpoint, per service port: its state, who uses it, or why not."""
    plans = _plans_by_service(proxier)
    conflicts = proxier.table.conflicts
    node, zone = proxier.table.node_name, proxier.table.zone
    out = []
    for key in _service_keys(proxier):
        svc = proxier.table.service(key)
        binding = proxier.networks.bindings.get(key)
        excluded = dict(binding.excluded) if binding else {}
        by_port = {(p.port_name, p.protocol, p.family): p for p in plans.get(key, ())}
        slices = proxier.delivered_slices().get(key, {})
        for slice_key in sorted(slices):
            sl = slices[slice_key]
            family = _family(sl)
            for port in sl.ports:
                plan = by_port.get((port.name, port.protocol, family)) if family else None
                for ep in sl.endpoints:
                    address = ep.addresses[0]
                    used: list[str] = []
                    if family is None:
                        why: str | None = f"{sl.address_type} slices are not proxied"
                    elif port.port is None:
                        why = "the slice's port has no number"
                    elif address in excluded:
                        why = excluded[address]
                    elif plan is None:
                        why = _no_plan(svc, family, port.name, port.protocol, key in conflicts)
                    else:
                        used = [
                            kind
                            for kind, _, backends in _kinds(plan)
                            if any(b.ip == address and b.port == port.port for b in backends)
                        ]
                        why = None if used else _why_unused(ep, plan, node, zone)
                    out.append(
                        {
                            "namespace": sl.namespace,
                            "service": sl.service_name,
                            "slice": sl.name,
                            "port": port.name,
                            "protocol": port.protocol,
                            "endpoint": address
                            if port.port is None
                            else _host_port(address, port.port),
                            "state": _state(ep.ready, ep.serving, ep.terminating),
                            "node": ep.node_name,
                            "zone": ep.zone,
                            "local": ep.node_name == node,
                            "network": binding.network if binding else None,
                            "usedBy": used,
                            "excluded": why,
                        }
                    )
    return out


def select(
    docs: Iterable[Doc], namespace: str | None, names: Iterable[str], name_key: str
) -> list[Doc]:
    """The documents in `namespace` (None: any) whose service is one of `names` (NAME or
    NAMESPACE/NAME; none given: all)."""
    wanted = list(names)

    def match(doc: Doc) -> bool:
        if namespace is not None and doc["namespace"] != namespace:
            return False
        if not wanted:
            return True
        full = f"{doc['namespace']}/{doc[name_key]}"
        return any(w == full or w == doc[name_key] for w in wanted)

    return [d for d in docs if match(d)]
