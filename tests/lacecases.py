"""The Lace resources' test cases: the examples of DESIGN.md §3 as manifests write them, and
every validation error the model reports (as mutations of them). Shared by the model's tests,
the CRDs' schema tests and the real apiserver's validation tests."""

from __future__ import annotations

import re
from typing import Any

import yaml

from lace_proxy.model import NETWORK_LABEL

# --- the examples of DESIGN.md §3, as they are written in manifests ----------------------------

DEFAULT_NETWORK = """
apiVersion: lace-cni.io/v1alpha1
kind: Network
metadata:
  name: default
  labels: {tier: pods}
spec:
  type: l3
  ipv4Subnet: {prefix: 10.244.0.0/16}
  ipv6Subnet: {prefix: "FD00:10:244::/56"}
"""

INTERNET = """
apiVersion: lace-cni.io/v1alpha1
kind: Network
metadata: {name: internet}
spec:
  type: external
  externalPrefixes: [0.0.0.0/0, "::/0"]
"""

HOST_LOCAL = """
apiVersion: lace-cni.io/v1alpha1
kind: Network
metadata: {name: host-local}
spec: {type: hostLocal}
"""

# The metrics endpoint is served by hostNetwork pods: its endpoints are node addresses, which
# lie in no pod network, so the service carries nothing until bound to a network that has them.
METRICS_BINDING = """
apiVersion: lace-cni.io/v1alpha1
kind: NetworkBindingPolicy
metadata: {name: lace-node-metrics}
spec:
  matchKind: [service]
  rules:
  - network: internet
    selector: {name: lace-node-metrics, namespace: lace-system}
"""

HOST_LOCAL_PEERING = """
apiVersion: lace-cni.io/v1alpha1
kind: NetworkRoutingPolicy
metadata: {name: host-local-to-default}
spec:
  srcSelector:
    matchLabels: {lace-cni.io/network: host-local}
  destSelector:
    matchLabels: {lace-cni.io/network: default}
"""

PUBLIC_SERVICES = """
apiVersion: lace-cni.io/v1alpha1
kind: ServiceRoutingPolicy
metadata: {name: internet-to-public-services}
spec:
  srcSelector:
    matchLabels: {lace-cni.io/network: internet}
  destSelector:
    matchExpressions:
    - {key: lace-cni.io/network, operator: In, values: [default, staging, default]}
  serviceSelector:
    matchLabels: {exposure: public}
    matchExpressions:
    - {key: example.com/internal, operator: DoesNotExist}
"""

#: Every valid example; test_crds.py checks that the CRDs accept them too.
EXAMPLES = {
    "default": DEFAULT_NETWORK,
    "internet": INTERNET,
    "host-local": HOST_LOCAL,
    "metrics-binding": METRICS_BINDING,
    "host-local-peering": HOST_LOCAL_PEERING,
    "public-services": PUBLIC_SERVICES,
}


def load(text: str) -> dict[str, Any]:
    return yaml.safe_load(text)


DELETE = object()


def mutated(text: str, path: str, value: Any) -> dict[str, Any]:
    """The example with the value at a path like "spec.rules[0].network" set (or DELETEd)."""
    obj = load(text)
    steps = [int(t) if t.isdigit() else t for t in re.findall(r"[^.\[\]]+", path)]
    target = obj
    for step in steps[:-1]:
        target = target[step]
    if value is DELETE:
        del target[steps[-1]]
    else:
        target[steps[-1]] = value
    return obj


# --- validation errors --------------------------------------------------------------------------

LONG = "n" * 64

