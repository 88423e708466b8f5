"""Kubernetes API objects (JSON dict form) -> validated model objects, with kube-proxy semantics.

Input is what the API server or `yaml.safe_load` produces. Anything malformed raises
`ValidationError` naming the object, the field path and the value; wrong JSON types never
escape as TypeError/KeyError/AttributeError. Absent, null and empty values are treated alike,
as Go's decoding of these types does. Rules the API server enforces are re-checked, since
objects can also come from hand-written manifests.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from datetime import datetime
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Any, NoReturn

from lace_proxy.config import IPVS_SCHEDULERS
from lace_proxy.model.endpointslice import (
    LAST_CHANGE_TRIGGER_TIME,
    SERVICE_NAME_LABEL,
    Endpoint,
    EndpointPort,
    EndpointSlice,
)
from lace_proxy.model.errors import ValidationError
from lace_proxy.model.node import MTU_ANNOTATION, ZONE_LABEL, Node
from lace_proxy.model.service import (
    DEFAULT_AFFINITY_TIMEOUT,
    HEADLESS_LABEL,
    IPVS_SCHEDULER_ANNOTATION,
    KUBE_ROUTER_SCHEDULER_ANNOTATION,
    SERVICE_PROXY_NAME_LABEL,
    Service,
    ServicePort,
)
from lace_proxy.model.servicecidr import SERVICE_CIDR_API_VERSION, ServiceCIDR

if TYPE_CHECKING:
    from lace_proxy.model.lace import LaceObject

#: Annotation form of spec.loadBalancerSourceRanges (comma-separated CIDRs).
LB_SOURCE_RANGES_ANNOTATION = "service.beta.kubernetes.io/load-balancer-source-ranges"
MAX_AFFINITY_TIMEOUT = 86400

_PROTOCOLS = ("TCP", "UDP", "SCTP")
_SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")
_TRAFFIC_POLICIES = ("Cluster", "Local")
_AFFINITIES = ("None", "ClientIP")
_IP_MODES = ("VIP", "Proxy")
_ADDRESS_TYPES = {"IPv4": 4, "IPv6": 6, "FQDN": None}


class _Subject:
    """The object being parsed, so that every error can name it."""

    __slots__ = ("kind", "name")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.name = ""

    def fail(self, field: str, value: Any, reason: str, code: str) -> NoReturn:
        raise ValidationError(self.kind, self.name, field, value, reason, code)


# --- field helpers: each checks the JSON type first, then the value ---------------------------


def _mapping(s: _Subject, value: Any, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    s.fail(field, value, "must be an object", "invalid_type")


def _list(s: _Subject, value: Any, field: str) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, list):
        return value
    s.fail(field, value, "must be a list", "invalid_type")


def _opt_str(s: _Subject, value: Any, field: str) -> str | None:
    """A string, or None for absent/null/empty (Go cannot tell these apart)."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return value
    s.fail(field, value, "must be a string", "invalid_type")


def _req_str(s: _Subject, value: Any, field: str) -> str:
    result = _opt_str(s, value, field)
    if result is None:
        s.fail(field, None, "required", "missing_field")
    return result


def _enum(s: _Subject, value: Any, field: str, allowed: tuple[str, ...], default: str) -> str:
    result = _opt_str(s, value, field)
    if result is None:
        return default
    if result not in allowed:
        s.fail(field, value, f"must be one of {', '.join(allowed)}", "invalid_value")
    return result


def _bool(s: _Subject, value: Any, field: str, default: bool) -> bool:
    if value is None:
        return default
    if value is True or value is False:
        return value
    s.fail(field, value, "must be a boolean", "invalid_type")


def _int(s: _Subject, value: Any, field: str) -> int:
    # bool is an int subclass; `port: true` in YAML must not become port 1.
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    s.fail(field, value, "must be an integer", "invalid_type")


