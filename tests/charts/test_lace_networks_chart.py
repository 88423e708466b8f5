"""charts/lace-networks: the Network objects and the host-local peering it declares, as the
proxy's model, its network graph and the CRDs' schemas see them."""

from __future__ import annotations

import copy
from typing import Any

import helm_python
import pytest
import yaml

from lace_proxy.model import (
    NETWORK_LABEL,
    Network,
    NetworkRoutingPolicy,
    ValidationError,
    parse_object,
)
from lace_proxy.networks import NetworkGraph, ServiceRef

from .conftest import (
    DUAL_STACK,
    EXTRA,
    HOST_LOCAL,
    IPV6_ONLY,
    NETWORKS_CHART,
    ROUTED,
    ROUTED_TO_OTHER,
    VALUE_SETS,
    crd_errors,
    lint_findings,
    of_kind,
    one,
    refusal,
    render,
)

WEB = ServiceRef("default", "web", {"app": "web"})


def networks(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in of_kind(objects, "Network")}


def graph(objects: list[dict[str, Any]]) -> NetworkGraph:
    return NetworkGraph(parse_object(o) for o in objects)  # type: ignore[misc]


def selects(selector: dict[str, Any]) -> str:
    """The one network a peering selector picks by the implicit label."""
    assert selector == {"matchLabels": {NETWORK_LABEL: selector["matchLabels"][NETWORK_LABEL]}}
    return selector["matchLabels"][NETWORK_LABEL]


# --- lint -----------------------------------------------------------------------------------


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_lints_clean(values: dict[str, Any]) -> None:
    assert lint_findings(NETWORKS_CHART, values) == []


# --- the objects ------------------------------------------------------------------------------