# (example, path, new value or DELETE, error field, error value, code)
NETWORK_ERRORS = [
    (DEFAULT_NETWORK, "metadata.name", "Default", "metadata.name", "Default", "invalid_name"),
    (DEFAULT_NETWORK, "metadata.name", "a_b", "metadata.name", "a_b", "invalid_name"),
    (DEFAULT_NETWORK, "metadata.name", LONG, "metadata.name", LONG, "invalid_name"),
    (
        DEFAULT_NETWORK,
        "metadata.labels",
        {NETWORK_LABEL: "other"},
        f'metadata.labels["{NETWORK_LABEL}"]',
        "other",
        "invalid_value",
    ),
    (DEFAULT_NETWORK, "metadata.labels", {"t": 1}, 'metadata.labels["t"]', 1, "invalid_type"),
    (DEFAULT_NETWORK, "spec", [], "spec", [], "invalid_type"),
    (DEFAULT_NETWORK, "spec.type", DELETE, "spec.type", None, "missing_field"),
    (DEFAULT_NETWORK, "spec.type", "L3", "spec.type", "L3", "invalid_value"),
    (DEFAULT_NETWORK, "spec.type", 3, "spec.type", 3, "invalid_type"),
    (
        DEFAULT_NETWORK,
        "spec.ipv4Subnet",
        "10.0.0.0/8",
        "spec.ipv4Subnet",
        "10.0.0.0/8",
        "invalid_type",
    ),
    (
        DEFAULT_NETWORK,
        "spec.ipv4Subnet.prefix",
        "10.0.0.0",
        "spec.ipv4Subnet.prefix",
        "10.0.0.0",
        "invalid_cidr",
    ),
    (
        DEFAULT_NETWORK,
        "spec.ipv4Subnet.prefix",
        "fd00::/64",
        "spec.ipv4Subnet.prefix",
        "fd00::/64",
        "invalid_cidr",
    ),
    (
        DEFAULT_NETWORK,
        "spec.ipv6Subnet.prefix",
        "10.0.0.0/8",
        "spec.ipv6Subnet.prefix",
        "10.0.0.0/8",
        "invalid_cidr",
    ),
    (DEFAULT_NETWORK, "spec.ipv4Subnet.prefix", 10, "spec.ipv4Subnet.prefix", 10, "invalid_type"),
    (
        DEFAULT_NETWORK,
        "spec.externalPrefixes",
        ["0.0.0.0/0"],
        "spec.externalPrefixes",
        ["0.0.0.0/0"],
        "forbidden_field",
    ),
    (INTERNET, "spec.externalPrefixes", DELETE, "spec.externalPrefixes", None, "missing_field"),
    (INTERNET, "spec.externalPrefixes", [], "spec.externalPrefixes", None, "missing_field"),
    (INTERNET, "spec.externalPrefixes", "::/0", "spec.externalPrefixes", "::/0", "invalid_type"),
    (
        INTERNET,
        "spec.externalPrefixes",
        ["::/0", "x"],
        "spec.externalPrefixes[1]",
        "x",
        "invalid_cidr",
    ),
    (
        INTERNET,
        "spec.ipv4Subnet",
        {"prefix": "10.0.0.0/8"},
        "spec.ipv4Subnet",
        {"prefix": "10.0.0.0/8"},
        "forbidden_field",
    ),
    (
        HOST_LOCAL,
        "spec.ipv6Subnet",
        {"prefix": "fd00::/64"},
        "spec.ipv6Subnet",
        {"prefix": "fd00::/64"},
        "forbidden_field",
    ),
    (HOST_LOCAL, "spec.externalPrefixes", ["x"], "spec.externalPrefixes", ["x"], "forbidden_field"),
]

