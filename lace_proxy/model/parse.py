"""Kubernetes API objects (JSON dict form) -> validated model objects, with kube-proxy semantics.

Input is what the API server or `yaml.safe_load` produces. Anything malformed raises
`ValidationError` naming the object, the field path and the value; wrong JSON types never
escape as TypeError/KeyError/AttributeError. Absent, null and empty values are treated alike,
as Go's decoding of these types does (see fields.py). Rules the API server enforces are
re-checked, since objects can also come from hand-written manifests.
"""

from __future__ import annotations

import ipaddress
from datetime import datetime
from typing import Any

from lace_proxy.model.endpointslice import (
    LAST_CHANGE_TRIGGER_TIME,
    SERVICE_NAME_LABEL,
    Endpoint,
    EndpointPort,
    EndpointSlice,
)
from lace_proxy.model.fields import (
    Subject,
    as_bool,
    as_cidr,
    as_cidrs,
    as_int,
    as_ip,
    as_ips,
    as_list,
    as_mapping,
    as_port,
    canonical_ip,
    object_labels,
    object_metadata,
    opt_enum,
    opt_str,
    req_str,
    sorted_pairs,
)
from lace_proxy.model.node import MTU_ANNOTATION, ZONE_LABEL, Node
from lace_proxy.model.plain import plain_endpoint
from lace_proxy.model.service import (
    BGP_ADVERTISE_ANNOTATION,
    BGP_COMMUNITIES_ANNOTATION,
    DEFAULT_AFFINITY_TIMEOUT,
    HEADLESS_LABEL,
    IPVS_SCHEDULER_ANNOTATION,
    IPVS_SCHEDULERS,
    KUBE_ROUTER_SCHEDULER_ANNOTATION,
    SERVICE_PROXY_NAME_LABEL,
    BgpAnnotations,
    Service,
    ServicePort,
    community,
)
from lace_proxy.model.servicecidr import ServiceCIDR

#: Annotation form of spec.loadBalancerSourceRanges (comma-separated CIDRs).
LB_SOURCE_RANGES_ANNOTATION = "service.beta.kubernetes.io/load-balancer-source-ranges"
MAX_AFFINITY_TIMEOUT = 86400

_PROTOCOLS = ("TCP", "UDP", "SCTP")
_SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")
_TRAFFIC_POLICIES = ("Cluster", "Local")
_AFFINITIES = ("None", "ClientIP")
_IP_MODES = ("VIP", "Proxy")
_ADDRESS_TYPES = {"IPv4": 4, "IPv6": 6, "FQDN": None}


# --- Service ----------------------------------------------------------------------------------


