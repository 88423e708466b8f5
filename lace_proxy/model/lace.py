"""The Lace network model (lace-cni.io/v1alpha1): Networks and the policies that connect them.

All four kinds are cluster-scoped. They are parsed with the same rules as the core kinds (see
fields.py): absent, null and empty values are alike, wrong JSON types are ValidationErrors, and
CIDRs are canonical, with host bits cleared as Go's ParseCIDR does (`10.1.2.3/8` is accepted
as `10.0.0.0/8`, not rejected). Selectors are the exception to "absent is empty": a required
selector that is absent is an error, because `{}` selects everything and an omitted selector
is more likely a mistake than a wish to select everything.

Cross-object rules (a binding to a Network that does not exist, overlapping prefixes) are
not checked here: each object is valid or not on its own, so that the order in which objects
arrive cannot change whether one of them is accepted.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from lace_proxy.model.fields import (
    Subject,
    as_cidr,
    as_cidrs,
    as_list,
    as_mapping,
    object_labels,
    object_metadata,
    opt_str,
    req_enum,
    req_str,
    sorted_pairs,
)

LACE_GROUP_VERSION = "lace-cni.io/v1alpha1"
#: Label every Network carries implicitly, so that selectors can pick networks by name.
NETWORK_LABEL = "lace-cni.io/network"

NETWORK_TYPES = ("l3", "l2", "external", "hostLocal")
POD_NETWORK_TYPES = ("l3", "l2")
MATCH_KINDS = ("pod", "service")
SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")

# Kubernetes name and label syntax (k8s.io/apimachinery/pkg/util/validation).
_DNS_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_LABEL_RE = re.compile(_DNS_LABEL)
_DNS_SUBDOMAIN_RE = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_LABEL_NAME_RE = re.compile("([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_SYNTAX = "alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"


# --- model ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Network:
    """A network. Pod networks (l3, l2) have at least one subnet prefix, external networks
    at least one external prefix, hostLocal (traffic from a node's own namespace) none."""

    kind: ClassVar[str] = "Network"

    name: str
    type: str  # "l3" | "l2" | "external" | "hostLocal"
    ipv4_prefix: str | None = None  # canonical CIDR of spec.ipv4Subnet.prefix
    ipv6_prefix: str | None = None  # canonical CIDR of spec.ipv6Subnet.prefix
    external_prefixes: tuple[str, ...] = ()  # canonical CIDRs, duplicates dropped
    labels: tuple[tuple[str, str], ...] = ()  # sorted (key, value); always has NETWORK_LABEL

    @property
    def key(self) -> str:
        """The name: networks are cluster-scoped."""
        return self.name

    @property
    def prefixes(self) -> tuple[str, ...]:
        """Every prefix the network holds, whatever its type (for source classification)."""
        subnets = tuple(p for p in (self.ipv4_prefix, self.ipv6_prefix) if p is not None)
        return subnets + self.external_prefixes


@dataclass(frozen=True, slots=True)
class LabelRequirement:
    """One entry of matchExpressions."""

    key: str
    operator: str  # "In" | "NotIn" | "Exists" | "DoesNotExist"
    values: tuple[str, ...] = ()  # sorted, unique; empty for Exists and DoesNotExist

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Upstream semantics: NotIn also holds when the key is absent."""
        if self.operator == "In":
            return self.key in labels and labels[self.key] in self.values
        if self.operator == "NotIn":
            return self.key not in labels or labels[self.key] not in self.values
        if self.operator == "Exists":
            return self.key in labels
        return self.key not in labels


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A Kubernetes LabelSelector: every label and every expression must hold.

    The empty selector `{}` matches everything, as upstream. Upstream's other case, the nil
    selector that matches nothing, has no counterpart: an absent required selector is an
    error, and an absent optional one (ServiceRoutingPolicy's serviceSelector) means
    everything, so it is stored as the empty selector.
    """

    match_labels: tuple[tuple[str, str], ...] = ()  # sorted (key, value)
    match_expressions: tuple[LabelRequirement, ...] = ()

    @property
    def everything(self) -> bool:
        """True for the empty selector, which lets consumers skip matching altogether."""
        return not self.match_labels and not self.match_expressions

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels) and all(
            r.matches(labels) for r in self.match_expressions
        )