BINDING_ERRORS = [
    (METRICS_BINDING, "spec.matchKind", DELETE, "spec.matchKind", None, "missing_field"),
    (METRICS_BINDING, "spec.matchKind", [], "spec.matchKind", None, "missing_field"),
    (METRICS_BINDING, "spec.matchKind", "pod", "spec.matchKind", "pod", "invalid_type"),
    (METRICS_BINDING, "spec.matchKind", ["Pod"], "spec.matchKind[0]", "Pod", "invalid_value"),
    (METRICS_BINDING, "spec.matchKind", [1], "spec.matchKind[0]", 1, "invalid_type"),
    (
        METRICS_BINDING,
        "spec.matchKind",
        ["pod", "pod"],
        "spec.matchKind[1]",
        "pod",
        "duplicate_value",
    ),
    (METRICS_BINDING, "spec.rules", DELETE, "spec.rules", None, "missing_field"),
    (METRICS_BINDING, "spec.rules", [], "spec.rules", None, "missing_field"),
    (METRICS_BINDING, "spec.rules", {"a": 1}, "spec.rules", {"a": 1}, "invalid_type"),
    (METRICS_BINDING, "spec.rules[0]", "x", "spec.rules[0]", "x", "invalid_type"),
    (
        METRICS_BINDING,
        "spec.rules[0].network",
        DELETE,
        "spec.rules[0].network",
        None,
        "missing_field",
    ),
    (METRICS_BINDING, "spec.rules[0].network", 5, "spec.rules[0].network", 5, "invalid_type"),
    (
        METRICS_BINDING,
        "spec.rules[0].network",
        "Internet",
        "spec.rules[0].network",
        "Internet",
        "invalid_name",
    ),
    (
        METRICS_BINDING,
        "spec.rules[0].selector",
        DELETE,
        "spec.rules[0].selector",
        None,
        "missing_field",
    ),
    (
        METRICS_BINDING,
        "spec.rules[0].selector",
        "all",
        "spec.rules[0].selector",
        "all",
        "invalid_type",
    ),
    (
        METRICS_BINDING,
        "spec.rules[0].selector.name",
        "Bad_Name",
        "spec.rules[0].selector.name",
        "Bad_Name",
        "invalid_name",
    ),
    (
        METRICS_BINDING,
        "spec.rules[0].selector.namespace",
        "a.b",
        "spec.rules[0].selector.namespace",
        "a.b",
        "invalid_name",
    ),
    (
        METRICS_BINDING,
        "spec.rules[0].selector.namespace",
        ["a"],
        "spec.rules[0].selector.namespace",
        ["a"],
        "invalid_type",
    ),
    (
        METRICS_BINDING,
        "spec.rules[0].selector.matchLabels",
        {"app": 1},
        'spec.rules[0].selector.matchLabels["app"]',
        1,
        "invalid_type",
    ),
    (
        METRICS_BINDING,
        "spec.rules[0].selector.matchLabels",
        {"bad key": "x"},
        "spec.rules[0].selector.matchLabels",
        "bad key",
        "invalid_label",
    ),
    (
        METRICS_BINDING,
        "spec.rules[0].selector.matchLabels",
        {"app": "-x"},
        'spec.rules[0].selector.matchLabels["app"]',
        "-x",
        "invalid_label",
    ),
]

EXPRS = "spec.srcSelector.matchExpressions"
EXPR = f"{EXPRS}[0]"
ROUTING_ERRORS = [
    (HOST_LOCAL_PEERING, "spec", DELETE, "spec.srcSelector", None, "missing_field"),
    (HOST_LOCAL_PEERING, "spec.srcSelector", DELETE, "spec.srcSelector", None, "missing_field"),
    (HOST_LOCAL_PEERING, "spec.destSelector", None, "spec.destSelector", None, "missing_field"),
    (HOST_LOCAL_PEERING, "spec.destSelector", "x", "spec.destSelector", "x", "invalid_type"),
    (
        HOST_LOCAL_PEERING,
        "spec.srcSelector.matchLabels",
        ["a=b"],
        "spec.srcSelector.matchLabels",
        ["a=b"],
        "invalid_type",
    ),
    (
        HOST_LOCAL_PEERING,
        "spec.srcSelector.matchLabels",
        {1: "a"},
        "spec.srcSelector.matchLabels",
        1,
        "invalid_type",
    ),
    (
        HOST_LOCAL_PEERING,
        "spec.srcSelector.matchLabels",
        {"a": "v" * 64},
        'spec.srcSelector.matchLabels["a"]',
        "v" * 64,
        "invalid_label",
    ),
    (
        HOST_LOCAL_PEERING,
        "spec.srcSelector.matchExpressions",
        {"key": "a"},
        "spec.srcSelector.matchExpressions",
        {"key": "a"},
        "invalid_type",
    ),
    (HOST_LOCAL_PEERING, EXPRS, [["a"]], EXPR, ["a"], "invalid_type"),
    *[
        (
            HOST_LOCAL_PEERING,
            EXPRS,
            [{"key": key, "operator": "Exists"}],
            f"{EXPR}.key",
            value,
            code,
        )
        for key, value, code in [
            (None, None, "missing_field"),
            ("", None, "missing_field"),
            (7, 7, "invalid_type"),
            ("a/b/c", "a/b/c", "invalid_label"),
            ("/a", "/a", "invalid_label"),
            ("a/", "a/", "invalid_label"),
            ("Example.com/a", "Example.com/a", "invalid_label"),
            (f"{'p' * 254}/a", f"{'p' * 254}/a", "invalid_label"),
            (LONG, LONG, "invalid_label"),
            ("-a", "-a", "invalid_label"),
        ]
    ],
    (HOST_LOCAL_PEERING, EXPRS, [{"key": "a"}], f"{EXPR}.operator", None, "missing_field"),
    (
        HOST_LOCAL_PEERING,
        EXPRS,
        [{"key": "a", "operator": "in"}],
        f"{EXPR}.operator",
        "in",
        "invalid_value",
    ),
    (
        HOST_LOCAL_PEERING,
        EXPRS,
        [{"key": "a", "operator": "In"}],
        f"{EXPR}.values",
        None,
        "missing_field",
    ),
    (
        HOST_LOCAL_PEERING,
        EXPRS,
        [{"key": "a", "operator": "NotIn", "values": []}],
        f"{EXPR}.values",
        None,
        "missing_field",
    ),
    (
        HOST_LOCAL_PEERING,
        EXPRS,
        [{"key": "a", "operator": "Exists", "values": ["b"]}],
        f"{EXPR}.values",
        ["b"],
        "forbidden_field",
    ),
    (
        HOST_LOCAL_PEERING,
        EXPRS,
        [{"key": "a", "operator": "DoesNotExist", "values": ["b"]}],
        f"{EXPR}.values",
        ["b"],
        "forbidden_field",
    ),
    (
        HOST_LOCAL_PEERING,
        EXPRS,
        [{"key": "a", "operator": "In", "values": "b"}],
        f"{EXPR}.values",
        "b",
        "invalid_type",
    ),
    (
        HOST_LOCAL_PEERING,
        EXPRS,
        [{"key": "a", "operator": "In", "values": ["b", 1]}],
        f"{EXPR}.values[1]",
        1,
        "invalid_type",
    ),
    (
        HOST_LOCAL_PEERING,
        EXPRS,
        [{"key": "a", "operator": "In", "values": ["a b"]}],
        f"{EXPR}.values[0]",
        "a b",
        "invalid_label",
    ),
]