def parse_service(obj: dict[str, Any]) -> Service:
    """A core/v1 Service.

    Normalized the way kube-proxy reads it: externalTrafficPolicy is "Local" only for an
    externally reachable service (NodePort, LoadBalancer, or ClusterIP with externalIPs);
    healthCheckNodePort is kept only for a LoadBalancer with that policy; load-balancer
    ingress entries without an IP, or with ipMode "Proxy", give no VIP; the affinity timeout
    is read only with sessionAffinity ClientIP; ExternalName services have no cluster IPs.
    An address is one frontend: ExternalIPs and load-balancer IPs repeated, or equal to a
    ClusterIP, are dropped (a kernel map holds one entry per address and port).
    The IPVS scheduler comes from an annotation (see `_ipvs_scheduler`).
    """
    s, meta, namespace, name = object_metadata(obj, "Service", namespaced=True)
    labels = object_labels(s, meta)
    spec = as_mapping(s, obj.get("spec"), "spec")

    svc_type = opt_enum(s, spec.get("type"), "spec.type", _SERVICE_TYPES, "ClusterIP")
    headless = HEADLESS_LABEL in labels
    cluster_ips: tuple[str, ...] = ()
    if svc_type != "ExternalName":
        cluster_ips, none = _cluster_ips(s, spec)
        headless = headless or none
    ports = _service_ports(s, spec.get("ports"))
    external_ips = as_ips(s, spec.get("externalIPs"), "spec.externalIPs")
    # One frontend per address: a ClusterIP stays a ClusterIP, an address that is both an
    # ExternalIP and a load-balancer IP stays the latter (its source ranges apply).
    lb_ips = tuple(
        dict.fromkeys(a for a in _lb_ingress_ips(s, obj.get("status")) if a not in cluster_ips)
    )
    taken = set(cluster_ips) | (set(lb_ips) if svc_type == "LoadBalancer" else set())
    external_ips = tuple(dict.fromkeys(a for a in external_ips if a not in taken))

    external_policy = opt_enum(
        s,
        spec.get("externalTrafficPolicy"),
        "spec.externalTrafficPolicy",
        _TRAFFIC_POLICIES,
        "Cluster",
    )
    reachable = svc_type in ("NodePort", "LoadBalancer") or (
        svc_type == "ClusterIP" and bool(external_ips)
    )
    if not reachable:
        external_policy = "Cluster"
    internal_policy = opt_enum(
        s,
        spec.get("internalTrafficPolicy"),
        "spec.internalTrafficPolicy",
        _TRAFFIC_POLICIES,
        "Cluster",
    )
    health_check_node_port = as_port(
        s, spec.get("healthCheckNodePort"), "spec.healthCheckNodePort", zero_ok=True
    )
    if not (svc_type == "LoadBalancer" and external_policy == "Local"):
        health_check_node_port = 0

    affinity = (
        opt_enum(s, spec.get("sessionAffinity"), "spec.sessionAffinity", _AFFINITIES, "None")
        == "ClientIP"
    )
    return Service(
        namespace=namespace,
        name=name,
        type=svc_type,
        cluster_ips=cluster_ips,
        ports=ports,
        external_ips=external_ips,
        lb_ingress_ips=lb_ips,
        lb_source_ranges=_lb_source_ranges(s, spec, meta),
        external_traffic_policy=external_policy,
        internal_traffic_policy=internal_policy,
        traffic_distribution=opt_str(
            s, spec.get("trafficDistribution"), "spec.trafficDistribution"
        ),
        session_affinity=affinity,
        affinity_timeout=_affinity_timeout(s, spec) if affinity else DEFAULT_AFFINITY_TIMEOUT,
        health_check_node_port=health_check_node_port,
        headless=headless,
        proxy_name=labels.get(SERVICE_PROXY_NAME_LABEL),
        labels=sorted_pairs(labels),
        ipvs_scheduler=_ipvs_scheduler(s, meta),
        bgp=_bgp(s, meta),
    )


def _cluster_ips(s: Subject, spec: dict[str, Any]) -> tuple[tuple[str, ...], bool]:
    """(canonical IPs, headless); spec.clusterIP is the pre-dual-stack form of spec.clusterIPs."""
    raw = spec.get("clusterIPs")
    if raw is not None and raw != []:
        items = as_list(s, raw, "spec.clusterIPs")
        if "None" in items:
            if len(items) != 1:
                s.fail("spec.clusterIPs", items, '"None" must be the only entry', "invalid_value")
            return (), True
        ips = tuple(as_ip(s, ip, f"spec.clusterIPs[{i}]") for i, ip in enumerate(items))
        if len(ips) > 2 or (len(ips) == 2 and (":" in ips[0]) == (":" in ips[1])):
            s.fail("spec.clusterIPs", items, "must hold at most one IP per family", "invalid_value")
        return ips, False
    single = opt_str(s, spec.get("clusterIP"), "spec.clusterIP")
    if single is None:
        return (), False
    if single == "None":
        return (), True
    return (as_ip(s, single, "spec.clusterIP"),), False


def _service_ports(s: Subject, value: Any) -> tuple[ServicePort, ...]:
    """spec.ports; (name, protocol) is the proxy's port identity and (port, protocol) the
    listening socket, so both must be unique (the API server checks the same)."""
    ports = []
    identities: set[tuple[str, str]] = set()
    sockets: set[tuple[int, str]] = set()
    for i, item in enumerate(as_list(s, value, "spec.ports")):
        p = f"spec.ports[{i}]"
        entry = as_mapping(s, item, p)
        name = opt_str(s, entry.get("name"), f"{p}.name") or ""
        protocol = opt_enum(s, entry.get("protocol"), f"{p}.protocol", _PROTOCOLS, "TCP")
        port = as_port(s, entry.get("port"), f"{p}.port")
        if (name, protocol) in identities:
            s.fail(f"{p}.name", name, f"duplicate name for protocol {protocol}", "duplicate_port")
        if (port, protocol) in sockets:
            s.fail(f"{p}.port", port, f"duplicate {protocol} port", "duplicate_port")
        identities.add((name, protocol))
        sockets.add((port, protocol))
        ports.append(
            ServicePort(
                name=name,
                protocol=protocol,
                port=port,
                target_port=_target_port(s, entry.get("targetPort"), f"{p}.targetPort"),
                node_port=as_port(s, entry.get("nodePort"), f"{p}.nodePort", zero_ok=True),
            )
        )
    return tuple(ports)