def _port(s: _Subject, value: Any, field: str, *, zero_ok: bool = False) -> int:
    """1-65535; with `zero_ok`, also 0 (= none allocated), which is then the default."""
    if value is None:
        if zero_ok:
            return 0
        s.fail(field, None, "required", "missing_field")
    port = _int(s, value, field)
    if not (0 if zero_ok else 1) <= port <= 65535:
        s.fail(field, value, "must be 0-65535" if zero_ok else "must be 1-65535", "invalid_port")
    return port


@lru_cache(maxsize=65536)
def _canonical_ip(text: str) -> tuple[int, str] | None:
    """(version, canonical text), or None if `text` is not a plain IP address.

    Cached: endpoint addresses recur in every update of their slice. IPv6 zones are refused
    (Go's parser refuses them too), and an IPv4-mapped IPv6 address is the IPv4 address, as
    Go sees it.
    """
    try:
        address = ipaddress.IPv6Address(text) if ":" in text else ipaddress.IPv4Address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.scope_id is not None:
            return None
        if address.ipv4_mapped is not None:
            return 4, str(address.ipv4_mapped)
    return address.version, str(address)


def _ip(s: _Subject, value: Any, field: str, version: int | None = None) -> str:
    """Canonical text of an IP address, of the given version if one is given."""
    if not isinstance(value, str):
        s.fail(field, value, "must be a string", "invalid_type")
    parsed = _canonical_ip(value)
    if parsed is None:
        s.fail(field, value, "not an IP address", "invalid_ip")
    if version is not None and parsed[0] != version:
        s.fail(field, value, f"not an IPv{version} address", "invalid_ip")
    return parsed[1]


def _ips(s: _Subject, value: Any, field: str) -> tuple[str, ...]:
    items = _list(s, value, field)
    return tuple(_ip(s, item, f"{field}[{i}]") for i, item in enumerate(items))


def _cidr(s: _Subject, value: Any, field: str) -> str:
    """Canonical CIDR; host bits are cleared (as Go's ParseCIDR does), padding is ignored."""
    if not isinstance(value, str):
        s.fail(field, value, "must be a string", "invalid_type")
    text = value.strip()
    address, slash, prefix = text.partition("/")
    # ip_network would also take a bare address or a netmask ("/255.0.0.0"); Go takes neither.
    if slash and prefix.isascii() and prefix.isdigit() and "%" not in address:
        try:
            return str(ipaddress.ip_network(text, strict=False))
        except ValueError:
            pass
    s.fail(field, value, "not a CIDR (like 10.0.0.0/8)", "invalid_cidr")


def _cidrs(s: _Subject, value: Any, field: str) -> tuple[str, ...]:
    items = _list(s, value, field)
    return tuple(_cidr(s, item, f"{field}[{i}]") for i, item in enumerate(items))


def _metadata(
    obj: Any, kind: str, *, namespaced: bool
) -> tuple[_Subject, dict[str, Any], str, str]:
    """(subject, metadata, namespace, name), checked first so later errors can name the object.

    The namespace is "" for cluster-scoped kinds and defaults to "default" otherwise.
    """
    s = _Subject(kind)
    if not isinstance(obj, dict):
        s.fail("", obj, "must be an object", "invalid_type")
    meta = _mapping(s, obj.get("metadata"), "metadata")
    name = _req_str(s, meta.get("name"), "metadata.name")
    if not namespaced:
        s.name = name
        return s, meta, "", name
    namespace = _opt_str(s, meta.get("namespace"), "metadata.namespace") or "default"
    s.name = f"{namespace}/{name}"
    return s, meta, namespace, name


def _labels(s: _Subject, meta: dict[str, Any]) -> dict[str, str]:
    labels = _mapping(s, meta.get("labels"), "metadata.labels")
    for key, value in labels.items():
        if not isinstance(value, str):
            s.fail(f'metadata.labels["{key}"]', value, "must be a string", "invalid_type")
    return labels


