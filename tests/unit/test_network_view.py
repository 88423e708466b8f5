"""Services bound to networks, and their slices narrowed to the bound network."""

from __future__ import annotations

from typing import Any

from lace_proxy.model import parse_object
from lace_proxy.networks import NetworkView

from ..lacekit import HOST_LOCAL_PEERING, NETWORKS, NODE_METRICS_BINDING
from .tablekit import ep, eps, svc


def view(*objects: dict[str, Any]) -> NetworkView:
    return NetworkView(parse_object(o) for o in (*NETWORKS, *objects))  # type: ignore[misc]


def addresses(slices: list[Any]) -> list[str]:
    return [e.addresses[0] for sl in slices for e in sl.endpoints]


def test_without_networks_slices_pass_untouched() -> None:
    v = NetworkView()
    slices = [eps(ep("10.251.0.11"), ep("10.250.0.1"))]
    assert v.narrow(svc(), slices) is slices
    assert v.bindings == {}


def test_an_unbound_service_takes_its_endpoints_pod_network() -> None:
    v = view(HOST_LOCAL_PEERING)
    narrowed = v.narrow(svc(), [eps(ep("10.251.0.11"), ep("10.250.0.1"), ep("10.253.0.5"))])
    assert addresses(narrowed) == ["10.251.0.11"]
    binding = v.bindings["default/web"]
    assert binding.network == "default"
    assert binding.sources == {"default", "host-local"}
    assert binding.excluded == (
        ("10.250.0.1", "outside network default"),
        ("10.253.0.5", "outside network default"),
    )


def test_host_network_endpoints_carry_nothing_until_bound_to_internet() -> None:
    metrics = svc("lace-node-metrics", namespace="kube-system")
    slices = [eps(ep("10.250.0.1"), service="lace-node-metrics", namespace="kube-system")]
    v = view()
    assert addresses(v.narrow(metrics, slices)) == []
    binding = v.bindings["kube-system/lace-node-metrics"]
    assert binding.network is None and binding.sources == frozenset()
    assert binding.excluded == (("10.250.0.1", "in no network; bind the service to one"),)
    v = view(NODE_METRICS_BINDING)
    assert addresses(v.narrow(metrics, slices)) == ["10.250.0.1"]
    assert v.bindings["kube-system/lace-node-metrics"].network == "internet"
