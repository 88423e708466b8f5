"""A network or policy change reaches the table only for the services it affects."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from lace_proxy.dataplane.nft import Nft
from lace_proxy.dataplane.nftables.backend import NftablesBackend
from lace_proxy.dataplane.nftables.settings import NftablesSettings
from lace_proxy.model import parse_object
from lace_proxy.proxier import Proxier
from lace_proxy.table import ServiceTable

from ..lacekit import NETWORKS, NODE_METRICS_BINDING, net, service_binding
from .tablekit import ep, eps, svc


def proxier() -> Proxier:
    # The dataplane is never called here: these tests stop before any sync.
    backend = NftablesBackend(NftablesSettings(), Nft())
    return Proxier(ServiceTable("n1"), backend, sources=["files"])


def lace(p: Proxier, obj: dict[str, Any]) -> None:
    p.lace_upserted(parse_object(obj))  # type: ignore[arg-type]


def test_only_affected_services_are_recomputed() -> None:
    p = proxier()
    for i in range(5):
        p.service_upserted(svc(f"s{i}", ips=(f"10.96.0.{i + 1}",)))
        p.slice_upserted(eps(ep(f"10.251.0.{i + 10}"), service=f"s{i}"))
    metrics = svc("lace-node-metrics", ips=("10.96.1.1",), namespace="kube-system")
    p.service_upserted(metrics)
    p.slice_upserted(eps(ep("10.250.0.1"), service="lace-node-metrics", namespace="kube-system"))
    for obj in NETWORKS:
        lace(p, obj)
    p.table.build()
    p.table.commit()
    assert p.table.pending == 0
    lace(p, net("unrelated", "l3", ipv4Subnet={"prefix": "10.199.0.0/24"}))
    assert p.table.pending == 0  # no service's binding changed
    lace(p, NODE_METRICS_BINDING)
    assert p.table.pending == 1  # only the service it binds
    ((_, new),) = p.table.build().updated
    assert [b.ip for b in new.cluster_backends] == ["10.250.0.1"]


def test_conditions_are_logged_once_and_exported(caplog: pytest.LogCaptureFixture) -> None:
    p = proxier()
    p.service_upserted(svc("web", ips=("10.96.0.1",), labels=(("app", "web"),)))
    p.slice_upserted(eps(ep("10.251.0.10"), service="web"))
    for obj in NETWORKS:
        lace(p, obj)
    with caplog.at_level(logging.WARNING, logger="lace_proxy.proxier"):
        lace(p, service_binding("b-internet", "internet", {"name": "web"}))
        lace(p, service_binding("a-nowhere", "nowhere", {"name": "web"}))
        lace(p, service_binding("a-default", "default", {"name": "web"}))
    warned = [r.getMessage() for r in caplog.records]
    assert sum("unknown_network" in m for m in warned) == 1, warned
    assert sum("two_bindings" in m for m in warned) == 1, warned
    assert p.networks.bindings["default/web"].network == "default"
    assert p.networks.bindings["default/web"].bound_by == "a-default"
    exposition = p.metrics.exposition()[0].decode()
    assert 'lace_proxy_network_conditions{code="two_bindings"} 1.0' in exposition
    assert 'lace_proxy_network_conditions{code="unknown_network"} 1.0' in exposition
    p.lace_deleted("NetworkBindingPolicy", "a-nowhere")
    p.lace_deleted("NetworkBindingPolicy", "b-internet")
    exposition = p.metrics.exposition()[0].decode()
    assert 'lace_proxy_network_conditions{code="two_bindings"} 0.0' in exposition
    assert 'lace_proxy_network_conditions{code="unknown_network"} 0.0' in exposition


def backends(p: Proxier, service: str = "default/web") -> list[str]:
    p.table.build()
    p.table.commit()
    return sorted(
        b.ip for plan in p.table.plans() if plan.service == service for b in plan.cluster_backends
    )


def test_fqdn_slices_are_passed_over_by_the_network_model() -> None:
    p = proxier()
    p.service_upserted(svc("web"))
    p.slice_upserted(eps(ep("example.com"), name="web-fqdn", address_type="FQDN"))
    p.slice_upserted(eps(ep("10.251.0.10")))
    for obj in NETWORKS:
        lace(p, obj)
    assert p.networks.bindings["default/web"].network == "default"
    assert backends(p) == ["10.251.0.10"]


def test_the_network_of_an_unbound_service_does_not_depend_on_arrival_order() -> None:
    def bound(order: list[str]) -> tuple[str | None, list[str]]:
        p = proxier()
        for obj in NETWORKS:
            lace(p, obj)
        p.service_upserted(svc("web"))
        slices = {
            "a": eps(ep("10.251.0.10"), name="web-a"),
            "b": eps(ep("10.253.0.10"), ep("10.253.0.11"), name="web-b"),
        }
        for name in order:
            p.slice_upserted(slices[name])
        binding = p.networks.bindings["default/web"]
        return binding.network, [c.code for c in binding.conditions]

    # `other` holds two endpoints, `default` one: other wins, in either order, and says so.
    assert bound(["a", "b"]) == bound(["b", "a"]) == ("other", ["split_endpoints"])


def test_turning_the_model_off_restores_slices_of_a_service_that_was_away() -> None:
    p = proxier()
    for obj in NETWORKS:
        lace(p, obj)
    p.service_upserted(svc("web"))
    p.slice_upserted(eps(ep("10.251.0.10"), ep("10.250.0.1")))
    assert backends(p) == ["10.251.0.10"]
    p.service_deleted("default/web")
    for obj in NETWORKS:
        p.lace_deleted(obj["kind"], obj["metadata"]["name"])
    p.service_upserted(svc("web"))
    assert backends(p) == ["10.250.0.1", "10.251.0.10"]  # plain kube-proxy: both


def test_a_slice_moving_to_another_service_rebinds_the_one_it_left() -> None:
    p = proxier()
    for obj in NETWORKS:
        lace(p, obj)
    p.service_upserted(svc("web"))
    p.service_upserted(svc("db", ips=("10.96.0.11",)))
    p.slice_upserted(eps(ep("10.251.0.10"), name="shared"))
    assert p.networks.bindings["default/web"].network == "default"
    p.slice_upserted(eps(ep("10.251.0.10"), name="shared", service="db"))
    assert p.networks.bindings["default/web"].network is None
    assert p.networks.bindings["default/db"].network == "default"