def test_defaults(networks_chart: helm_python.Chart) -> None:
    objects = render(networks_chart)
    assert sorted(o["kind"] for o in objects) == ["Network", "Network"]
    nets = networks(objects)
    assert {name: n["spec"] for name, n in nets.items()} == {
        "default": {"type": "l3", "ipv4Subnet": {"prefix": "10.244.0.0/16"}},
        "internet": {"type": "external", "externalPrefixes": ["0.0.0.0/0", "::/0"]},
    }
    for n in nets.values():
        assert n["apiVersion"] == "lace-cni.io/v1alpha1"
        assert "namespace" not in n["metadata"]  # cluster-scoped
        assert n["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"


def test_crds_only_leaves_the_model_off(networks_chart: helm_python.Chart) -> None:
    """The README's first step of a migration: the CRDs and no Network, so lace-proxy starts
    as plain kube-proxy (no Network objects: no network model)."""
    objects = render(
        networks_chart, {"defaultNetwork": {"enabled": False}, "internet": {"enabled": False}}
    )
    assert objects == []
    assert not NetworkGraph([]).layout().enabled


def test_prefixes(networks_chart: helm_python.Chart) -> None:
    default = networks(render(networks_chart, DUAL_STACK))["default"]
    assert default["spec"] == {
        "type": "l3",
        "ipv4Subnet": {"prefix": "10.244.0.0/16"},
        "ipv6Subnet": {"prefix": "fd00:10:244::/56"},
    }
    nets = networks(render(networks_chart, IPV6_ONLY))
    assert list(nets) == ["pods"]  # the internet is off
    assert nets["pods"]["spec"] == {"type": "l2", "ipv6Subnet": {"prefix": "fd00:10:244::/56"}}
    assert nets["pods"]["metadata"]["labels"]["tier"] == "pods"


def test_a_pod_network_needs_a_prefix(networks_chart: helm_python.Chart) -> None:
    values = {"defaultNetwork": {"ipv4Subnet": {"prefix": ""}}}
    with pytest.raises(helm_python.HelmRenderError, match=r"ipv4Subnet\.prefix or ipv6Subnet"):
        render(networks_chart, values)


def test_host_local_network(networks_chart: helm_python.Chart) -> None:
    objects = render(networks_chart, HOST_LOCAL)
    assert networks(objects)["host-local"]["spec"] == {"type": "hostLocal"}
    assert not of_kind(objects, "NetworkRoutingPolicy")  # declared, not peered
    renamed = render(networks_chart, {"hostLocalNetwork": {"enabled": True, "name": "nodes"}})
    assert networks(renamed)["nodes"]["spec"] == {"type": "hostLocal"}


@pytest.mark.parametrize(
    ("values", "src", "dest", "name"),
    [
        (ROUTED, "host-local", "default", "host-local-to-default"),
        (ROUTED_TO_OTHER, "host-local", "other", "host-local-to-other"),
        (
            {
                "defaultNetwork": {"name": "pods"},
                "hostLocalNetwork": {"enabled": True, "name": "nodes"},
                "hostLocalRouting": {"enabled": True, "name": "nodes-in"},
            },
            "nodes",
            "pods",
            "nodes-in",
        ),
    ],
)
def test_host_local_routing(
    networks_chart: helm_python.Chart, values: dict[str, Any], src: str, dest: str, name: str
) -> None:
    policy = one(render(networks_chart, values), "NetworkRoutingPolicy")
    assert policy["apiVersion"] == "lace-cni.io/v1alpha1"
    assert policy["metadata"]["name"] == name
    assert selects(policy["spec"]["srcSelector"]) == src
    assert selects(policy["spec"]["destSelector"]) == dest


def test_routing_needs_the_host_local_network(networks_chart: helm_python.Chart) -> None:
    # (helm lint does not report it: in lint mode Helm's `fail` only logs.)
    with pytest.raises(helm_python.HelmRenderError) as info:
        render(networks_chart, {"hostLocalRouting": {"enabled": True}})
    assert "hostLocalRouting.enabled needs hostLocalNetwork.enabled" in str(info.value)


def test_routing_needs_a_destination(networks_chart: helm_python.Chart) -> None:
    values = {**ROUTED, "defaultNetwork": {"enabled": False}}
    with pytest.raises(helm_python.HelmRenderError, match=r"hostLocalRouting\.dest is required"):
        render(networks_chart, values)


def test_extra_networks(networks_chart: helm_python.Chart) -> None:
    nets = networks(render(networks_chart, EXTRA))
    assert list(nets) == ["default", "internet", "corp", "storage"]
    assert nets["corp"]["spec"] == EXTRA["extraNetworks"][0]["spec"]
    assert nets["corp"]["metadata"]["labels"]["zone"] == "a"
    assert nets["storage"]["spec"] == EXTRA["extraNetworks"][1]["spec"]
    assert all(n["metadata"]["labels"]["team"] == "net" for n in nets.values())


def test_network_names_are_unique(networks_chart: helm_python.Chart) -> None:
    values = {"extraNetworks": [{"name": "internet", "spec": {"type": "hostLocal"}}]}
    with pytest.raises(helm_python.HelmRenderError, match='Network "internet" is declared twice'):
        render(networks_chart, values)


def test_crds_stay_in_crds(networks_chart: helm_python.Chart) -> None:
    """Helm installs crds/ before the templates; the templates render no CRD."""
    names = sorted(yaml.safe_load(crd["data"])["metadata"]["name"] for crd in networks_chart.crds)
    assert names == [
        "networkbindingpolicies.lace-cni.io",
        "networkroutingpolicies.lace-cni.io",
        "networks.lace-cni.io",
        "serviceroutingpolicies.lace-cni.io",
    ]
    for values in VALUE_SETS.values():
        assert not of_kind(render(networks_chart, values), "CustomResourceDefinition")


# --- the proxy's model and the CRDs accept them ----------------------------------------------


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_rendered_objects_are_valid(
    networks_chart: helm_python.Chart, values: dict[str, Any]
) -> None:
    objects = render(networks_chart, values)
    assert objects
    for obj in objects:
        parsed = parse_object(obj)  # raises ValidationError, naming the field
        assert parsed.kind == obj["kind"] and parsed.name == obj["metadata"]["name"]
        assert crd_errors(obj) == []
    g = graph(objects)
    # Nothing wrong across the objects either (overlapping networks, empty selectors).
    assert g.conditions == ()


def test_parsed_networks(networks_chart: helm_python.Chart) -> None:
    parsed = [parse_object(o) for o in render(networks_chart, {**ROUTED, **DUAL_STACK})]
    nets = {p.name: p for p in parsed if isinstance(p, Network)}
    assert nets["default"].type == "l3"
    assert nets["default"].prefixes == ("10.244.0.0/16", "fd00:10:244::/56")
    assert nets["internet"].external_prefixes == ("0.0.0.0/0", "::/0")
    assert nets["host-local"].type == "hostLocal" and nets["host-local"].prefixes == ()
    [policy] = [p for p in parsed if isinstance(p, NetworkRoutingPolicy)]
    assert policy.src_selector.matches(dict(nets["host-local"].labels))
    assert not policy.src_selector.matches(dict(nets["default"].labels))


def test_the_graph_peers_host_local_only_when_routed(networks_chart: helm_python.Chart) -> None:
    plain = graph(render(networks_chart))
    assert plain.host_local is None  # no host-local network: node traffic has no identity
    assert plain.classify("10.244.3.4") == "default"
    assert plain.classify("8.8.8.8") == "internet"
    assert plain.classify("2001:db8::1") == "internet"

    unrouted = graph(render(networks_chart, HOST_LOCAL))
    assert unrouted.classify("10.250.0.1", local=True) == "host-local"
    assert unrouted.peers("host-local") == frozenset()
    assert unrouted.layout().host_peers == ()
    assert "host-local" not in unrouted.allowed_sources(WEB, "default")

    routed = graph(render(networks_chart, ROUTED))
    assert routed.classify("10.250.0.1", local=True) == "host-local"
    assert routed.peers("host-local") == {"default"}
    assert routed.layout().host_peers == ("default",)
    assert routed.allowed_sources(WEB, "default") == {"default", "host-local"}
    # One way: the default network gains nothing towards the nodes, the internet nothing at all.
    assert routed.peers("default") == frozenset() and routed.peers("internet") == frozenset()

    other = graph(render(networks_chart, ROUTED_TO_OTHER))
    assert other.peers("host-local") == {"other"}
    assert other.layout().host_peers == ("other",)
    assert "host-local" not in other.allowed_sources(WEB, "default")


def test_a_peering_to_a_network_declared_elsewhere(networks_chart: helm_python.Chart) -> None:
    """dest may name a network of another release; until it exists the policy grants nothing."""
    values = {**ROUTED, "hostLocalRouting": {"enabled": True, "dest": "later"}}
    objects = render(networks_chart, values)
    for obj in objects:
        assert crd_errors(obj) == []
    g = graph(objects)
    assert g.peers("host-local") == frozenset()
    assert [(c.code, c.subject) for c in g.conditions] == [
        ("selects_nothing", "NetworkRoutingPolicy/host-local-to-later")
    ]


def test_bad_objects_are_refused_by_crd_and_model(networks_chart: helm_python.Chart) -> None:
    """The checks above can fail: mutations of rendered objects are refused by both."""
    objects = render(networks_chart, ROUTED)
    network = networks(objects)["default"]
    policy = one(objects, "NetworkRoutingPolicy")

    bogus = copy.deepcopy(network)
    bogus["spec"]["type"] = "bogus"
    no_prefix = copy.deepcopy(network)
    del no_prefix["spec"]["ipv4Subnet"]
    external_with_subnet = copy.deepcopy(network)
    external_with_subnet["spec"]["type"] = "external"
    no_src = copy.deepcopy(policy)
    del no_src["spec"]["srcSelector"]
    bad_label = copy.deepcopy(policy)
    bad_label["spec"]["destSelector"]["matchLabels"][NETWORK_LABEL] = "-bad-"

    for obj in (bogus, no_prefix, external_with_subnet, no_src, bad_label):
        assert crd_errors(obj) != [], obj
        with pytest.raises(ValidationError):
            parse_object(obj)


# --- the values schema -----------------------------------------------------------------------

BAD_VALUES = {
    "default-external": ({"defaultNetwork": {"type": "external"}}, "/defaultNetwork/type"),
    "default-bad-cidr": (
        {"defaultNetwork": {"ipv4Subnet": {"prefix": "10.244.0.0"}}},
        "/defaultNetwork/ipv4Subnet/prefix",
    ),
    "default-v6-in-v4": (
        {"defaultNetwork": {"ipv4Subnet": {"prefix": "fd00::/64"}}},
        "/defaultNetwork/ipv4Subnet/prefix",
    ),
    "default-uppercase": ({"defaultNetwork": {"name": "Default"}}, "/defaultNetwork/name"),
    "unknown-key": ({"hostLocal": {"enabled": True}}, "hostLocal"),
    "unknown-nested-key": ({"internet": {"prefixes": ["0.0.0.0/0"]}}, "prefixes"),
    "extra-bogus-type": (
        {"extraNetworks": [{"name": "x", "spec": {"type": "bogus"}}]},
        "/extraNetworks/0/spec/type",
    ),
    "extra-l3-without-prefix": (
        {"extraNetworks": [{"name": "x", "spec": {"type": "l3"}}]},
        "/extraNetworks/0/spec",
    ),
    "extra-without-spec": ({"extraNetworks": [{"name": "x"}]}, "spec"),
    "implicit-label": (
        {"internet": {"labels": {NETWORK_LABEL: "elsewhere"}}},
        "lace-cni.io/network",
    ),
    "routing-dest-name": ({"hostLocalRouting": {"dest": "Not A Name"}}, "/hostLocalRouting/dest"),
}


@pytest.mark.parametrize(("values", "where"), BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_bad_values_are_refused(
    networks_chart: helm_python.Chart, values: dict[str, Any], where: str
) -> None:
    assert where in refusal(networks_chart, values)


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_good_values_pass_the_schema(
    networks_chart: helm_python.Chart, values: dict[str, Any]
) -> None:
    networks_chart.validate_schema(values)