def _target_port(s: Subject, value: Any, field: str) -> int | str | None:
    """A port number or a named container port; None when unset (the API defaults it to port)."""
    if isinstance(value, str):
        return value or None
    return None if value is None else as_port(s, value, field)


def _lb_ingress_ips(s: Subject, status: Any) -> tuple[str, ...]:
    status = as_mapping(s, status, "status")
    lb = as_mapping(s, status.get("loadBalancer"), "status.loadBalancer")
    ips = []
    for i, item in enumerate(as_list(s, lb.get("ingress"), "status.loadBalancer.ingress")):
        p = f"status.loadBalancer.ingress[{i}]"
        entry = as_mapping(s, item, p)
        raw_ip = entry.get("ip")
        if raw_ip is None or raw_ip == "":
            continue  # hostname-only: the load balancer is not addressed by IP
        ip = as_ip(s, raw_ip, f"{p}.ip")
        # A "Proxy"-mode balancer sends traffic to the nodes, not to the VIP: no VIP rules.
        if opt_enum(s, entry.get("ipMode"), f"{p}.ipMode", _IP_MODES, "VIP") == "VIP":
            ips.append(ip)
    return tuple(ips)


def _lb_source_ranges(s: Subject, spec: dict[str, Any], meta: dict[str, Any]) -> tuple[str, ...]:
    """spec.loadBalancerSourceRanges, else the older annotation (comma-separated)."""
    ranges = as_cidrs(s, spec.get("loadBalancerSourceRanges"), "spec.loadBalancerSourceRanges")
    if ranges:
        return ranges
    annotations = as_mapping(s, meta.get("annotations"), "metadata.annotations")
    if not annotations:
        return ()
    field = f'metadata.annotations["{LB_SOURCE_RANGES_ANNOTATION}"]'
    text = opt_str(s, annotations.get(LB_SOURCE_RANGES_ANNOTATION), field)
    if text is None or not text.strip():
        return ()
    return tuple(as_cidr(s, item, field) for item in text.split(","))


def _ipvs_scheduler(s: Subject, meta: dict[str, Any]) -> str | None:
    """The lace-proxy scheduler annotation, else kube-router's; None when neither is set.

    Only the annotation in effect is checked: when lace-proxy's is set, kube-router's is
    ignored whatever it holds. An empty value counts as unset.
    """
    annotations = as_mapping(s, meta.get("annotations"), "metadata.annotations")
    if not annotations:
        return None
    for key in (IPVS_SCHEDULER_ANNOTATION, KUBE_ROUTER_SCHEDULER_ANNOTATION):
        field = f'metadata.annotations["{key}"]'
        scheduler = opt_str(s, annotations.get(key), field)
        if scheduler is None:
            continue
        if scheduler not in IPVS_SCHEDULERS:
            reason = f"must be one of {', '.join(IPVS_SCHEDULERS)}"
            s.fail(field, scheduler, reason, "invalid_scheduler")
        return scheduler
    return None


def _bgp(s: Subject, meta: dict[str, Any]) -> BgpAnnotations | None:
    """The BGP annotations (BGP_ADVERTISE_ANNOTATION, BGP_COMMUNITIES_ANNOTATION); None when
    neither is set. An empty value counts as unset."""
    annotations = as_mapping(s, meta.get("annotations"), "metadata.annotations")
    if not annotations:
        return None
    field = f'metadata.annotations["{BGP_ADVERTISE_ANNOTATION}"]'
    text = opt_str(s, annotations.get(BGP_ADVERTISE_ANNOTATION), field)
    advertise = None
    if text is not None:
        if text.lower() not in ("true", "false"):
            s.fail(field, text, 'must be "true" or "false"', "invalid_bgp_advertise")
        advertise = text.lower() == "true"
    field = f'metadata.annotations["{BGP_COMMUNITIES_ANNOTATION}"]'
    text = opt_str(s, annotations.get(BGP_COMMUNITIES_ANNOTATION), field)
    communities: set[str] = set()
    for item in (text or "").split(","):
        if item.strip():
            try:
                communities.add(community(item))
            except ValueError as exc:
                s.fail(field, text, str(exc), "invalid_bgp_community")
    if advertise is None and not communities:
        return None
    return BgpAnnotations(advertise, tuple(sorted(communities)))


