"""Builders for Lace network objects (lace-cni.io/v1alpha1) as the sources deliver them."""

from __future__ import annotations

from typing import Any

GV = "lace-cni.io/v1alpha1"


def net(name: str, type: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": GV,
        "kind": "Network",
        "metadata": {"name": name},
        "spec": {"type": type, **spec},
    }


def l3(name: str, *prefixes: str) -> dict[str, Any]:
    """A pod network with one IPv4 and optionally one IPv6 prefix."""
    spec: dict[str, Any] = {"ipv4Subnet": {"prefix": prefixes[0]}}
    if len(prefixes) > 1:
        spec["ipv6Subnet"] = {"prefix": prefixes[1]}
    return net(name, "l3", **spec)


def external(name: str, *prefixes: str) -> dict[str, Any]:
    return net(name, "external", externalPrefixes=list(prefixes))


def selector(network: str) -> dict[str, Any]:
    """A selector over Network labels picking one network by name."""
    return {"matchLabels": {"lace-cni.io/network": network}}


def routing(name: str, src: str, dest: str) -> dict[str, Any]:
    """A NetworkRoutingPolicy peering network `src` to network `dest`."""
    return {
        "apiVersion": GV,
        "kind": "NetworkRoutingPolicy",
        "metadata": {"name": name},
        "spec": {"srcSelector": selector(src), "destSelector": selector(dest)},
    }


def service_routing(
    name: str, src: str, dest: str, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """A ServiceRoutingPolicy granting `src` the services of `dest` (those with `labels`)."""
    spec: dict[str, Any] = {"srcSelector": selector(src), "destSelector": selector(dest)}
    if labels is not None:
        spec["serviceSelector"] = {"matchLabels": labels}
    return {
        "apiVersion": GV,
        "kind": "ServiceRoutingPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }


def service_binding(name: str, network: str, selector: dict[str, Any]) -> dict[str, Any]:
    """A NetworkBindingPolicy binding the services `selector` picks to `network`."""
    return {
        "apiVersion": GV,
        "kind": "NetworkBindingPolicy",
        "metadata": {"name": name},
        "spec": {"matchKind": ["service"], "rules": [{"network": network, "selector": selector}]},
    }


#: A small world for the graph, view and proxier tests: two pod networks, two external ones
#: and host-local; and three policies over it.
NETWORKS = [
    net(
        "default",
        "l3",
        ipv4Subnet={"prefix": "10.251.0.0/24"},
        ipv6Subnet={"prefix": "fd00:251::/64"},
    ),
    net("other", "l3", ipv4Subnet={"prefix": "10.253.0.0/24"}),
    net("internet", "external", externalPrefixes=["0.0.0.0/0", "::/0"]),
    net("underlay", "external", externalPrefixes=["10.250.0.0/24"]),
    net("host-local", "hostLocal"),
]
HOST_LOCAL_PEERING = {
    "apiVersion": GV,
    "kind": "NetworkRoutingPolicy",
    "metadata": {"name": "host-to-default"},
    "spec": {"srcSelector": selector("host-local"), "destSelector": selector("default")},
}
UNDERLAY_WEB_SERVICES = {
    "apiVersion": GV,
    "kind": "ServiceRoutingPolicy",
    "metadata": {"name": "underlay-web"},
    "spec": {
        "srcSelector": selector("underlay"),
        "destSelector": selector("default"),
        "serviceSelector": {"matchLabels": {"app": "web"}},
    },
}
NODE_METRICS_BINDING = {
    "apiVersion": GV,
    "kind": "NetworkBindingPolicy",
    "metadata": {"name": "node-metrics"},
    "spec": {
        "matchKind": ["service"],
        "rules": [
            {
                "network": "internet",
                "selector": {"name": "lace-node-metrics", "namespace": "kube-system"},
            }
        ],
    },
}