@dataclass(frozen=True, slots=True)
class BindingSelector:
    """Which pods or services a binding rule takes; every given criterion must hold, so the
    empty selector takes every object of the policy's kinds."""

    name: str | None = None
    namespace: str | None = None
    match_labels: tuple[tuple[str, str], ...] = ()  # sorted (key, value)

    def matches(self, namespace: str, name: str, labels: Mapping[str, str]) -> bool:
        return (
            (self.name is None or self.name == name)
            and (self.namespace is None or self.namespace == namespace)
            and all(labels.get(k) == v for k, v in self.match_labels)
        )


@dataclass(frozen=True, slots=True)
class BindingRule:
    network: str  # a Network's name
    selector: BindingSelector


@dataclass(frozen=True, slots=True)
class NetworkBindingPolicy:
    """Binds pods and/or services to networks. Rules keep their written order."""

    kind: ClassVar[str] = "NetworkBindingPolicy"

    name: str
    match_kinds: tuple[str, ...]  # spec.matchKind: unique, in MATCH_KINDS order
    rules: tuple[BindingRule, ...]

    @property
    def key(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class NetworkRoutingPolicy:
    """Peers the networks that src_selector picks to those that dest_selector picks, one way."""

    kind: ClassVar[str] = "NetworkRoutingPolicy"

    name: str
    src_selector: LabelSelector  # over Network labels
    dest_selector: LabelSelector  # over Network labels

    @property
    def key(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class ServiceRoutingPolicy:
    """Grants the source networks the services (not the pods) of the destination networks;
    service_selector narrows which services (the empty selector: all of them)."""

    kind: ClassVar[str] = "ServiceRoutingPolicy"

    name: str
    src_selector: LabelSelector  # over Network labels
    dest_selector: LabelSelector  # over Network labels
    service_selector: LabelSelector = LabelSelector()  # over Service labels

    @property
    def key(self) -> str:
        return self.name


LaceObject = Network | NetworkBindingPolicy | NetworkRoutingPolicy | ServiceRoutingPolicy


# --- Lace field helpers -----------------------------------------------------------------------


def _network_name(s: Subject, value: Any, field: str) -> str:
    """A Network's name: a DNS subdomain (as the API requires) that also fits a label value,
    since it becomes the value of NETWORK_LABEL."""
    name = req_str(s, value, field)
    if len(name) > 63 or not _DNS_SUBDOMAIN_RE.fullmatch(name):
        reason = "must be a DNS subdomain of at most 63 characters (lowercase, '-', '.')"
        s.fail(field, name, reason, "invalid_name")
    return name


def _label_key_problem(key: str) -> str | None:
    """Why `key` is not a qualified label key ([prefix/]name), or None if it is one."""
    prefix, slash, name = key.rpartition("/")
    if slash and not prefix:
        return "label key prefix must not be empty"
    if slash and (len(prefix) > 253 or not _DNS_SUBDOMAIN_RE.fullmatch(prefix)):
        return "label key prefix must be a DNS subdomain"
    if not name:
        return "label key name must not be empty"
    if len(name) > 63:
        return "label key name must be at most 63 characters"
    if not _LABEL_NAME_RE.fullmatch(name):
        return f"label key name must consist of {_LABEL_SYNTAX}"
    return None


def _label_value(s: Subject, value: Any, field: str) -> str:
    """A label value; "" is a valid one (and means "the label is set, to nothing")."""
    if not isinstance(value, str):
        s.fail(field, value, "must be a string", "invalid_type")
    if len(value) > 63:
        s.fail(field, value, "label value must be at most 63 characters", "invalid_label")
    if value and not _LABEL_NAME_RE.fullmatch(value):
        s.fail(field, value, f"label value must consist of {_LABEL_SYNTAX}", "invalid_label")
    return value


def _match_labels(s: Subject, value: Any, field: str) -> tuple[tuple[str, str], ...]:
    labels = as_mapping(s, value, field)
    for key, item in labels.items():
        if not isinstance(key, str):  # YAML allows `1: a` or `true: a`
            s.fail(field, key, "label key must be a string", "invalid_type")
        problem = _label_key_problem(key)
        if problem is not None:
            s.fail(field, key, problem, "invalid_label")  # upstream names the map, not the key
        _label_value(s, item, f'{field}["{key}"]')
    return sorted_pairs(labels)


def _requirement(s: Subject, value: Any, p: str) -> LabelRequirement:
    entry = as_mapping(s, value, p)
    key = req_str(s, entry.get("key"), f"{p}.key")
    problem = _label_key_problem(key)
    if problem is not None:
        s.fail(f"{p}.key", key, problem, "invalid_label")
    operator = req_enum(s, entry.get("operator"), f"{p}.operator", SELECTOR_OPERATORS)
    raw = as_list(s, entry.get("values"), f"{p}.values")
    if operator in ("In", "NotIn") and not raw:
        s.fail(f"{p}.values", None, f"required for operator {operator}", "missing_field")
    if operator in ("Exists", "DoesNotExist") and raw:
        s.fail(f"{p}.values", raw, f"not allowed for operator {operator}", "forbidden_field")
    values = {_label_value(s, v, f"{p}.values[{j}]") for j, v in enumerate(raw)}
    return LabelRequirement(key=key, operator=operator, values=tuple(sorted(values)))


def _label_selector(s: Subject, value: Any, p: str, *, required: bool = True) -> LabelSelector:
    """A LabelSelector; absent (or null) is an error if `required`, else the empty selector."""
    if value is None:
        if required:
            s.fail(p, None, "required (use {} to select everything)", "missing_field")
        return LabelSelector()
    selector = as_mapping(s, value, p)
    expressions = as_list(s, selector.get("matchExpressions"), f"{p}.matchExpressions")
    return LabelSelector(
        match_labels=_match_labels(s, selector.get("matchLabels"), f"{p}.matchLabels"),
        match_expressions=tuple(
            _requirement(s, item, f"{p}.matchExpressions[{i}]")
            for i, item in enumerate(expressions)
        ),
    )


# --- Network ----------------------------------------------------------------------------------

#: The prefix fields of spec, and the network types that may have them.
_PREFIX_FIELDS = {
    "ipv4Subnet": POD_NETWORK_TYPES,
    "ipv6Subnet": POD_NETWORK_TYPES,
    "externalPrefixes": ("external",),
}


def parse_network(obj: dict[str, Any]) -> Network:
    """A Network. NETWORK_LABEL is added to its labels; a user label with that key must
    already hold the network's name. Duplicate external prefixes (after canonicalization)
    are dropped: they are harmless, and the API server cannot see them as duplicates."""
    s, meta, _, name = object_metadata(obj, "Network", namespaced=False)
    _network_name(s, name, "metadata.name")
    labels = object_labels(s, meta)
    own = labels.get(NETWORK_LABEL)
    if own is not None and own != name:
        field = f'metadata.labels["{NETWORK_LABEL}"]'
        s.fail(field, own, f"must be the network's name ({name}) or absent", "invalid_value")
    spec = as_mapping(s, obj.get("spec"), "spec")
    net_type = req_enum(s, spec.get("type"), "spec.type", NETWORK_TYPES)
    for field, types in _PREFIX_FIELDS.items():
        value = spec.get(field)
        if net_type not in types and value not in (None, "", [], {}):
            s.fail(f"spec.{field}", value, f"not allowed for type {net_type}", "forbidden_field")

    ipv4 = _subnet(s, spec, "ipv4Subnet", 4)
    ipv6 = _subnet(s, spec, "ipv6Subnet", 6)
    external = as_cidrs(s, spec.get("externalPrefixes"), "spec.externalPrefixes")
    if net_type in POD_NETWORK_TYPES and ipv4 is None and ipv6 is None:
        reason = f"required for type {net_type} unless spec.ipv6Subnet.prefix is set"
        s.fail("spec.ipv4Subnet.prefix", None, reason, "missing_field")
    if net_type == "external" and not external:
        s.fail("spec.externalPrefixes", None, "required for type external", "missing_field")
    return Network(
        name=name,
        type=net_type,
        ipv4_prefix=ipv4,
        ipv6_prefix=ipv6,
        external_prefixes=tuple(dict.fromkeys(external)),
        labels=sorted_pairs({**labels, NETWORK_LABEL: name}),
    )


def _subnet(s: Subject, spec: dict[str, Any], field: str, version: int) -> str | None:
    """Canonical CIDR of spec.<field>.prefix, or None if there is none."""
    subnet = as_mapping(s, spec.get(field), f"spec.{field}")
    if subnet.get("prefix") in (None, ""):
        return None
    p = f"spec.{field}.prefix"
    cidr = as_cidr(s, subnet["prefix"], p)
    if (":" in cidr) != (version == 6):
        s.fail(p, subnet["prefix"], f"not an IPv{version} CIDR", "invalid_cidr")
    return cidr


# --- policies ---------------------------------------------------------------------------------


def parse_network_binding_policy(obj: dict[str, Any]) -> NetworkBindingPolicy:
    """A NetworkBindingPolicy. matchKind and rules must not be empty; a rule's selector is
    required (`{}` binds every pod or service of the policy's kinds)."""
    s, _, _, name = object_metadata(obj, "NetworkBindingPolicy", namespaced=False)
    spec = as_mapping(s, obj.get("spec"), "spec")

    raw_kinds = as_list(s, spec.get("matchKind"), "spec.matchKind")
    if not raw_kinds:
        s.fail("spec.matchKind", None, "required", "missing_field")
    kinds: list[str] = []
    for i, item in enumerate(raw_kinds):
        kind = req_enum(s, item, f"spec.matchKind[{i}]", MATCH_KINDS)
        if kind in kinds:
            s.fail(f"spec.matchKind[{i}]", item, "duplicate", "duplicate_value")
        kinds.append(kind)

    raw_rules = as_list(s, spec.get("rules"), "spec.rules")
    if not raw_rules:
        s.fail("spec.rules", None, "required", "missing_field")
    return NetworkBindingPolicy(
        name=name,
        match_kinds=tuple(k for k in MATCH_KINDS if k in kinds),
        rules=tuple(_binding_rule(s, item, f"spec.rules[{i}]") for i, item in enumerate(raw_rules)),
    )


def _binding_rule(s: Subject, value: Any, p: str) -> BindingRule:
    entry = as_mapping(s, value, p)
    network = _network_name(s, entry.get("network"), f"{p}.network")
    if entry.get("selector") is None:
        s.fail(f"{p}.selector", None, "required (use {} to select everything)", "missing_field")
    selector = as_mapping(s, entry["selector"], f"{p}.selector")
    name = opt_str(s, selector.get("name"), f"{p}.selector.name")
    if name is not None and (len(name) > 253 or not _DNS_SUBDOMAIN_RE.fullmatch(name)):
        s.fail(f"{p}.selector.name", name, "must be a DNS subdomain", "invalid_name")
    namespace = opt_str(s, selector.get("namespace"), f"{p}.selector.namespace")
    if namespace is not None and (len(namespace) > 63 or not _DNS_LABEL_RE.fullmatch(namespace)):
        s.fail(f"{p}.selector.namespace", namespace, "must be a DNS label", "invalid_name")
    return BindingRule(
        network=network,
        selector=BindingSelector(
            name=name,
            namespace=namespace,
            match_labels=_match_labels(s, selector.get("matchLabels"), f"{p}.selector.matchLabels"),
        ),
    )


def parse_network_routing_policy(obj: dict[str, Any]) -> NetworkRoutingPolicy:
    """A NetworkRoutingPolicy; both selectors are required."""
    s, _, _, name = object_metadata(obj, "NetworkRoutingPolicy", namespaced=False)
    spec = as_mapping(s, obj.get("spec"), "spec")
    return NetworkRoutingPolicy(
        name=name,
        src_selector=_label_selector(s, spec.get("srcSelector"), "spec.srcSelector"),
        dest_selector=_label_selector(s, spec.get("destSelector"), "spec.destSelector"),
    )


def parse_service_routing_policy(obj: dict[str, Any]) -> ServiceRoutingPolicy:
    """A ServiceRoutingPolicy; src and dest selectors are required, serviceSelector is not
    (absent: every service of the destination networks)."""
    s, _, _, name = object_metadata(obj, "ServiceRoutingPolicy", namespaced=False)
    spec = as_mapping(s, obj.get("spec"), "spec")
    return ServiceRoutingPolicy(
        name=name,
        src_selector=_label_selector(s, spec.get("srcSelector"), "spec.srcSelector"),
        dest_selector=_label_selector(s, spec.get("destSelector"), "spec.destSelector"),
        service_selector=_label_selector(
            s, spec.get("serviceSelector"), "spec.serviceSelector", required=False
        ),
    )


#: Parser of each Lace kind (all under LACE_GROUP_VERSION).
LACE_KINDS: Mapping[str, Callable[[dict[str, Any]], LaceObject]] = {
    "Network": parse_network,
    "NetworkBindingPolicy": parse_network_binding_policy,
    "NetworkRoutingPolicy": parse_network_routing_policy,
    "ServiceRoutingPolicy": parse_service_routing_policy,
}