SERVICE_ROUTING_ERRORS = [
    (PUBLIC_SERVICES, "spec.srcSelector", DELETE, "spec.srcSelector", None, "missing_field"),
    (PUBLIC_SERVICES, "spec.destSelector", DELETE, "spec.destSelector", None, "missing_field"),
    (PUBLIC_SERVICES, "spec.serviceSelector", "x", "spec.serviceSelector", "x", "invalid_type"),
    (
        PUBLIC_SERVICES,
        "spec.serviceSelector.matchExpressions[0].operator",
        "Exist",
        "spec.serviceSelector.matchExpressions[0].operator",
        "Exist",
        "invalid_value",
    ),
    (
        PUBLIC_SERVICES,
        "spec.destSelector.matchExpressions[0].values",
        [],
        "spec.destSelector.matchExpressions[0].values",
        None,
        "missing_field",
    ),
]


ALL_ERRORS = NETWORK_ERRORS + BINDING_ERRORS + ROUTING_ERRORS + SERVICE_ROUTING_ERRORS


def _valid_variants() -> dict[str, dict[str, Any]]:
    l2 = mutated(DEFAULT_NETWORK, "spec.type", "l2")
    del l2["spec"]["ipv4Subnet"]
    labels = {
        "matchLabels": {"a": "", "example.com/B_c.d-9": "Z"},
        "matchExpressions": [{"key": "x", "operator": "NotIn", "values": [""]}],
    }
    return {
        **{name: load(text) for name, text in EXAMPLES.items()},
        "l2-ipv6-only": l2,
        "host-bits-set": mutated(DEFAULT_NETWORK, "spec.ipv4Subnet.prefix", "10.244.1.7/16"),
        "select-everything": mutated(HOST_LOCAL_PEERING, "spec.srcSelector", {}),
        "label-syntax": mutated(HOST_LOCAL_PEERING, "spec.destSelector", labels),
        "all-services": mutated(PUBLIC_SERVICES, "spec.serviceSelector", DELETE),
    }


VALID = _valid_variants()


#: (kind, field, value) of rejections the model makes that the schemas cannot: OpenAPI cannot
#: check map keys, nor bound the two parts of a label key separately, and a CRD's schema may not
#: restrict metadata.labels (the API server checks their syntax itself).
SCHEMA_GAPS = [
    ("Network", 'metadata.labels["lace-cni.io/network"]', "other"),
    ("Network", 'metadata.labels["t"]', 1),
    ("NetworkBindingPolicy", "spec.rules[0].selector.matchLabels", "bad key"),
    ("NetworkRoutingPolicy", "spec.srcSelector.matchLabels", 1),
    ("NetworkRoutingPolicy", "spec.srcSelector.matchExpressions[0].key", "n" * 64),
    ("NetworkRoutingPolicy", "spec.srcSelector.matchExpressions[0].key", f"{'p' * 254}/a"),
]