def _affinity_timeout(s: Subject, spec: dict[str, Any]) -> int:
    config = as_mapping(s, spec.get("sessionAffinityConfig"), "spec.sessionAffinityConfig")
    p = "spec.sessionAffinityConfig.clientIP"
    value = as_mapping(s, config.get("clientIP"), p).get("timeoutSeconds")
    if value is None:
        return DEFAULT_AFFINITY_TIMEOUT
    timeout = as_int(s, value, f"{p}.timeoutSeconds")
    if not 1 <= timeout <= MAX_AFFINITY_TIMEOUT:
        s.fail(f"{p}.timeoutSeconds", value, f"must be 1-{MAX_AFFINITY_TIMEOUT}", "invalid_value")
    return timeout


# --- EndpointSlice ----------------------------------------------------------------------------


def parse_endpoint_slice(obj: dict[str, Any]) -> EndpointSlice:
    """A discovery.k8s.io/v1 EndpointSlice.

    Conditions follow the API contract (and kube-proxy): ready nil -> True, serving nil ->
    True (not "same as ready": the API says nil serving means true), terminating nil -> False.
    Empty hint lists count as no hints, as in kube-proxy's topology code. A malformed
    last-change-trigger-time annotation is ignored: it only feeds a latency metric.
    """
    s, meta, namespace, name = object_metadata(obj, "EndpointSlice", namespaced=True)
    labels = object_labels(s, meta)
    service_name = labels.get(SERVICE_NAME_LABEL)
    if not service_name:
        s.fail(f'metadata.labels["{SERVICE_NAME_LABEL}"]', None, "required", "missing_field")
    address_type = req_str(s, obj.get("addressType"), "addressType")
    if address_type not in _ADDRESS_TYPES:
        s.fail("addressType", address_type, "must be one of IPv4, IPv6, FQDN", "invalid_value")
    version = _ADDRESS_TYPES[address_type]
    annotations = as_mapping(s, meta.get("annotations"), "metadata.annotations")
    return EndpointSlice(
        namespace=namespace,
        name=name,
        service_name=service_name,
        address_type=address_type,
        endpoints=tuple(
            [
                plain_endpoint(item, version) or _endpoint(s, item, f"endpoints[{i}]", version)
                for i, item in enumerate(as_list(s, obj.get("endpoints"), "endpoints"))
            ]
        ),
        ports=_endpoint_ports(s, obj.get("ports")),
        trigger_time=_trigger_time(annotations.get(LAST_CHANGE_TRIGGER_TIME)),
        labels=sorted_pairs(labels),
    )


def _endpoint(s: Subject, value: Any, p: str, version: int | None) -> Endpoint:
    entry = as_mapping(s, value, p)
    raw_addresses = as_list(s, entry.get("addresses"), f"{p}.addresses")
    if not raw_addresses:
        s.fail(f"{p}.addresses", None, "must not be empty", "missing_field")
    if version is None:  # FQDN: names are not resolved or checked by a proxy
        addresses = tuple(req_str(s, a, f"{p}.addresses[{j}]") for j, a in enumerate(raw_addresses))
    else:
        addresses = tuple(
            as_ip(s, a, f"{p}.addresses[{j}]", version) for j, a in enumerate(raw_addresses)
        )
    conditions = as_mapping(s, entry.get("conditions"), f"{p}.conditions")
    hints = as_mapping(s, entry.get("hints"), f"{p}.hints")
    return Endpoint(
        addresses=addresses,
        ready=as_bool(s, conditions.get("ready"), f"{p}.conditions.ready", True),
        serving=as_bool(s, conditions.get("serving"), f"{p}.conditions.serving", True),
        terminating=as_bool(s, conditions.get("terminating"), f"{p}.conditions.terminating", False),
        node_name=opt_str(s, entry.get("nodeName"), f"{p}.nodeName"),
        zone=opt_str(s, entry.get("zone"), f"{p}.zone"),
        hint_zones=_hint_names(s, hints.get("forZones"), f"{p}.hints.forZones"),
        hint_nodes=_hint_names(s, hints.get("forNodes"), f"{p}.hints.forNodes"),
    )


def _hint_names(s: Subject, value: Any, field: str) -> tuple[str, ...] | None:
    items = as_list(s, value, field)
    if not items:
        return None
    return tuple(
        req_str(s, as_mapping(s, item, f"{field}[{i}]").get("name"), f"{field}[{i}].name")
        for i, item in enumerate(items)
    )


