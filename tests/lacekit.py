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
