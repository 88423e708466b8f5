"""The resolved network graph: classification, peering, service grants, bindings."""

from __future__ import annotations

import ipaddress
import itertools
import random
from typing import Any

import pytest

from lace_proxy.model import parse_object
from lace_proxy.networks import NetworkGraph, ServiceRef

from ..lacekit import (
    HOST_LOCAL_PEERING,
    NETWORKS,
    NODE_METRICS_BINDING,
    UNDERLAY_WEB_SERVICES,
    l3,
    net,
    routing,
    service_binding,
    service_routing,
)


def graph(*objects: dict[str, Any]) -> NetworkGraph:
    return NetworkGraph(parse_object(o) for o in (*NETWORKS, *objects))  # type: ignore[misc]


WEB = ServiceRef("default", "web", {"app": "web"})
DB = ServiceRef("default", "db", {"app": "db"})


def test_no_networks_means_plain_kube_proxy() -> None:
    assert not NetworkGraph([]).enabled
    assert graph().enabled


@pytest.mark.parametrize(
    ("address", "local", "expected"),
    [
        ("10.250.0.1", True, "host-local"),  # locally originated, whatever its address
        ("10.251.0.11", False, "default"),
        ("fd00:251::11", False, "default"),
        ("10.253.0.5", False, "other"),
        ("10.250.0.2", False, "underlay"),  # longest prefix over internet's 0.0.0.0/0
        ("192.0.2.1", False, "internet"),
        ("2001:db8::1", False, "internet"),
    ],
)
def test_sources_are_classified(address: str, local: bool, expected: str) -> None:
    assert graph().classify(address, local=local) == expected


def test_without_external_or_host_local_networks_a_source_has_no_identity() -> None:
    g = NetworkGraph([parse_object(NETWORKS[0])])  # type: ignore[list-item]
    assert g.classify("192.0.2.1") is None
    assert g.classify("10.251.0.1", local=True) is None


def test_networks_are_isolated_until_peered_one_way() -> None:
    assert graph().allowed_sources(WEB, "default") == {"default"}
    g = graph(HOST_LOCAL_PEERING)
    assert g.peers("host-local") == {"default"}
    assert g.peers("default") == frozenset()  # one direction only
    assert g.allowed_sources(WEB, "default") == {"default", "host-local"}
    assert g.allowed_sources(WEB, "host-local") == {"host-local"}


def test_service_routing_grants_selected_services_only() -> None:
    g = graph(UNDERLAY_WEB_SERVICES)
    assert g.allowed_sources(WEB, "default") == {"default", "underlay"}
    assert g.allowed_sources(DB, "default") == {"default"}
    assert g.peers("underlay") == frozenset()  # services, not pods


def test_explicit_service_binding() -> None:
    g = graph(NODE_METRICS_BINDING)
    metrics = ServiceRef("kube-system", "lace-node-metrics", {})
    assert g.service_binding(metrics) == "internet"
    assert g.service_binding(WEB) is None
    # hostNetwork endpoints (node addresses) lie in no pod network, but in internet.
    assert g.contains("internet", "10.250.0.1")
    assert not g.contains("default", "10.250.0.1")
    assert g.contains("default", "10.251.0.11")


def test_pod_only_bindings_do_not_bind_services() -> None:
    pods_only = {
        **NODE_METRICS_BINDING,
        "metadata": {"name": "pods"},
        "spec": {**NODE_METRICS_BINDING["spec"], "matchKind": ["pod"]},
    }
    assert (
        graph(pods_only).service_binding(ServiceRef("kube-system", "lace-node-metrics", {})) is None
    )


def brute_force(g: NetworkGraph, ip: Any) -> str | None:
    """DESIGN §3's classification, literally: a pod network, else the longest external prefix."""
    best: tuple[int, str] | None = None
    for kind in (("l3", "l2"), ("external",)):
        for name, network in sorted(g.networks.items()):
            if network.type not in kind:
                continue
            for prefix in map(ipaddress.ip_network, network.prefixes):
                inside = prefix.version == ip.version and ip in prefix
                if inside and (best is None or prefix.prefixlen > best[0]):
                    best = (prefix.prefixlen, name)
        if best is not None:
            return best[1]
    return None