def _endpoint_ports(s: Subject, value: Any) -> tuple[EndpointPort, ...]:
    ports = []
    for i, item in enumerate(as_list(s, value, "ports")):
        p = f"ports[{i}]"
        entry = as_mapping(s, item, p)
        port = entry.get("port")
        ports.append(
            EndpointPort(
                name=opt_str(s, entry.get("name"), f"{p}.name") or "",
                protocol=opt_enum(s, entry.get("protocol"), f"{p}.protocol", _PROTOCOLS, "TCP"),
                port=None if port is None else as_port(s, port, f"{p}.port"),
            )
        )
    return tuple(ports)


def _trigger_time(value: Any) -> float | None:
    """RFC 3339 time as a UNIX timestamp; None if absent or unusable (never an error)."""
    if not isinstance(value, str):
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    return when.timestamp() if when.tzinfo is not None else None


# --- Node -------------------------------------------------------------------------------------


def parse_node(obj: dict[str, Any]) -> Node:
    """A core/v1 Node. Addresses that are not IPs (Hostname, InternalDNS, ...) are dropped."""
    s, meta, _, name = object_metadata(obj, "Node", namespaced=False)
    labels = object_labels(s, meta)
    status = as_mapping(s, obj.get("status"), "status")
    addresses = []
    for i, item in enumerate(as_list(s, status.get("addresses"), "status.addresses")):
        p = f"status.addresses[{i}]"
        entry = as_mapping(s, item, p)
        kind = req_str(s, entry.get("type"), f"{p}.type")
        address = entry.get("address")
        if not isinstance(address, str):
            s.fail(f"{p}.address", address, "must be a string", "invalid_type")
        parsed = canonical_ip(address)
        if parsed is not None:
            addresses.append((kind, parsed[1]))
    spec = as_mapping(s, obj.get("spec"), "spec")
    pod_cidrs: tuple[str, ...]
    if spec.get("podCIDRs") is None or spec.get("podCIDRs") == []:
        single = opt_str(s, spec.get("podCIDR"), "spec.podCIDR")
        pod_cidrs = () if single is None else (as_cidr(s, single, "spec.podCIDR"),)
    else:
        pod_cidrs = as_cidrs(s, spec["podCIDRs"], "spec.podCIDRs")
    annotations = as_mapping(s, meta.get("annotations"), "metadata.annotations")
    mtu_text = opt_str(
        s, annotations.get(MTU_ANNOTATION), f'metadata.annotations["{MTU_ANNOTATION}"]'
    )
    mtu = None
    if mtu_text is not None:
        if not (mtu_text.isascii() and mtu_text.isdigit() and 68 <= int(mtu_text) <= 65535):
            s.fail(
                f'metadata.annotations["{MTU_ANNOTATION}"]',
                mtu_text,
                "must be an MTU, 68-65535",
                "invalid_mtu",
            )
        mtu = int(mtu_text)
    return Node(
        name=name,
        zone=labels.get(ZONE_LABEL) or None,
        addresses=tuple(addresses),
        pod_cidrs=pod_cidrs,
        deleting=meta.get("deletionTimestamp") is not None,
        labels=sorted_pairs(labels),
        mtu=mtu,
    )


# --- ServiceCIDR ------------------------------------------------------------------------------


def parse_service_cidr(obj: dict[str, Any]) -> ServiceCIDR:
    """A networking.k8s.io/v1 ServiceCIDR: one or two CIDRs, at most one per family, each a
    network address (the API server refuses `10.96.0.1/16`; so does this)."""
    s, _, _, name = object_metadata(obj, "ServiceCIDR", namespaced=False)
    spec = as_mapping(s, obj.get("spec"), "spec")
    raw = as_list(s, spec.get("cidrs"), "spec.cidrs")
    if not raw:
        s.fail("spec.cidrs", spec.get("cidrs"), "required: one or two CIDRs", "missing_field")
    if len(raw) > 2:
        s.fail("spec.cidrs", raw, "at most two CIDRs (one per family)", "invalid_value")
    cidrs = []
    for i, value in enumerate(raw):
        field = f"spec.cidrs[{i}]"
        cidr = as_cidr(s, value, field)
        address = ipaddress.ip_address(value.strip().partition("/")[0])
        if address != ipaddress.ip_network(cidr).network_address:
            s.fail(field, value, f"host bits set (the network is {cidr})", "invalid_cidr")
        cidrs.append(cidr)
    families = [ipaddress.ip_network(c).version for c in cidrs]
    if len(set(families)) != len(families):
        s.fail("spec.cidrs", raw, "two CIDRs of one family (one per family)", "invalid_value")
    return ServiceCIDR(name=name, cidrs=tuple(cidrs))
