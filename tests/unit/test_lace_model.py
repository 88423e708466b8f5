"""Parsing, validation, selector matching and loading of the Lace resources (model/lace.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from lace_proxy.model import (
    LACE_GROUP_VERSION,
    LACE_KINDS,
    NETWORK_LABEL,
    BindingRule,
    BindingSelector,
    LabelRequirement,
    LabelSelector,
    Network,
    NetworkBindingPolicy,
    NetworkRoutingPolicy,
    ServiceRoutingPolicy,
    ValidationError,
    load_manifests,
    parse_network,
    parse_network_binding_policy,
    parse_network_routing_policy,
    parse_object,
    parse_service_routing_policy,
)

from ..helpers import assert_junk_is_rejected_cleanly
from ..lacecases import (
    ALL_ERRORS,
    DEFAULT_NETWORK,
    DELETE,
    EXAMPLES,
    HOST_LOCAL,
    HOST_LOCAL_PEERING,
    INTERNET,
    METRICS_BINDING,
    PUBLIC_SERVICES,
    load,
    mutated,
)


def rejected(obj: Any) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        parse_object(obj)
    return info.value


def net_selector(*names: str) -> LabelSelector:
    """Selects networks by name, as the implicit label lets every selector do."""
    if len(names) == 1:
        return LabelSelector(match_labels=((NETWORK_LABEL, names[0]),))
    return LabelSelector(match_expressions=(LabelRequirement(NETWORK_LABEL, "In", names),))


# --- valid objects ------------------------------------------------------------------------------


def test_default_pod_network() -> None:
    network = parse_network(load(DEFAULT_NETWORK))
    assert network == Network(
        name="default",
        type="l3",
        ipv4_prefix="10.244.0.0/16",
        ipv6_prefix="fd00:10:244::/56",
        labels=((NETWORK_LABEL, "default"), ("tier", "pods")),
    )
    assert (network.kind, network.key) == ("Network", "default")
    assert network.prefixes == ("10.244.0.0/16", "fd00:10:244::/56")


def test_internet_network() -> None:
    network = parse_network(load(INTERNET))
    assert network == Network(
        name="internet",
        type="external",
        external_prefixes=("0.0.0.0/0", "::/0"),
        labels=((NETWORK_LABEL, "internet"),),
    )
    assert network.prefixes == ("0.0.0.0/0", "::/0")


def test_host_local_network_has_no_prefixes() -> None:
    network = parse_network(load(HOST_LOCAL))
    assert network == Network(
        name="host-local", type="hostLocal", labels=((NETWORK_LABEL, "host-local"),)
    )
    assert network.prefixes == ()


def test_single_stack_l2_network_and_canonical_prefix() -> None:
    obj = mutated(DEFAULT_NETWORK, "spec.type", "l2")
    del obj["spec"]["ipv6Subnet"]
    obj["spec"]["ipv4Subnet"]["prefix"] = "10.244.7.1/16"  # host bits: cleared, as Go does
    network = parse_network(obj)
    assert (network.type, network.ipv4_prefix, network.ipv6_prefix) == ("l2", "10.244.0.0/16", None)


@pytest.mark.parametrize("empty", [None, {}, {"prefix": ""}, {"prefix": None}])
def test_empty_subnet_is_no_subnet(empty: Any) -> None:
    network = parse_network(mutated(DEFAULT_NETWORK, "spec.ipv4Subnet", empty))
    assert (network.ipv4_prefix, network.ipv6_prefix) == (None, "fd00:10:244::/56")


def test_empty_prefix_fields_are_allowed_on_any_type() -> None:
    obj = mutated(HOST_LOCAL, "spec.externalPrefixes", [])
    obj["spec"]["ipv4Subnet"] = {}
    assert parse_network(obj).prefixes == ()


def test_duplicate_external_prefixes_are_dropped() -> None:
    obj = mutated(INTERNET, "spec.externalPrefixes", ["10.0.0.0/8", "::/0", "10.1.0.0/8"])
    assert parse_network(obj).external_prefixes == ("10.0.0.0/8", "::/0")


def test_network_label_may_be_written_out() -> None:
    obj = mutated(INTERNET, "metadata.labels", {NETWORK_LABEL: "internet"})
    assert parse_network(obj).labels == ((NETWORK_LABEL, "internet"),)


def test_metrics_service_bound_to_internet() -> None:
    policy = parse_network_binding_policy(load(METRICS_BINDING))
    assert policy == NetworkBindingPolicy(
        name="lace-node-metrics",
        match_kinds=("service",),
        rules=(
            BindingRule(
                network="internet",
                selector=BindingSelector(name="lace-node-metrics", namespace="lace-system"),
            ),
        ),
    )
    assert (policy.kind, policy.key) == ("NetworkBindingPolicy", "lace-node-metrics")


def test_binding_kinds_are_canonical_and_rules_keep_their_order() -> None:
    obj = mutated(METRICS_BINDING, "spec.matchKind", ["service", "pod"])
    obj["spec"]["rules"] = [
        {"network": "staging", "selector": {"namespace": "staging", "matchLabels": {"a": "b"}}},
        {"network": "default", "selector": {}},
    ]
    policy = parse_network_binding_policy(obj)
    assert policy.match_kinds == ("pod", "service")
    assert policy.rules == (
        BindingRule("staging", BindingSelector(namespace="staging", match_labels=(("a", "b"),))),
        BindingRule("default", BindingSelector()),
    )


def test_host_local_peering() -> None:
    policy = parse_network_routing_policy(load(HOST_LOCAL_PEERING))
    assert policy == NetworkRoutingPolicy(
        name="host-local-to-default",
        src_selector=net_selector("host-local"),
        dest_selector=net_selector("default"),
    )
    assert (policy.kind, policy.key) == ("NetworkRoutingPolicy", "host-local-to-default")


def test_service_routing_policy() -> None:
    policy = parse_service_routing_policy(load(PUBLIC_SERVICES))
    assert policy == ServiceRoutingPolicy(
        name="internet-to-public-services",
        src_selector=net_selector("internet"),
        dest_selector=net_selector("default", "staging"),  # values sorted, duplicate dropped
        service_selector=LabelSelector(
            match_labels=(("exposure", "public"),),
            match_expressions=(LabelRequirement("example.com/internal", "DoesNotExist"),),
        ),
    )
    assert (policy.kind, policy.key) == ("ServiceRoutingPolicy", "internet-to-public-services")


@pytest.mark.parametrize("absent", [DELETE, None])
def test_absent_service_selector_means_every_service(absent: Any) -> None:
    policy = parse_service_routing_policy(mutated(PUBLIC_SERVICES, "spec.serviceSelector", absent))
    assert policy.service_selector == LabelSelector()
    assert policy.service_selector.everything


def test_empty_selectors_select_every_network() -> None:
    obj = mutated(HOST_LOCAL_PEERING, "spec.srcSelector", {})
    obj["spec"]["destSelector"] = {"matchLabels": None, "matchExpressions": []}
    policy = parse_network_routing_policy(obj)
    assert policy.src_selector == policy.dest_selector == LabelSelector()


def test_label_syntax_accepts_what_kubernetes_accepts() -> None:
    selector = {
        "matchLabels": {"a": "", "example.com/B_c.d-9": "Z", "x" * 63: "y" * 63},
        "matchExpressions": [{"key": f"{'p' * 253}/n", "operator": "NotIn", "values": [""]}],
    }
    policy = parse_network_routing_policy(mutated(HOST_LOCAL_PEERING, "spec.srcSelector", selector))
    assert dict(policy.src_selector.match_labels)["a"] == ""
    assert policy.src_selector.match_expressions[0].values == ("",)


def test_parse_object_dispatches_lace_kinds() -> None:
    expected = {
        "default": Network,
        "internet": Network,
        "host-local": Network,
        "metrics-binding": NetworkBindingPolicy,
        "host-local-peering": NetworkRoutingPolicy,
        "public-services": ServiceRoutingPolicy,
    }
    for name, text in EXAMPLES.items():
        obj = parse_object(load(text))
        assert type(obj) is expected[name]
        assert LACE_KINDS[obj.kind](load(text)) == obj
    assert LACE_GROUP_VERSION == "lace-cni.io/v1alpha1"


def test_parse_object_rejects_other_versions_of_lace_kinds() -> None:
    error = rejected(mutated(INTERNET, "apiVersion", "lace-cni.io/v1"))
    assert (error.kind, error.object, error.field, error.code) == (
        "Network",
        "internet",
        "apiVersion",
        "unsupported_kind",
    )
    assert "lace-cni.io/v1alpha1 Network" in error.reason


# --- validation errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "path", "new", "field", "value", "code"),
    ALL_ERRORS,
    ids=[f"{load(case[0])['kind']}-{case[3]}-{case[5]}" for case in ALL_ERRORS],
)
def test_validation_errors(
    text: str, path: str, new: Any, field: str, value: Any, code: str
) -> None:
    base = load(text)
    error = rejected(mutated(text, path, new))
    name = new if field == "metadata.name" else base["metadata"]["name"]
    assert (error.kind, error.object, error.field, error.value, error.code) == (
        base["kind"],
        name,
        field,
        value,
        code,
    )
    assert error.reason


def test_pod_network_needs_a_subnet() -> None:
    obj = mutated(DEFAULT_NETWORK, "spec.ipv4Subnet", DELETE)
    del obj["spec"]["ipv6Subnet"]
    error = rejected(obj)
    assert (error.field, error.value, error.code) == (
        "spec.ipv4Subnet.prefix",
        None,
        "missing_field",
    )
    assert str(error) == (
        "Network default: spec.ipv4Subnet.prefix: "
        "required for type l3 unless spec.ipv6Subnet.prefix is set"
    )


def test_forbidden_prefix_is_reported_before_its_syntax() -> None:
    error = rejected(mutated(HOST_LOCAL, "spec.ipv4Subnet", {"prefix": "junk"}))
    assert str(error) == (
        'Network host-local: spec.ipv4Subnet={"prefix": "junk"}: not allowed for type hostLocal'
    )


@pytest.mark.parametrize("kind", sorted(LACE_KINDS))
def test_missing_name(kind: str) -> None:
    error = rejected({"apiVersion": LACE_GROUP_VERSION, "kind": kind, "metadata": {}})
    assert (error.kind, error.object, error.field, error.code) == (
        kind,
        "",
        "metadata.name",
        "missing_field",
    )


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_junk_anywhere_gives_validation_error_or_a_model(name: str) -> None:
    """No wrong type at any place may escape as TypeError/KeyError/AttributeError."""
    base = load(EXAMPLES[name])
    assert_junk_is_rejected_cleanly(base)


# --- selector matching --------------------------------------------------------------------------


def test_match_labels() -> None:
    selector = LabelSelector(match_labels=(("app", "web"), ("tier", "")))
    assert selector.matches({"app": "web", "tier": "", "other": "x"})
    assert not selector.matches({"app": "web"})  # "" is a value: the label must be there
    assert not selector.matches({"app": "db", "tier": ""})
    assert not selector.everything


@pytest.mark.parametrize(
    ("operator", "values", "web", "db", "absent"),
    [
        ("In", ("web", "api"), True, False, False),
        ("NotIn", ("web", "api"), False, True, True),
        ("Exists", (), True, True, False),
        ("DoesNotExist", (), False, False, True),
    ],
)
def test_each_operator(
    operator: str, values: tuple[str, ...], web: bool, db: bool, absent: bool
) -> None:
    selector = LabelSelector(match_expressions=(LabelRequirement("app", operator, values),))
    assert selector.matches({"app": "web"}) is web
    assert selector.matches({"app": "db"}) is db
    assert selector.matches({"other": "web"}) is absent


def test_all_terms_must_hold() -> None:
    selector = LabelSelector(
        match_labels=(("tier", "front"),),
        match_expressions=(
            LabelRequirement("app", "In", ("web",)),
            LabelRequirement("canary", "DoesNotExist"),
        ),
    )
    assert selector.matches({"tier": "front", "app": "web"})
    assert not selector.matches({"tier": "front", "app": "web", "canary": "1"})
    assert not selector.matches({"tier": "back", "app": "web"})


def test_empty_selector_matches_everything() -> None:
    assert LabelSelector().everything
    assert LabelSelector().matches({})
    assert LabelSelector().matches({"any": "thing"})


def test_selectors_pick_networks_by_their_implicit_label() -> None:
    networks = [parse_network(load(text)) for text in (DEFAULT_NETWORK, INTERNET, HOST_LOCAL)]
    policy = parse_network_routing_policy(load(HOST_LOCAL_PEERING))
    pick = [n.name for n in networks if policy.dest_selector.matches(dict(n.labels))]
    assert pick == ["default"]
    services = parse_service_routing_policy(load(PUBLIC_SERVICES))
    assert [n.name for n in networks if services.src_selector.matches(dict(n.labels))] == [
        "internet"
    ]


def test_binding_selector_matching() -> None:
    selector = BindingSelector(name="web", namespace="shop", match_labels=(("app", "web"),))
    assert selector.matches("shop", "web", {"app": "web", "x": "y"})
    assert not selector.matches("other", "web", {"app": "web"})
    assert not selector.matches("shop", "api", {"app": "web"})
    assert not selector.matches("shop", "web", {})
    assert BindingSelector(namespace="shop").matches("shop", "anything", {})
    assert BindingSelector().matches("any", "thing", {})


# --- loading --------------------------------------------------------------------------------


def test_load_manifests_collects_lace_kinds(tmp_path: Path) -> None:
    (tmp_path / "a-networks.yaml").write_text(
        f"{DEFAULT_NETWORK}\n---\n{INTERNET}\n---\n{HOST_LOCAL}"
    )
    (tmp_path / "b-policies.yaml").write_text(
        f"{METRICS_BINDING}\n---\n{HOST_LOCAL_PEERING}\n---\n{PUBLIC_SERVICES}"
    )
    # the API's list form, whose items inherit apiVersion and kind; one item is a duplicate
    (tmp_path / "c-list.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": LACE_GROUP_VERSION,
                "kind": "NetworkList",
                "items": [
                    {
                        "metadata": {"name": "staging"},
                        "spec": {"type": "l2", "ipv4Subnet": {"prefix": "10.8.0.0/16"}},
                    },
                    {"metadata": {"name": "internet"}, "spec": {"type": "hostLocal"}},
                    {"metadata": {"name": "broken"}, "spec": {"type": "l3"}},
                ],
            }
        )
    )
    result = load_manifests(tmp_path)
    assert sorted(result.lace) == [
        ("Network", "default"),
        ("Network", "host-local"),
        ("Network", "internet"),
        ("Network", "staging"),
        ("NetworkBindingPolicy", "lace-node-metrics"),
        ("NetworkRoutingPolicy", "host-local-to-default"),
        ("ServiceRoutingPolicy", "internet-to-public-services"),
    ]
    assert result.lace["Network", "internet"] == parse_network(load(INTERNET))
    assert result.origins["Network", "internet"] == str(tmp_path / "a-networks.yaml")
    assert result.origins["ServiceRoutingPolicy", "internet-to-public-services"] == str(
        tmp_path / "b-policies.yaml"
    )
    assert (result.services, result.slices, result.nodes) == ({}, {}, {})
    assert [(e.kind, e.object, e.field, e.code, e.source) for e in result.rejected] == [
        ("Network", "internet", "", "duplicate", str(tmp_path / "c-list.yaml")),
        (
            "Network",
            "broken",
            "spec.ipv4Subnet.prefix",
            "missing_field",
            str(tmp_path / "c-list.yaml"),
        ),
    ]