def test_layout_ranges_classify_every_address_as_the_graph_does() -> None:
    """The disjoint ranges the kernel matches agree with longest-prefix classification."""
    g = graph(
        net("campus", "external", externalPrefixes=["10.0.0.0/8", "fd00::/8"]),
        net("lab", "external", externalPrefixes=["10.250.0.128/25"]),
    )
    layout = g.layout()
    for family in (4, 6):
        ranges = [
            (int(ipaddress.ip_address(a)), int(ipaddress.ip_address(b)), n)
            for f, a, b, n in layout.ranges
            if f == family
        ]
        assert all(prev[1] < nxt[0] for prev, nxt in itertools.pairwise(ranges))  # disjoint
        bits = 32 if family == 4 else 128
        rng = random.Random(family)
        probes = [rng.getrandbits(bits) for _ in range(2000)]
        for a, b, _ in ranges:  # every boundary and its neighbours
            probes += [a, b, max(a - 1, 0), min(b + 1, 2**bits - 1)]
        make = ipaddress.IPv4Address if family == 4 else ipaddress.IPv6Address
        for value in probes:
            expected = brute_force(g, make(value))
            assert g.classify(str(make(value))) == expected, make(value)
            found = next((n for a, b, n in ranges if a <= value <= b), None)
            assert found == expected, make(value)
    assert layout.host_local == "host-local" and layout.host_peers == ()
    assert graph(HOST_LOCAL_PEERING).layout().host_peers == ("default",)
    assert NetworkGraph([]).layout().enabled is False


def test_bad_cross_object_input_becomes_conditions_with_deterministic_outcomes() -> None:
    g = graph(
        service_binding("to-nowhere", "nowhere", {"name": "web"}),
        routing("from-nothing", "no-such-network", "default"),
        service_routing("grants-nothing", "underlay", "no-such-network"),
        l3("shadow", "10.251.0.128/25"),  # inside default's 10.251.0.0/24
    )
    codes = {(c.code, c.subject) for c in g.conditions}
    assert codes == {
        ("unknown_network", "NetworkBindingPolicy/to-nowhere"),
        ("selects_nothing", "NetworkRoutingPolicy/from-nothing"),
        ("selects_nothing", "ServiceRoutingPolicy/grants-nothing"),
        ("overlapping_prefixes", "Network/default"),
    }
    overlap = next(c for c in g.conditions if c.code == "overlapping_prefixes")
    assert "belong to shadow" in overlap.message
    # The outcomes the messages promise: the rule is ignored, nothing is granted, and the
    # longer prefix classifies the overlap.
    assert g.service_binding(WEB) is None
    assert g.allowed_sources(WEB, "default") == {"default"}
    assert g.classify("10.251.0.200") == "shadow" and g.classify("10.251.0.5") == "default"
    assert graph().conditions == ()


def test_two_bindings_first_in_name_order_wins() -> None:
    g = graph(
        service_binding("b-internet", "internet", {"name": "web"}),
        service_binding("a-default", "default", {"name": "web"}),
    )
    assert g.service_bindings(WEB) == [("a-default", "default"), ("b-internet", "internet")]
    assert g.service_binding(WEB) == "default"


def test_affected_by_names_only_the_networks_a_policy_change_touches() -> None:
    base = graph()
    peered = graph(routing("other-to-default", "other", "default"))
    assert peered.affected_by(base) == {"default"}
    granted = graph(service_routing("underlay-other", "underlay", "other", {"app": "x"}))
    assert granted.affected_by(base) == {"other"}
    assert graph().affected_by(base) == set()
    # Bindings and prefixes can change any service's network: everything is affected.
    assert graph(NODE_METRICS_BINDING).affected_by(base) is None
    assert graph(l3("extra", "10.99.0.0/24")).affected_by(base) is None