def _sorted_pairs(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


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
    s, meta, namespace, name = _metadata(obj, "Service", namespaced=True)
    labels = _labels(s, meta)
    spec = _mapping(s, obj.get("spec"), "spec")

    svc_type = _enum(s, spec.get("type"), "spec.type", _SERVICE_TYPES, "ClusterIP")
    headless = HEADLESS_LABEL in labels
    cluster_ips: tuple[str, ...] = ()
    if svc_type != "ExternalName":
        cluster_ips, none = _cluster_ips(s, spec)
        headless = headless or none
    ports = _service_ports(s, spec.get("ports"))
    external_ips = _ips(s, spec.get("externalIPs"), "spec.externalIPs")
    # One frontend per address: a ClusterIP stays a ClusterIP, an address that is both an
    # ExternalIP and a load-balancer IP stays the latter (its source ranges apply).
    lb_ips = tuple(
        dict.fromkeys(a for a in _lb_ingress_ips(s, obj.get("status")) if a not in cluster_ips)
    )
    taken = set(cluster_ips) | (set(lb_ips) if svc_type == "LoadBalancer" else set())
    external_ips = tuple(dict.fromkeys(a for a in external_ips if a not in taken))

    external_policy = _enum(
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
    internal_policy = _enum(
        s,
        spec.get("internalTrafficPolicy"),
        "spec.internalTrafficPolicy",
        _TRAFFIC_POLICIES,
        "Cluster",
    )
    health_check_node_port = _port(
        s, spec.get("healthCheckNodePort"), "spec.healthCheckNodePort", zero_ok=True
    )
    if not (svc_type == "LoadBalancer" and external_policy == "Local"):
        health_check_node_port = 0

    affinity = (
        _enum(s, spec.get("sessionAffinity"), "spec.sessionAffinity", _AFFINITIES, "None")
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
        traffic_distribution=_opt_str(
            s, spec.get("trafficDistribution"), "spec.trafficDistribution"
        ),
        session_affinity=affinity,
        affinity_timeout=_affinity_timeout(s, spec) if affinity else DEFAULT_AFFINITY_TIMEOUT,
        health_check_node_port=health_check_node_port,
        headless=headless,
        proxy_name=labels.get(SERVICE_PROXY_NAME_LABEL),
        labels=_sorted_pairs(labels),
        ipvs_scheduler=_ipvs_scheduler(s, meta),
    )


def _cluster_ips(s: _Subject, spec: dict[str, Any]) -> tuple[tuple[str, ...], bool]:
    """(canonical IPs, headless); spec.clusterIP is the pre-dual-stack form of spec.clusterIPs."""
    raw = spec.get("clusterIPs")
    if raw is not None and raw != []:
        items = _list(s, raw, "spec.clusterIPs")
        if "None" in items:
            if len(items) != 1:
                s.fail("spec.clusterIPs", items, '"None" must be the only entry', "invalid_value")
            return (), True
        ips = tuple(_ip(s, ip, f"spec.clusterIPs[{i}]") for i, ip in enumerate(items))
        if len(ips) > 2 or (len(ips) == 2 and (":" in ips[0]) == (":" in ips[1])):
            s.fail("spec.clusterIPs", items, "must hold at most one IP per family", "invalid_value")
        return ips, False
    single = _opt_str(s, spec.get("clusterIP"), "spec.clusterIP")
    if single is None:
        return (), False
    if single == "None":
        return (), True
    return (_ip(s, single, "spec.clusterIP"),), False


def _service_ports(s: _Subject, value: Any) -> tuple[ServicePort, ...]:
    """spec.ports; (name, protocol) is the proxy's port identity and (port, protocol) the
    listening socket, so both must be unique (the API server checks the same)."""
    ports = []
    identities: set[tuple[str, str]] = set()
    sockets: set[tuple[int, str]] = set()
    for i, item in enumerate(_list(s, value, "spec.ports")):
        p = f"spec.ports[{i}]"
        entry = _mapping(s, item, p)
        name = _opt_str(s, entry.get("name"), f"{p}.name") or ""
        protocol = _enum(s, entry.get("protocol"), f"{p}.protocol", _PROTOCOLS, "TCP")
        port = _port(s, entry.get("port"), f"{p}.port")
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
                node_port=_port(s, entry.get("nodePort"), f"{p}.nodePort", zero_ok=True),
            )
        )
    return tuple(ports)


