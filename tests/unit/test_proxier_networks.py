"""A network or policy change reaches the table only for the services it affects."""

from __future__ import annotations

from typing import Any

from lace_proxy.dataplane.nft import Nft
from lace_proxy.dataplane.nftables import NftablesBackend, NftablesSettings
from lace_proxy.model import parse_object
from lace_proxy.proxier import Proxier
from lace_proxy.table import ServiceTable

from .tablekit import ep, eps, svc
from .test_network_graph import NETWORKS, NODE_METRICS_BINDING, net


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