def _target_port(s: _Subject, value: Any, field: str) -> int | str | None:
    """A port number or a named container port; None when unset (the API defaults it to port)."""
    if isinstance(value, str):
        return value or None
    return None if value is None else _port(s, value, field)


def _lb_ingress_ips(s: _Subject, status: Any) -> tuple[str, ...]:
    status = _mapping(s, status, "status")
    lb = _mapping(s, status.get("loadBalancer"), "status.loadBalancer")
    ips = []
    for i, item in enumerate(_list(s, lb.get("ingress"), "status.loadBalancer.ingress")):
        p = f"status.loadBalancer.ingress[{i}]"
        entry = _mapping(s, item, p)
        raw_ip = entry.get("ip")
        if raw_ip is None or raw_ip == "":
            continue  # hostname-only: the load balancer is not addressed by IP
        ip = _ip(s, raw_ip, f"{p}.ip")
        # A "Proxy"-mode balancer sends traffic to the nodes, not to the VIP: no VIP rules.
        if _enum(s, entry.get("ipMode"), f"{p}.ipMode", _IP_MODES, "VIP") == "VIP":
            ips.append(ip)
    return tuple(ips)


def _lb_source_ranges(s: _Subject, spec: dict[str, Any], meta: dict[str, Any]) -> tuple[str, ...]:
    """spec.loadBalancerSourceRanges, else the older annotation (comma-separated)."""
    ranges = _cidrs(s, spec.get("loadBalancerSourceRanges"), "spec.loadBalancerSourceRanges")
    if ranges:
        return ranges
    annotations = _mapping(s, meta.get("annotations"), "metadata.annotations")
    field = f'metadata.annotations["{LB_SOURCE_RANGES_ANNOTATION}"]'
    text = _opt_str(s, annotations.get(LB_SOURCE_RANGES_ANNOTATION), field)
    if text is None or not text.strip():
        return ()
    return tuple(_cidr(s, item, field) for item in text.split(","))


def _ipvs_scheduler(s: _Subject, meta: dict[str, Any]) -> str | None:
    """The lace-proxy scheduler annotation, else kube-router's; None when neither is set.

    Only the annotation in effect is checked: when lace-proxy's is set, kube-router's is
    ignored whatever it holds. An empty value counts as unset.
    """
    annotations = _mapping(s, meta.get("annotations"), "metadata.annotations")
    for key in (IPVS_SCHEDULER_ANNOTATION, KUBE_ROUTER_SCHEDULER_ANNOTATION):
        field = f'metadata.annotations["{key}"]'
        scheduler = _opt_str(s, annotations.get(key), field)
        if scheduler is None:
            continue
        if scheduler not in IPVS_SCHEDULERS:
            reason = f"must be one of {', '.join(IPVS_SCHEDULERS)}"
            s.fail(field, scheduler, reason, "invalid_scheduler")
        return scheduler
    return None


def _affinity_timeout(s: _Subject, spec: dict[str, Any]) -> int:
    config = _mapping(s, spec.get("sessionAffinityConfig"), "spec.sessionAffinityConfig")
    p = "spec.sessionAffinityConfig.clientIP"
    value = _mapping(s, config.get("clientIP"), p).get("timeoutSeconds")
    if value is None:
        return DEFAULT_AFFINITY_TIMEOUT
    timeout = _int(s, value, f"{p}.timeoutSeconds")
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
    s, meta, namespace, name = _metadata(obj, "EndpointSlice", namespaced=True)
    labels = _labels(s, meta)
    service_name = labels.get(SERVICE_NAME_LABEL)
    if not service_name:
        s.fail(f'metadata.labels["{SERVICE_NAME_LABEL}"]', None, "required", "missing_field")
    address_type = _req_str(s, obj.get("addressType"), "addressType")
    if address_type not in _ADDRESS_TYPES:
        s.fail("addressType", address_type, "must be one of IPv4, IPv6, FQDN", "invalid_value")
    version = _ADDRESS_TYPES[address_type]
    annotations = _mapping(s, meta.get("annotations"), "metadata.annotations")
    return EndpointSlice(
        namespace=namespace,
        name=name,
        service_name=service_name,
        address_type=address_type,
        endpoints=tuple(
            _endpoint(s, item, f"endpoints[{i}]", version)
            for i, item in enumerate(_list(s, obj.get("endpoints"), "endpoints"))
        ),
        ports=_endpoint_ports(s, obj.get("ports")),
        trigger_time=_trigger_time(annotations.get(LAST_CHANGE_TRIGGER_TIME)),
        labels=_sorted_pairs(labels),
    )


def _endpoint(s: _Subject, value: Any, p: str, version: int | None) -> Endpoint:
    entry = _mapping(s, value, p)
    raw_addresses = _list(s, entry.get("addresses"), f"{p}.addresses")
    if not raw_addresses:
        s.fail(f"{p}.addresses", None, "must not be empty", "missing_field")
    if version is None:  # FQDN: names are not resolved or checked by a proxy
        addresses = tuple(
            _req_str(s, a, f"{p}.addresses[{j}]") for j, a in enumerate(raw_addresses)
        )
    else:
        addresses = tuple(
            _ip(s, a, f"{p}.addresses[{j}]", version) for j, a in enumerate(raw_addresses)
        )
    conditions = _mapping(s, entry.get("conditions"), f"{p}.conditions")
    hints = _mapping(s, entry.get("hints"), f"{p}.hints")
    return Endpoint(
        addresses=addresses,
        ready=_bool(s, conditions.get("ready"), f"{p}.conditions.ready", True),
        serving=_bool(s, conditions.get("serving"), f"{p}.conditions.serving", True),
        terminating=_bool(s, conditions.get("terminating"), f"{p}.conditions.terminating", False),
        node_name=_opt_str(s, entry.get("nodeName"), f"{p}.nodeName"),
        zone=_opt_str(s, entry.get("zone"), f"{p}.zone"),
        hint_zones=_hint_names(s, hints.get("forZones"), f"{p}.hints.forZones"),
        hint_nodes=_hint_names(s, hints.get("forNodes"), f"{p}.hints.forNodes"),
    )


def _hint_names(s: _Subject, value: Any, field: str) -> tuple[str, ...] | None:
    items = _list(s, value, field)
    if not items:
        return None
    return tuple(
        _req_str(s, _mapping(s, item, f"{field}[{i}]").get("name"), f"{field}[{i}].name")
        for i, item in enumerate(items)
    )


def _endpoint_ports(s: _Subject, value: Any) -> tuple[EndpointPort, ...]:
    ports = []
    for i, item in enumerate(_list(s, value, "ports")):
        p = f"ports[{i}]"
        entry = _mapping(s, item, p)
        port = entry.get("port")
        ports.append(
            EndpointPort(
                name=_opt_str(s, entry.get("name"), f"{p}.name") or "",
                protocol=_enum(s, entry.get("protocol"), f"{p}.protocol", _PROTOCOLS, "TCP"),
                port=None if port is None else _port(s, port, f"{p}.port"),
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
    s, meta, _, name = _metadata(obj, "Node", namespaced=False)
    labels = _labels(s, meta)
    status = _mapping(s, obj.get("status"), "status")
    addresses = []
    for i, item in enumerate(_list(s, status.get("addresses"), "status.addresses")):
        p = f"status.addresses[{i}]"
        entry = _mapping(s, item, p)
        kind = _req_str(s, entry.get("type"), f"{p}.type")
        address = entry.get("address")
        if not isinstance(address, str):
            s.fail(f"{p}.address", address, "must be a string", "invalid_type")
        parsed = _canonical_ip(address)
        if parsed is not None:
            addresses.append((kind, parsed[1]))
    spec = _mapping(s, obj.get("spec"), "spec")
    if spec.get("podCIDRs") is None or spec.get("podCIDRs") == []:
        single = _opt_str(s, spec.get("podCIDR"), "spec.podCIDR")
        pod_cidrs = () if single is None else (_cidr(s, single, "spec.podCIDR"),)
    else:
        pod_cidrs = _cidrs(s, spec["podCIDRs"], "spec.podCIDRs")
    annotations = _mapping(s, meta.get("annotations"), "metadata.annotations")
    mtu_text = _opt_str(
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
        labels=_sorted_pairs(labels),
        mtu=mtu,
    )


# --- ServiceCIDR ------------------------------------------------------------------------------


def parse_service_cidr(obj: dict[str, Any]) -> ServiceCIDR:
    """A networking.k8s.io/v1 ServiceCIDR: one or two CIDRs, at most one per family, each a
    network address (the API server refuses `10.96.0.1/16`; so does this)."""
    s, _, _, name = _metadata(obj, "ServiceCIDR", namespaced=False)
    spec = _mapping(s, obj.get("spec"), "spec")
    raw = _list(s, spec.get("cidrs"), "spec.cidrs")
    if not raw:
        s.fail("spec.cidrs", spec.get("cidrs"), "required: one or two CIDRs", "missing_field")
    if len(raw) > 2:
        s.fail("spec.cidrs", raw, "at most two CIDRs (one per family)", "invalid_value")
    cidrs = []
    for i, value in enumerate(raw):
        field = f"spec.cidrs[{i}]"
        cidr = _cidr(s, value, field)
        address = ipaddress.ip_address(value.strip().partition("/")[0])
        if address != ipaddress.ip_network(cidr).network_address:
            s.fail(field, value, f"host bits set (the network is {cidr})", "invalid_cidr")
        cidrs.append(cidr)
    families = [ipaddress.ip_network(c).version for c in cidrs]
    if len(set(families)) != len(families):
        s.fail("spec.cidrs", raw, "two CIDRs of one family (one per family)", "invalid_value")
    return ServiceCIDR(name=name, cidrs=tuple(cidrs))


# --- dispatch ---------------------------------------------------------------------------------

_PARSERS: dict[tuple[str, str], Callable[[dict[str, Any]], Any]] = {
    ("v1", "Service"): parse_service,
    ("discovery.k8s.io/v1", "EndpointSlice"): parse_endpoint_slice,
    ("v1", "Node"): parse_node,
    (SERVICE_CIDR_API_VERSION, "ServiceCIDR"): parse_service_cidr,
}


@cache
def _dispatch() -> dict[tuple[str, str], Callable[[dict[str, Any]], Any]]:
    """Every parser by (apiVersion, kind), the Lace kinds included.

    Built on first use, not at import: lace.py builds on this module's helpers, so importing
    it from here at the top would be circular.
    """
    from lace_proxy.model.lace import LACE_GROUP_VERSION, LACE_KINDS

    lace = {(LACE_GROUP_VERSION, kind): parser for kind, parser in LACE_KINDS.items()}
    return {**_PARSERS, **lace}


def parse_object(obj: Any) -> Service | EndpointSlice | Node | ServiceCIDR | LaceObject:
    """Any supported object, chosen by apiVersion and kind; others are "unsupported_kind"."""
    if not isinstance(obj, dict):
        raise ValidationError("Object", "", "", obj, "must be an object", "invalid_type")
    parsers = _dispatch()
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if isinstance(api_version, str) and isinstance(kind, str):
        parser = parsers.get((api_version, kind))
        if parser is not None:
            return parser(obj)
    supported = [f"{version} {name}" for version, name in parsers]
    expected = f"expected {', '.join(supported[:-1])} or {supported[-1]}"
    if isinstance(kind, str) and kind in {name for _, name in parsers}:
        field, value, reason = "apiVersion", api_version, f"unsupported version; {expected}"
    else:
        field, value, reason = "kind", kind, f"unsupported kind; {expected}"
    label = kind if isinstance(kind, str) and kind else "Object"
    raise ValidationError(label, _identity(obj), field, value, reason, "unsupported_kind")


def _identity(obj: dict[str, Any]) -> str:
    """Best-effort "namespace/name" of an object that will not be parsed."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        return ""
    name, namespace = meta["name"], meta.get("namespace")
    return f"{namespace}/{name}" if isinstance(namespace, str) and namespace else name
