"""Parsing, validation and manifest loading of the model (lace_proxy.model)."""

from __future__ import annotations

import copy
import ipaddress
import itertools
import logging
import pickle
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from lace_proxy.model import (
    LB_SOURCE_RANGES_ANNOTATION,
    Endpoint,
    EndpointPort,
    EndpointSlice,
    Node,
    Rejections,
    Service,
    ServiceCIDR,
    ServicePort,
    ValidationError,
    load_manifests,
    parse_endpoint_slice,
    parse_node,
    parse_object,
    parse_service,
    parse_service_cidr,
)
from lace_proxy.model import parse as parse_module
from lace_proxy.model.fields import Subject, canonical_ip
from lace_proxy.model.service import (
    IPVS_SCHEDULER_ANNOTATION,
    IPVS_SCHEDULERS,
    KUBE_ROUTER_SCHEDULER_ANNOTATION,
)

from ..helpers import annotated_service, api_service_cidr, assert_junk_is_rejected_cleanly

# --- realistic objects, as `kubectl get -o yaml` shows them -------------------------------------

DUAL_STACK_LB = """
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: shop
  labels:
    app: web
    tier: frontend
  annotations:
    service.beta.kubernetes.io/load-balancer-source-ranges: "192.0.2.0/24"  # field wins
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10, "2001:DB8:0::A"]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  ports:
  - name: http
    port: 80
    targetPort: 8080
    nodePort: 30080
  - name: dns
    protocol: UDP
    port: 53
    targetPort: dns
    nodePort: 30053
  - name: dns
    protocol: TCP
    port: 53
    targetPort: dns
    nodePort: 30054
  externalIPs: [198.51.100.7, "2001:db8:0:0:0:0:0:ff"]
  loadBalancerSourceRanges: [" 10.1.2.3/8 ", "2001:DB8::/32"]
  externalTrafficPolicy: Local
  internalTrafficPolicy: Local
  trafficDistribution: PreferClose
  sessionAffinity: ClientIP
  sessionAffinityConfig:
    clientIP:
      timeoutSeconds: 300
  healthCheckNodePort: 32000
status:
  loadBalancer:
    ingress:
    - ip: 203.0.113.5
      ipMode: VIP
    - hostname: lb.example.com
    - ip: 203.0.113.6
      ipMode: Proxy
    - ip: "2001:DB8::5"
"""

FULL_SLICE = """
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-abc12
  namespace: shop
  labels:
    kubernetes.io/service-name: web
    endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io
  annotations:
    endpoints.kubernetes.io/last-change-trigger-time: "2024-05-06T07:08:09.5Z"
addressType: IPv6
endpoints:
- addresses: ["2001:DB8:0::1"]
  nodeName: node-a
  zone: zone-a
  hints:
    forZones: [{name: zone-a}]
    forNodes: [{name: node-a}]
- addresses: ["2001:db8::2"]
  conditions: {ready: false, serving: true, terminating: true}
  nodeName: node-b
  zone: zone-b
  hints: {forZones: []}
- addresses: ["2001:db8::3"]
  conditions: {ready: false}
ports:
- name: http
  port: 8080
  protocol: TCP
- name: all
  port: null
- port: 53
  protocol: UDP
"""

FULL_NODE = """
apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels:
    topology.kubernetes.io/zone: zone-a
    kubernetes.io/hostname: node-a
  deletionTimestamp: "2024-05-06T07:08:09Z"
spec:
  podCIDR: 10.244.1.0/24
  podCIDRs: [10.244.1.0/24, "FD00:10:244:1::/64"]
status:
  addresses:
  - {type: InternalIP, address: 192.168.1.10}
  - {type: InternalIP, address: "FD00::0:10"}
  - {type: Hostname, address: node-a}
  - {type: InternalDNS, address: node-a.example.internal}
"""


def load(text: str) -> dict[str, Any]:
    return yaml.safe_load(text)


def service(**spec: Any) -> dict[str, Any]:
    """A minimal valid Service; keyword arguments override spec fields."""
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "clusterIP": "10.96.0.10",
            "ports": [{"name": "http", "port": 80}, {"name": "https", "port": 443}],
        },
    }
    obj["spec"].update(spec)
    return obj


def endpoint_slice(address_type: str = "IPv4", **fields: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "web-x1",
            "namespace": "default",
            "labels": {"kubernetes.io/service-name": "web"},
        },
        "addressType": address_type,
        "endpoints": [{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.2"]}],
        "ports": [{"name": "http", "port": 8080}],
    }
    obj.update(fields)
    return obj


def node(**fields: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}
    obj.update(fields)
    return obj


def rejected(parse: Callable[[Any], object], obj: Any) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        parse(obj)
    return info.value


# --- Service --------------------------------------------------------------------------------


def test_dual_stack_load_balancer_with_all_fields() -> None:
    svc = parse_service(load(DUAL_STACK_LB))
    assert svc == Service(
        namespace="shop",
        name="web",
        type="LoadBalancer",
        cluster_ips=("10.96.0.10", "2001:db8::a"),
        ports=(
            ServicePort(name="http", protocol="TCP", port=80, target_port=8080, node_port=30080),
            ServicePort(name="dns", protocol="UDP", port=53, target_port="dns", node_port=30053),
            ServicePort(name="dns", protocol="TCP", port=53, target_port="dns", node_port=30054),
        ),
        external_ips=("198.51.100.7", "2001:db8::ff"),
        # hostname-only and ipMode Proxy entries give no VIP
        lb_ingress_ips=("203.0.113.5", "2001:db8::5"),
        # padding stripped, host bits cleared; the annotation is ignored when the field is set
        lb_source_ranges=("10.0.0.0/8", "2001:db8::/32"),
        external_traffic_policy="Local",
        internal_traffic_policy="Local",
        traffic_distribution="PreferClose",
        session_affinity=True,
        affinity_timeout=300,
        health_check_node_port=32000,
        headless=False,
        proxy_name=None,
        labels=(("app", "web"), ("tier", "frontend")),
    )
    assert svc.key == "shop/web"
    assert svc.proxied


def test_service_defaults() -> None:
    obj = {"metadata": {"name": "db"}, "spec": {"clusterIP": "10.0.0.5", "ports": [{"port": 5432}]}}
    assert parse_service(obj) == Service(
        namespace="default",
        name="db",
        type="ClusterIP",
        cluster_ips=("10.0.0.5",),
        ports=(ServicePort(name="", protocol="TCP", port=5432, target_port=None, node_port=0),),
    )


def test_empty_strings_mean_defaults() -> None:
    svc = parse_service(
        service(
            type="",
            externalTrafficPolicy="",
            internalTrafficPolicy="",
            sessionAffinity="",
            ports=[{"name": "", "protocol": "", "port": 80, "targetPort": ""}],
        )
    )
    assert (svc.type, svc.external_traffic_policy, svc.internal_traffic_policy) == (
        "ClusterIP",
        "Cluster",
        "Cluster",
    )
    assert svc.ports == (ServicePort("", "TCP", 80, None),)
    assert not svc.session_affinity


def test_cluster_ip_is_the_fallback_for_cluster_ips() -> None:
    assert parse_service(service(clusterIP="FD00::0:1")).cluster_ips == ("fd00::1",)
    assert parse_service(service(clusterIP="10.0.0.9", clusterIPs=[])).cluster_ips == ("10.0.0.9",)
    both = parse_service(service(clusterIP="10.0.0.9", clusterIPs=["10.0.0.8"]))
    assert both.cluster_ips == ("10.0.0.8",)


def test_no_cluster_ip_yet() -> None:
    svc = parse_service(service(clusterIP=None))
    assert svc.cluster_ips == ()
    assert not svc.headless


@pytest.mark.parametrize(
    "spec",
    [
        {"clusterIP": "None"},
        {"clusterIP": "None", "clusterIPs": ["None"]},
        {"clusterIPs": ["None"]},
    ],
)
def test_headless_by_cluster_ip(spec: dict[str, Any]) -> None:
    obj = service()
    obj["spec"] = {"ports": [{"port": 80}], **spec}
    svc = parse_service(obj)
    assert svc.headless
    assert svc.cluster_ips == ()
    assert not svc.proxied


def test_headless_by_label_keeps_cluster_ips() -> None:
    obj = service()
    obj["metadata"]["labels"] = {"service.kubernetes.io/headless": ""}
    svc = parse_service(obj)
    assert svc.headless
    assert svc.cluster_ips == ("10.96.0.10",)
    assert not svc.proxied


def test_external_name_has_no_cluster_ips_even_if_set() -> None:
    svc = parse_service(
        service(type="ExternalName", externalName="db.example.com", clusterIP="not-an-ip")
    )
    assert svc.type == "ExternalName"
    assert svc.cluster_ips == ()
    assert not svc.headless
    assert not svc.proxied


def test_proxy_name_label_hands_the_service_to_another_proxy() -> None:
    obj = service()
    obj["metadata"]["labels"] = {"service.kubernetes.io/service-proxy-name": "other", "a": "b"}
    svc = parse_service(obj)
    assert svc.proxy_name == "other"
    assert svc.labels == (("a", "b"), ("service.kubernetes.io/service-proxy-name", "other"))
    assert not svc.proxied


def test_load_balancer_source_ranges_from_annotation_when_field_empty() -> None:
    obj = service(type="LoadBalancer", loadBalancerSourceRanges=[])
    obj["metadata"]["annotations"] = {
        LB_SOURCE_RANGES_ANNOTATION: " 10.1.0.0/16, 2001:DB8::/48 ,192.168.0.1/24"
    }
    obj["status"] = {"loadBalancer": {"ingress": [{"hostname": "a.example"}]}}
    svc = parse_service(obj)
    assert svc.lb_source_ranges == ("10.1.0.0/16", "2001:db8::/48", "192.168.0.0/24")
    assert svc.lb_ingress_ips == ()


@pytest.mark.parametrize("value", ["", "   "])
def test_blank_source_ranges_annotation_is_no_restriction(value: str) -> None:
    obj = service(type="LoadBalancer")
    obj["metadata"]["annotations"] = {LB_SOURCE_RANGES_ANNOTATION: value}
    assert parse_service(obj).lb_source_ranges == ()


@pytest.mark.parametrize(
    ("svc_type", "external_ips", "policy"),
    [
        ("ClusterIP", [], "Cluster"),  # not reachable from outside: kube-proxy ignores Local
        ("ClusterIP", ["192.0.2.1"], "Local"),
        ("NodePort", [], "Local"),
        ("LoadBalancer", [], "Local"),
    ],
)
def test_external_traffic_policy_applies_only_to_reachable_services(
    svc_type: str, external_ips: list[str], policy: str
) -> None:
    svc = parse_service(
        service(type=svc_type, externalIPs=external_ips, externalTrafficPolicy="Local")
    )
    assert svc.external_traffic_policy == policy


@pytest.mark.parametrize(
    ("svc_type", "policy", "expected"),
    [("LoadBalancer", "Local", 31000), ("LoadBalancer", "Cluster", 0), ("NodePort", "Local", 0)],
)
def test_health_check_node_port_only_for_local_load_balancers(
    svc_type: str, policy: str, expected: int
) -> None:
    svc = parse_service(
        service(type=svc_type, externalTrafficPolicy=policy, healthCheckNodePort=31000)
    )
    assert svc.health_check_node_port == expected


def test_affinity_timeout_default_and_ignored_without_client_ip() -> None:
    assert parse_service(service(sessionAffinity="ClientIP")).affinity_timeout == 10800
    not_sticky = parse_service(
        service(sessionAffinity="None", sessionAffinityConfig={"clientIP": {"timeoutSeconds": 0}})
    )
    assert not not_sticky.session_affinity
    assert not_sticky.affinity_timeout == 10800


def test_annotation_names() -> None:
    assert "mh" in IPVS_SCHEDULERS
    assert IPVS_SCHEDULER_ANNOTATION == "lace-proxy.lace-cni.io/ipvs-scheduler"
    assert KUBE_ROUTER_SCHEDULER_ANNOTATION == "kube-router.io/service.scheduler"


@pytest.mark.parametrize("scheduler", IPVS_SCHEDULERS)
def test_ipvs_scheduler_from_annotation(scheduler: str) -> None:
    svc = parse_service(annotated_service({IPVS_SCHEDULER_ANNOTATION: scheduler}))
    assert svc.ipvs_scheduler == scheduler


@pytest.mark.parametrize("scheduler", ["sh", "mh"])
def test_ipvs_scheduler_falls_back_to_kube_routers_annotation(scheduler: str) -> None:
    svc = parse_service(annotated_service({KUBE_ROUTER_SCHEDULER_ANNOTATION: scheduler}))
    assert svc.ipvs_scheduler == scheduler


@pytest.mark.parametrize("kube_router", ["sh", "fifo", ""])
def test_lace_proxy_scheduler_annotation_wins_over_kube_routers(kube_router: str) -> None:
    """kube-router's annotation is not even checked when lace-proxy's is set."""
    obj = annotated_service(
        {KUBE_ROUTER_SCHEDULER_ANNOTATION: kube_router, IPVS_SCHEDULER_ANNOTATION: "lc"}
    )
    assert parse_service(obj).ipvs_scheduler == "lc"


def test_empty_lace_proxy_scheduler_annotation_lets_kube_routers_apply() -> None:
    obj = annotated_service({IPVS_SCHEDULER_ANNOTATION: "", KUBE_ROUTER_SCHEDULER_ANNOTATION: "dh"})
    assert parse_service(obj).ipvs_scheduler == "dh"


@pytest.mark.parametrize("annotations", [None, {}, {IPVS_SCHEDULER_ANNOTATION: ""}])
def test_no_scheduler_annotation_means_the_configured_default(annotations: Any) -> None:
    assert parse_service(annotated_service(annotations)).ipvs_scheduler is None
    assert Service("default", "web", "ClusterIP", (), ()).ipvs_scheduler is None


def test_invalid_scheduler_message_names_the_annotation() -> None:
    error = rejected(parse_service, annotated_service({IPVS_SCHEDULER_ANNOTATION: "fifo"}))
    assert error.code == "invalid_scheduler"
    assert str(error) == (
        'Service default/web: metadata.annotations["lace-proxy.lace-cni.io/ipvs-scheduler"]'
        '="fifo": must be one of rr, wrr, lc, wlc, lblc, lblcr, sh, dh, sed, nq, mh'
    )


def test_ipv4_mapped_ipv6_is_the_ipv4_address() -> None:
    assert parse_service(service(externalIPs=["::ffff:192.0.2.1"])).external_ips == ("192.0.2.1",)


def _ipaddress_view(text: str) -> tuple[int, str] | None:
    """What Python's ipaddress makes of `text`, under canonical_ip's rules (no zones, mapped
    IPv6 is IPv4): the reference the C library's parser must agree with."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.scope_id is not None:
            return None
        if address.ipv4_mapped is not None:
            return 4, str(address.ipv4_mapped)
    return address.version, str(address)


def _spellings(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> list[str]:
    """Ways to write one address, canonical or not, valid or not."""
    text = str(address)
    forms = [text, text.upper(), f"{text}%eth0", f" {text}", f"{text}\x00"]
    if address.version == 4:
        octets = text.split(".")
        forms += [".".join(o.zfill(3) for o in octets), ".".join(octets[:3]), f"::ffff:{text}"]
        forms.append(f"::{text}")  # IPv4-compatible: inet_ntop would print it dotted
    else:
        forms += [address.exploded, address.exploded.replace("0000", "0")]
    return forms


@settings(max_examples=400)
@given(st.ip_addresses() | st.ip_addresses(v=6, network="::/96"))
def test_canonical_ip_agrees_with_ipaddress(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> None:
    for text in _spellings(address):
        assert canonical_ip.__wrapped__(text) == _ipaddress_view(text), text


@given(st.text(alphabet="0123456789abcdefABCDEF:.%x", max_size=45))
def test_canonical_ip_refuses_what_ipaddress_refuses(text: str) -> None:
    assert canonical_ip.__wrapped__(text) == _ipaddress_view(text)


@pytest.fixture(scope="module", params=["compiled", "pure"])
def plain(request: pytest.FixtureRequest) -> ModuleType:
    """The endpoint shortcut's twins: ext/plain.pyx (when built) and _pyplain."""
    if request.param == "compiled":
        return pytest.importorskip("lace_proxy.model._cplain")
    return pytest.importorskip("lace_proxy.model._pyplain")


def _plain_address(plain: ModuleType, text: str, version: int) -> str | None:
    endpoint = plain.plain_endpoint({"addresses": [text]}, version)
    return None if endpoint is None else endpoint.addresses[0]


def _expected_address(text: str, version: int) -> str | None:
    view = _ipaddress_view(text)
    return view[1] if view is not None and view[0] == version else None


@settings(max_examples=400)
@given(st.ip_addresses() | st.ip_addresses(v=6, network="::/96"))
def test_the_plain_endpoint_reads_addresses_as_ipaddress_does(
    plain: ModuleType, address: ipaddress.IPv4Address | ipaddress.IPv6Address
) -> None:
    """Its canonical text (in C in the compiled twin) is ipaddress's, of the slice's family."""
    for text in [*_spellings(address), "\ud800"]:
        for version in (4, 6):
            assert _plain_address(plain, text, version) == _expected_address(text, version), text


@given(st.text(alphabet="0123456789abcdefABCDEF:.%x", max_size=47), st.sampled_from([4, 6]))
def test_the_plain_endpoint_refuses_what_ipaddress_refuses(
    plain: ModuleType, text: str, version: int
) -> None:
    assert _plain_address(plain, text, version) == _expected_address(text, version)


def test_an_address_is_one_frontend() -> None:
    """Repeated ExternalIPs, and ones equal to the ClusterIP, are dropped; an address that is
    both an ExternalIP and a load-balancer IP of a LoadBalancer stays the latter."""
    svc = parse_service(service(externalIPs=["10.96.0.10", "192.0.2.1", "192.0.2.1", "::1"]))
    assert svc.external_ips == ("192.0.2.1", "::1")
    lb = service(type="LoadBalancer", externalIPs=["192.0.2.1", "192.0.2.2"])
    ingress = [{"ip": "192.0.2.1"}, {"ip": "10.96.0.10"}, {"ip": "192.0.2.1"}]
    lb["status"] = {"loadBalancer": {"ingress": ingress}}
    parsed = parse_service(lb)
    assert (parsed.external_ips, parsed.lb_ingress_ips) == (("192.0.2.2",), ("192.0.2.1",))
    # Not a LoadBalancer: its ingress IPs give no frontend, its ExternalIPs stay.
    lb["spec"]["type"] = "NodePort"
    assert parse_service(lb).external_ips == ("192.0.2.1", "192.0.2.2")


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A mutation setting a dotted path ("spec.ports.1.port") of an object."""

    def apply(obj: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = obj
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target.setdefault(part, {})
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value

    return apply


def _delete(path: str) -> Callable[[dict[str, Any]], None]:
    """A mutation removing a dotted path of an object."""

    def apply(obj: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = obj
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        del target[last]

    return apply


SERVICE_ERRORS = [
    # (mutation, field, value, code)
    (_set("spec.ports.1.port", 70000), "spec.ports[1].port", 70000, "invalid_port"),
    (_set("spec.ports.1.port", 0), "spec.ports[1].port", 0, "invalid_port"),
    (_set("spec.ports.0.port", "80"), "spec.ports[0].port", "80", "invalid_type"),
    (_set("spec.ports.0.port", True), "spec.ports[0].port", True, "invalid_type"),
    (_set("spec.ports.0.port", 80.0), "spec.ports[0].port", 80.0, "invalid_type"),
    (_delete("spec.ports.0.port"), "spec.ports[0].port", None, "missing_field"),
    (_set("spec.ports.0.port", None), "spec.ports[0].port", None, "missing_field"),
    (_set("spec.ports.1.nodePort", -1), "spec.ports[1].nodePort", -1, "invalid_port"),
    (_set("spec.ports.1.nodePort", 65536), "spec.ports[1].nodePort", 65536, "invalid_port"),
    (_set("spec.ports.0.targetPort", 0), "spec.ports[0].targetPort", 0, "invalid_port"),
    (_set("spec.ports.0.targetPort", 1.5), "spec.ports[0].targetPort", 1.5, "invalid_type"),
    (_set("spec.ports.0.protocol", "HTTP"), "spec.ports[0].protocol", "HTTP", "invalid_value"),
    (_set("spec.ports.0.protocol", "tcp"), "spec.ports[0].protocol", "tcp", "invalid_value"),
    (_set("spec.ports.0.name", 7), "spec.ports[0].name", 7, "invalid_type"),
    (_set("spec.ports", "80"), "spec.ports", "80", "invalid_type"),
    (_set("spec.ports", {"port": 80}), "spec.ports", {"port": 80}, "invalid_type"),
    (_set("spec.ports.0", "80"), "spec.ports[0]", "80", "invalid_type"),
    (_set("spec.ports.1.name", "http"), "spec.ports[1].name", "http", "duplicate_port"),
    (_set("spec.ports.1.port", 80), "spec.ports[1].port", 80, "duplicate_port"),
    (_set("spec.type", "Ingress"), "spec.type", "Ingress", "invalid_value"),
    (_set("spec.type", "loadbalancer"), "spec.type", "loadbalancer", "invalid_value"),
    (_set("spec.clusterIP", "300.1.1.1"), "spec.clusterIP", "300.1.1.1", "invalid_ip"),
    (_set("spec.clusterIP", "10.0.0.1/32"), "spec.clusterIP", "10.0.0.1/32", "invalid_ip"),
    (_set("spec.clusterIP", 167772161), "spec.clusterIP", 167772161, "invalid_type"),
    (
        _set("spec.clusterIPs", ["10.0.0.1", "fe80::1%eth0"]),
        "spec.clusterIPs[1]",
        "fe80::1%eth0",
        "invalid_ip",
    ),
    (
        _set("spec.clusterIPs", ["None", "10.0.0.1"]),
        "spec.clusterIPs",
        ["None", "10.0.0.1"],
        "invalid_value",
    ),
    (
        _set("spec.clusterIPs", ["10.0.0.1", "10.0.0.2"]),
        "spec.clusterIPs",
        ["10.0.0.1", "10.0.0.2"],
        "invalid_value",
    ),
    (_set("spec.clusterIPs", "10.0.0.1"), "spec.clusterIPs", "10.0.0.1", "invalid_type"),
    (_set("spec.clusterIPs", ""), "spec.clusterIPs", "", "invalid_type"),
    (_set("spec.externalIPs", ["1.2.3.4", "1.2.3"]), "spec.externalIPs[1]", "1.2.3", "invalid_ip"),
    (_set("spec.externalIPs", "1.2.3.4"), "spec.externalIPs", "1.2.3.4", "invalid_type"),
    (
        _set("status.loadBalancer.ingress", [{"ip": "203.0.113.1"}, {"ip": "lb.example"}]),
        "status.loadBalancer.ingress[1].ip",
        "lb.example",
        "invalid_ip",
    ),
    (
        _set("status.loadBalancer.ingress", [{"ip": "203.0.113.1", "ipMode": "vip"}]),
        "status.loadBalancer.ingress[0].ipMode",
        "vip",
        "invalid_value",
    ),
    (_set("status.loadBalancer", []), "status.loadBalancer", [], "invalid_type"),
    (
        _set("spec.loadBalancerSourceRanges", ["10.0.0.0/8", "10.0.0.0/33"]),
        "spec.loadBalancerSourceRanges[1]",
        "10.0.0.0/33",
        "invalid_cidr",
    ),
    (
        _set("spec.loadBalancerSourceRanges", ["10.0.0.1"]),
        "spec.loadBalancerSourceRanges[0]",
        "10.0.0.1",
        "invalid_cidr",
    ),
    (
        _set("spec.loadBalancerSourceRanges", ["10.0.0.0/255.0.0.0"]),
        "spec.loadBalancerSourceRanges[0]",
        "10.0.0.0/255.0.0.0",
        "invalid_cidr",
    ),
    (
        _set("spec.loadBalancerSourceRanges", ["fe80::%eth0/64"]),
        "spec.loadBalancerSourceRanges[0]",
        "fe80::%eth0/64",
        "invalid_cidr",
    ),
    (
        _set("metadata.annotations", {LB_SOURCE_RANGES_ANNOTATION: "10.0.0.0/8,,1.2.3.0/24"}),
        f'metadata.annotations["{LB_SOURCE_RANGES_ANNOTATION}"]',
        "",
        "invalid_cidr",
    ),
    (
        _set("metadata.annotations", {LB_SOURCE_RANGES_ANNOTATION: "10.0.0.0/8, nope"}),
        f'metadata.annotations["{LB_SOURCE_RANGES_ANNOTATION}"]',
        " nope",
        "invalid_cidr",
    ),
    (
        _set("metadata.annotations", {LB_SOURCE_RANGES_ANNOTATION: ["10.0.0.0/8"]}),
        f'metadata.annotations["{LB_SOURCE_RANGES_ANNOTATION}"]',
        ["10.0.0.0/8"],
        "invalid_type",
    ),
    (
        _set("spec.externalTrafficPolicy", "Global"),
        "spec.externalTrafficPolicy",
        "Global",
        "invalid_value",
    ),
    (
        _set("spec.internalTrafficPolicy", "local"),
        "spec.internalTrafficPolicy",
        "local",
        "invalid_value",
    ),
    (_set("spec.trafficDistribution", 1), "spec.trafficDistribution", 1, "invalid_type"),
    (_set("spec.sessionAffinity", "Cookie"), "spec.sessionAffinity", "Cookie", "invalid_value"),
    (
        _set("spec.sessionAffinityConfig.clientIP.timeoutSeconds", 86401),
        "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
        86401,
        "invalid_value",
    ),
    (
        _set("spec.sessionAffinityConfig.clientIP.timeoutSeconds", 0),
        "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
        0,
        "invalid_value",
    ),
    (
        _set("spec.sessionAffinityConfig.clientIP.timeoutSeconds", "300"),
        "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
        "300",
        "invalid_type",
    ),
    (
        _set("spec.sessionAffinityConfig.clientIP", 300),
        "spec.sessionAffinityConfig.clientIP",
        300,
        "invalid_type",
    ),
    (_set("spec.healthCheckNodePort", 65536), "spec.healthCheckNodePort", 65536, "invalid_port"),
    (_set("metadata.labels", {"app": 1}), 'metadata.labels["app"]', 1, "invalid_type"),
    (_set("metadata.labels", ["app=web"]), "metadata.labels", ["app=web"], "invalid_type"),
    (_set("metadata.annotations", "x"), "metadata.annotations", "x", "invalid_type"),
    (
        _set("metadata.annotations", {IPVS_SCHEDULER_ANNOTATION: "RR"}),
        f'metadata.annotations["{IPVS_SCHEDULER_ANNOTATION}"]',
        "RR",
        "invalid_scheduler",
    ),
    (
        _set("metadata.annotations", {IPVS_SCHEDULER_ANNOTATION: " rr"}),
        f'metadata.annotations["{IPVS_SCHEDULER_ANNOTATION}"]',
        " rr",
        "invalid_scheduler",
    ),
    (
        _set("metadata.annotations", {IPVS_SCHEDULER_ANNOTATION: 1}),
        f'metadata.annotations["{IPVS_SCHEDULER_ANNOTATION}"]',
        1,
        "invalid_type",
    ),
    (
        _set("metadata.annotations", {KUBE_ROUTER_SCHEDULER_ANNOTATION: "fifo"}),
        f'metadata.annotations["{KUBE_ROUTER_SCHEDULER_ANNOTATION}"]',
        "fifo",
        "invalid_scheduler",
    ),
    (_set("spec", []), "spec", [], "invalid_type"),
    (_set("status", "ok"), "status", "ok", "invalid_type"),
]


@pytest.mark.parametrize(("mutate", "field", "value", "code"), SERVICE_ERRORS)
def test_service_validation_errors(
    mutate: Callable[[dict[str, Any]], None], field: str, value: Any, code: str
) -> None:
    obj = service(type="LoadBalancer", externalTrafficPolicy="Local", sessionAffinity="ClientIP")
    mutate(obj)
    error = rejected(parse_service, obj)
    assert (error.kind, error.object, error.field, error.value, error.code) == (
        "Service",
        "default/web",
        field,
        value,
        code,
    )


def test_service_error_message_is_one_precise_line() -> None:
    obj = service()
    obj["spec"]["ports"][1]["port"] = 70000
    error = rejected(parse_service, obj)
    assert str(error) == "Service default/web: spec.ports[1].port=70000: must be 1-65535"
    assert isinstance(error, ValueError)


def test_same_port_name_on_different_protocols_is_fine() -> None:
    svc = parse_service(
        service(ports=[{"name": "dns", "port": 53, "protocol": p} for p in ("UDP", "TCP", "SCTP")])
    )
    assert [p.protocol for p in svc.ports] == ["UDP", "TCP", "SCTP"]


@pytest.mark.parametrize(
    ("metadata", "field", "obj_name", "code"),
    [
        ({}, "metadata.name", "", "missing_field"),
        ({"name": ""}, "metadata.name", "", "missing_field"),
        ({"name": 5}, "metadata.name", "", "invalid_type"),
        ({"name": "web", "namespace": ["a"]}, "metadata.namespace", "", "invalid_type"),
        ("web", "metadata", "", "invalid_type"),
    ],
)
def test_service_metadata_errors(metadata: Any, field: str, obj_name: str, code: str) -> None:
    obj = service()
    obj["metadata"] = metadata
    error = rejected(parse_service, obj)
    assert (error.object, error.field, error.code) == (obj_name, field, code)


def test_missing_name_message_names_the_kind() -> None:
    error = rejected(parse_service, {"spec": {}})
    assert str(error) == "Service: metadata.name: required"


def test_namespace_defaults_to_default() -> None:
    obj = service()
    del obj["metadata"]["namespace"]
    assert parse_service(obj).key == "default/web"


# --- EndpointSlice --------------------------------------------------------------------------


def test_full_endpoint_slice() -> None:
    es = parse_endpoint_slice(load(FULL_SLICE))
    assert es == EndpointSlice(
        namespace="shop",
        name="web-abc12",
        service_name="web",
        address_type="IPv6",
        endpoints=(
            Endpoint(
                addresses=("2001:db8::1",),
                ready=True,
                serving=True,
                terminating=False,
                node_name="node-a",
                zone="zone-a",
                hint_zones=("zone-a",),
                hint_nodes=("node-a",),
            ),
            Endpoint(
                addresses=("2001:db8::2",),
                ready=False,
                serving=True,
                terminating=True,
                node_name="node-b",
                zone="zone-b",
            ),
            # nil serving means true (API contract, as kube-proxy reads it), even if not ready
            Endpoint(addresses=("2001:db8::3",), ready=False, serving=True, terminating=False),
        ),
        ports=(
            EndpointPort(name="http", protocol="TCP", port=8080),
            EndpointPort(name="all", protocol="TCP", port=None),
            EndpointPort(name="", protocol="UDP", port=53),
        ),
        trigger_time=datetime(2024, 5, 6, 7, 8, 9, 500000, tzinfo=UTC).timestamp(),
        labels=(
            ("endpointslice.kubernetes.io/managed-by", "endpointslice-controller.k8s.io"),
            ("kubernetes.io/service-name", "web"),
        ),
    )
    assert es.key == "shop/web-abc12"
    assert es.service_key == "shop/web"


def test_slice_without_endpoints_or_ports() -> None:
    es = parse_endpoint_slice(endpoint_slice(endpoints=None, ports=None))
    assert (es.endpoints, es.ports, es.trigger_time) == ((), (), None)


_VALUES = st.sampled_from(
    [None, "", "x", 0, 1, True, False, [], {}, "10.0.0.1", "::ffff:10.0.0.1", "2001:db8::1"]
)
_ADDRESSES = st.lists(
    st.sampled_from(["10.0.0.1", "010.0.0.1", "2001:DB8::1", "::ffff:10.0.0.2", "", 7]),
    max_size=3,
)
_ENDPOINTS = st.fixed_dictionaries(
    {},
    optional={
        "addresses": _ADDRESSES | _VALUES,
        "conditions": st.fixed_dictionaries(
            {}, optional={k: _VALUES for k in ("ready", "serving", "terminating")}
        )
        | _VALUES,
        "nodeName": _VALUES,
        "zone": _VALUES,
        "hints": st.just({"forZones": [{"name": "a"}]}) | _VALUES,
        "targetRef": _VALUES,
    },
)


def test_the_plain_endpoint_shortcut_takes_what_the_controller_writes(plain: ModuleType) -> None:
    conditions = [None, {}, {"ready": None}, {"ready": False, "serving": True, "terminating": True}]
    for condition, text, addresses in itertools.product(
        conditions, [None, "", "a"], [["10.0.0.1"], ["::ffff:10.0.0.1", "10.0.0.2"]]
    ):
        endpoint = {"addresses": addresses, "conditions": condition, "nodeName": text, "zone": text}
        shortcut = plain.plain_endpoint(endpoint, 4)
        assert shortcut is not None
        assert shortcut == parse_module._endpoint(Subject("EndpointSlice"), endpoint, "e", 4)


@settings(max_examples=600)
@given(_ENDPOINTS | _VALUES, st.sampled_from([4, 6, None]))
def test_the_plain_endpoint_shortcut_agrees_with_the_checked_parse(
    plain: ModuleType, endpoint: Any, version: int | None
) -> None:
    """`plain_endpoint` (the shape the controller writes) gives what `_endpoint` gives, and
    leaves anything else, errors included, to it; both twins alike."""
    shortcut = plain.plain_endpoint(endpoint, version)
    try:
        checked = parse_module._endpoint(Subject("EndpointSlice"), endpoint, "e", version)
    except ValidationError:
        assert shortcut is None
    else:
        assert shortcut in (None, checked)
    if shortcut is not None:  # the compiled twin sets the slots itself: a whole Endpoint
        assert (hash(shortcut), repr(shortcut)) == (hash(checked), repr(checked))
        assert pickle.loads(pickle.dumps(shortcut)) == shortcut


def test_ipv4_mapped_address_belongs_to_an_ipv4_slice() -> None:
    es = parse_endpoint_slice(endpoint_slice(endpoints=[{"addresses": ["::ffff:10.0.0.7"]}]))
    assert es.endpoints[0].addresses == ("10.0.0.7",)
    error = rejected(
        parse_endpoint_slice, endpoint_slice("IPv6", endpoints=[{"addresses": ["::ffff:10.0.0.7"]}])
    )
    assert (error.field, error.code) == ("endpoints[0].addresses[0]", "invalid_ip")


def test_fqdn_addresses_are_not_checked_as_ips() -> None:
    es = parse_endpoint_slice(endpoint_slice("FQDN", endpoints=[{"addresses": ["db.example"]}]))
    assert es.endpoints[0].addresses == ("db.example",)


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        ("2024-05-06T07:08:09Z", datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC).timestamp()),
        ("2024-05-06T09:08:09.123456789+02:00", 1714979289.123456),
        ("2024-05-06", None),  # no time zone: ambiguous
        ("yesterday", None),
        ("", None),
        (1714979289, None),
        (None, None),
    ],
)
def test_trigger_time_is_lenient(annotation: Any, expected: float | None) -> None:
    obj = endpoint_slice()
    obj["metadata"]["annotations"] = {
        "endpoints.kubernetes.io/last-change-trigger-time": annotation
    }
    assert parse_endpoint_slice(obj).trigger_time == expected


SLICE_ERRORS = [
    (_delete("addressType"), "addressType", None, "missing_field"),
    (_set("addressType", "IPv5"), "addressType", "IPv5", "invalid_value"),
    (_set("addressType", 4), "addressType", 4, "invalid_type"),
    (
        _set("metadata.labels", {"app": "web"}),
        'metadata.labels["kubernetes.io/service-name"]',
        None,
        "missing_field",
    ),
    (
        _set("metadata.labels", {"kubernetes.io/service-name": ""}),
        'metadata.labels["kubernetes.io/service-name"]',
        None,
        "missing_field",
    ),
    (_set("endpoints", "10.0.0.1"), "endpoints", "10.0.0.1", "invalid_type"),
    (_set("endpoints.1", None), "endpoints[1].addresses", None, "missing_field"),
    (_set("endpoints.1.addresses", []), "endpoints[1].addresses", None, "missing_field"),
    (
        _set("endpoints.1.addresses", "10.0.0.2"),
        "endpoints[1].addresses",
        "10.0.0.2",
        "invalid_type",
    ),
    (
        _set("endpoints.1.addresses", ["10.0.0.2", "2001:db8::2"]),
        "endpoints[1].addresses[1]",
        "2001:db8::2",
        "invalid_ip",
    ),
    (_set("endpoints.0.addresses", [None]), "endpoints[0].addresses[0]", None, "invalid_type"),
    (
        _set("endpoints.0.addresses", ["10.0.0.256"]),
        "endpoints[0].addresses[0]",
        "10.0.0.256",
        "invalid_ip",
    ),
    (_set("endpoints.0.conditions", True), "endpoints[0].conditions", True, "invalid_type"),
    (
        _set("endpoints.0.conditions", {"ready": "true"}),
        "endpoints[0].conditions.ready",
        "true",
        "invalid_type",
    ),
    (
        _set("endpoints.0.conditions", {"serving": 1}),
        "endpoints[0].conditions.serving",
        1,
        "invalid_type",
    ),
    (
        _set("endpoints.0.conditions", {"terminating": 0}),
        "endpoints[0].conditions.terminating",
        0,
        "invalid_type",
    ),
    (_set("endpoints.0.nodeName", 5), "endpoints[0].nodeName", 5, "invalid_type"),
    (_set("endpoints.0.zone", ["a"]), "endpoints[0].zone", ["a"], "invalid_type"),
    (_set("endpoints.0.hints", "zone-a"), "endpoints[0].hints", "zone-a", "invalid_type"),
    (
        _set("endpoints.0.hints", {"forZones": "zone-a"}),
        "endpoints[0].hints.forZones",
        "zone-a",
        "invalid_type",
    ),
    (
        _set("endpoints.0.hints", {"forZones": [{"name": "a"}, {}]}),
        "endpoints[0].hints.forZones[1].name",
        None,
        "missing_field",
    ),
    (
        _set("endpoints.0.hints", {"forNodes": ["node-a"]}),
        "endpoints[0].hints.forNodes[0]",
        "node-a",
        "invalid_type",
    ),
    (_set("ports", {"port": 80}), "ports", {"port": 80}, "invalid_type"),
    (_set("ports.0.port", 0), "ports[0].port", 0, "invalid_port"),
    (_set("ports.0.port", 65536), "ports[0].port", 65536, "invalid_port"),
    (_set("ports.0.port", "8080"), "ports[0].port", "8080", "invalid_type"),
    (_set("ports.0.protocol", "ICMP"), "ports[0].protocol", "ICMP", "invalid_value"),
    (_set("ports.0.name", False), "ports[0].name", False, "invalid_type"),
]


@pytest.mark.parametrize(("mutate", "field", "value", "code"), SLICE_ERRORS)
def test_endpoint_slice_validation_errors(
    mutate: Callable[[dict[str, Any]], None], field: str, value: Any, code: str
) -> None:
    obj = endpoint_slice()
    mutate(obj)
    error = rejected(parse_endpoint_slice, obj)
    assert (error.kind, error.object, error.field, error.value, error.code) == (
        "EndpointSlice",
        "default/web-x1",
        field,
        value,
        code,
    )


def test_wrong_family_message() -> None:
    error = rejected(
        parse_endpoint_slice, endpoint_slice(endpoints=[{"addresses": ["2001:db8::1"]}])
    )
    assert str(error) == (
        'EndpointSlice default/web-x1: endpoints[0].addresses[0]="2001:db8::1": not an IPv4 address'
    )


# --- Node -----------------------------------------------------------------------------------


def test_full_node() -> None:
    assert parse_node(load(FULL_NODE)) == Node(
        name="node-a",
        zone="zone-a",
        addresses=(("InternalIP", "192.168.1.10"), ("InternalIP", "fd00::10")),
        pod_cidrs=("10.244.1.0/24", "fd00:10:244:1::/64"),
        deleting=True,
        labels=(("kubernetes.io/hostname", "node-a"), ("topology.kubernetes.io/zone", "zone-a")),
    )


def test_minimal_node_and_pod_cidr_fallback() -> None:
    assert parse_node(node()) == Node(name="node-a")
    assert parse_node(node(spec={"podCIDR": "10.244.2.7/24"})).pod_cidrs == ("10.244.2.0/24",)


def test_node_mtu_annotation() -> None:
    obj = node()
    obj["metadata"]["annotations"] = {"lace-cni.io/mtu": "1450"}
    assert parse_node(obj).mtu == 1450
    obj["metadata"]["annotations"] = {"lace-cni.io/mtu": "15OO"}
    error = rejected(parse_node, obj)
    assert error.code == "invalid_mtu" and "68-65535" in str(error)


NODE_ERRORS = [
    (_set("status.addresses", "10.0.0.1"), "status.addresses", "10.0.0.1", "invalid_type"),
    (
        _set("status.addresses", [{"type": "InternalIP", "address": 5}]),
        "status.addresses[0].address",
        5,
        "invalid_type",
    ),
    (
        _set("status.addresses", [{"address": "10.0.0.1"}]),
        "status.addresses[0].type",
        None,
        "missing_field",
    ),
    (_set("status.addresses", [[]]), "status.addresses[0]", [], "invalid_type"),
    (_set("spec.podCIDRs", ["10.0.0.0/8", "bad"]), "spec.podCIDRs[1]", "bad", "invalid_cidr"),
    (_set("spec.podCIDRs", "10.0.0.0/8"), "spec.podCIDRs", "10.0.0.0/8", "invalid_type"),
    (_set("spec.podCIDR", "10.0.0.0"), "spec.podCIDR", "10.0.0.0", "invalid_cidr"),
    (
        _set("metadata.labels", {"topology.kubernetes.io/zone": None}),
        'metadata.labels["topology.kubernetes.io/zone"]',
        None,
        "invalid_type",
    ),
]


@pytest.mark.parametrize(("mutate", "field", "value", "code"), NODE_ERRORS)
def test_node_validation_errors(
    mutate: Callable[[dict[str, Any]], None], field: str, value: Any, code: str
) -> None:
    obj = node()
    mutate(obj)
    error = rejected(parse_node, obj)
    assert (error.kind, error.object, error.field, error.value, error.code) == (
        "Node",
        "node-a",
        field,
        value,
        code,
    )


# --- dispatch and robustness ----------------------------------------------------------------


def test_parse_object_dispatches_on_api_version_and_kind() -> None:
    assert isinstance(parse_object(load(DUAL_STACK_LB)), Service)
    assert isinstance(parse_object(load(FULL_SLICE)), EndpointSlice)
    assert isinstance(parse_object(load(FULL_NODE)), Node)


@pytest.mark.parametrize(
    ("obj", "kind", "name", "field", "value"),
    [
        (
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "a", "namespace": "b"},
            },
            "Deployment",
            "b/a",
            "kind",
            "Deployment",
        ),
        (
            {
                "apiVersion": "discovery.k8s.io/v1beta1",
                "kind": "EndpointSlice",
                "metadata": {"name": "a"},
            },
            "EndpointSlice",
            "a",
            "apiVersion",
            "discovery.k8s.io/v1beta1",
        ),
        ({"kind": "Service", "metadata": {"name": "a"}}, "Service", "a", "apiVersion", None),
        ({"metadata": {"name": "a"}}, "Object", "a", "kind", None),
        ({"apiVersion": ["v1"], "kind": {"k": 1}, "metadata": []}, "Object", "", "kind", {"k": 1}),
    ],
)
def test_parse_object_rejects_unsupported_kinds(
    obj: dict[str, Any], kind: str, name: str, field: str, value: Any
) -> None:
    error = rejected(parse_object, obj)
    assert (error.kind, error.object, error.field, error.value, error.code) == (
        kind,
        name,
        field,
        value,
        "unsupported_kind",
    )


@pytest.mark.parametrize("obj", [None, "Service", ["a"], 5])
def test_parse_object_rejects_non_objects(obj: Any) -> None:
    assert rejected(parse_object, obj).code == "invalid_type"
    assert rejected(parse_service, obj).code == "invalid_type"


@pytest.mark.parametrize("text", [DUAL_STACK_LB, FULL_SLICE, FULL_NODE])
def test_junk_anywhere_gives_validation_error_or_a_model(text: str) -> None:
    """No wrong type at any place may escape as TypeError/KeyError/AttributeError."""
    base = load(text)
    assert_junk_is_rejected_cleanly(base)


# --- errors and rejections ------------------------------------------------------------------


def test_error_message_forms() -> None:
    error = ValidationError(
        "Service", "ns/a", "spec.type", "X", "must be one of A, B", "invalid_value"
    )
    assert str(error) == 'Service ns/a: spec.type="X": must be one of A, B'
    assert str(error.with_source("m/a.yaml")) == f"m/a.yaml: {error}"
    assert str(ValidationError("Node", "n", "", None, "gone", "x")) == "Node n: gone"
    long = ValidationError("Service", "ns/a", "spec", {"k": "v" * 500}, "bad", "invalid_type")
    assert len(str(long)) < 120
    assert str(long).endswith("...: bad")


def test_error_survives_copy_and_pickle() -> None:
    error = ValidationError(
        "Service", "ns/a", "spec.ports[0].port", 0, "must be 1-65535", "invalid_port", "f.yaml"
    )
    for clone in (copy.copy(error), pickle.loads(pickle.dumps(error))):
        assert str(clone) == str(error)
        assert (clone.code, clone.source) == ("invalid_port", "f.yaml")


def test_rejections_log_each_problem_once_and_count_every_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rejections = Rejections()
    bad_port = ValidationError(
        "Service", "ns/a", "spec.ports[0].port", 0, "must be 1-65535", "invalid_port"
    )
    same_again = ValidationError(
        "Service", "ns/a", "spec.ports[0].port", -5, "must be 1-65535", "invalid_port"
    )
    other_field = ValidationError(
        "Service", "ns/a", "spec.ports[1].port", 0, "must be 1-65535", "invalid_port"
    )
    other_object = ValidationError(
        "Service", "ns/b", "spec.type", "X", "must be one of", "invalid_value"
    )
    with caplog.at_level(logging.WARNING, logger="lace_proxy.model"):
        assert rejections.record(bad_port)
        assert not rejections.record(same_again)  # only the value differs
        assert rejections.record(other_field)
        assert rejections.record(other_object)
        assert not rejections.record(bad_port)
        rejections.forget("Service", "ns/a")
        assert rejections.record(bad_port)  # logged again once the object was forgotten
    assert rejections.counts == {"invalid_port": 5, "invalid_value": 1}
    messages = [r.getMessage() for r in caplog.records if r.name == "lace_proxy.model"]
    assert messages == [
        f"rejected {bad_port}",
        f"rejected {other_field}",
        f"rejected {other_object}",
        f"rejected {bad_port}",
    ]


# --- load_manifests -------------------------------------------------------------------------


def _write(folder: Path, name: str, text: str | bytes) -> Path:
    path = folder / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def test_load_folder(tmp_path: Path) -> None:
    _write(tmp_path, "a.yaml", f"---\n{DUAL_STACK_LB}\n---\n---\n{FULL_SLICE}\n---\n")
    _write(
        tmp_path,
        "b.yml",
        """
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Node, metadata: {name: node-b}}
- {apiVersion: v1, kind: Service, metadata: {name: db, namespace: shop},
   spec: {clusterIP: 10.96.0.20, ports: [{port: 5432}]}}
- {apiVersion: apps/v1, kind: Deployment, metadata: {name: db, namespace: shop}}
- {apiVersion: v1, kind: Service, metadata: {name: bad, namespace: shop},
   spec: {clusterIP: 10.96.0.21, ports: [{port: 0}]}}
""",
    )
    # the API's own list form: items carry no apiVersion/kind
    _write(
        tmp_path,
        "c.json",
        '{"apiVersion": "v1", "kind": "NodeList", "items": ['
        '{"metadata": {"name": "node-c"}}, {"metadata": {"name": "node-d"}}]}',
    )
    # a syntax error late in the file: the valid document before it must not load either
    _write(
        tmp_path,
        "d.yaml",
        "apiVersion: v1\nkind: Node\nmetadata: {name: node-x}\n---\nkind: [Node\n",
    )
    _write(tmp_path, "e.yaml", DUAL_STACK_LB)  # same Service as in a.yaml
    _write(tmp_path, "notes.txt", "kind: [")  # not a manifest
    (tmp_path / "sub.yaml").mkdir()  # not a file
    _write(tmp_path / "sub.yaml", "x.yaml", FULL_NODE)

    result = load_manifests(tmp_path)

    assert sorted(result.services) == ["shop/db", "shop/web"]
    assert result.services["shop/web"] == parse_service(load(DUAL_STACK_LB))
    assert list(result.slices) == ["shop/web-abc12"]
    assert sorted(result.nodes) == ["node-b", "node-c", "node-d"]
    summary = [(e.source, e.kind, e.object, e.field, e.code) for e in result.rejected]
    d_yaml, e_yaml = str(tmp_path / "d.yaml"), str(tmp_path / "e.yaml")
    assert summary == [
        (str(tmp_path / "b.yml"), "Deployment", "shop/db", "kind", "unsupported_kind"),
        (str(tmp_path / "b.yml"), "Service", "shop/bad", "spec.ports[0].port", "invalid_port"),
        (None, "File", d_yaml, "", "syntax_error"),
        (e_yaml, "Service", "shop/web", "", "duplicate"),
    ]
    assert str(result.rejected[2]).startswith(f"File {d_yaml}: line 6, column 1: ")
    assert str(result.rejected[3]) == (
        f"{e_yaml}: Service shop/web: duplicate; already loaded from {tmp_path / 'a.yaml'}"
    )


def test_load_single_file_with_duplicate_inside(tmp_path: Path) -> None:
    path = _write(tmp_path, "one.yaml", f"{FULL_NODE}\n---\n{FULL_NODE}")
    result = load_manifests(path)
    assert list(result.nodes) == ["node-a"]
    assert [(e.object, e.code, e.source) for e in result.rejected] == [
        ("node-a", "duplicate", str(path))
    ]


def test_load_reports_unreadable_and_malformed_files(tmp_path: Path) -> None:
    _write(tmp_path, "1.json", '{"kind": "List", "items": [}')
    _write(tmp_path, "2.yaml", b"kind: Node\nmetadata: {name: \xff}\n")
    _write(tmp_path, "3.yaml", "metadata:\n  creationTimestamp: 2024-13-45T00:00:00Z\n")
    _write(tmp_path, "4.yaml", "apiVersion: v1\nkind: List\nitems: {a: 1}\n")
    _write(tmp_path, "5.yaml", "just a string\n")
    result = load_manifests(tmp_path)
    assert (result.services, result.slices, result.nodes) == ({}, {}, {})
    summary = [(e.kind, e.field, e.code) for e in result.rejected]
    assert summary == [
        ("File", "", "syntax_error"),
        ("File", "", "read_error"),
        ("File", "", "syntax_error"),
        ("List", "items", "invalid_type"),
        ("Object", "", "invalid_type"),
    ]
    assert (
        str(result.rejected[0]) == f"File {tmp_path / '1.json'}: line 1, column 28: Expecting value"
    )
    assert result.rejected[3].source == str(tmp_path / "4.yaml")
    assert result.rejected[4].source == str(tmp_path / "5.yaml")


def test_load_empty_folder_and_missing_path(tmp_path: Path) -> None:
    _write(tmp_path, "empty.yaml", "---\n# nothing\n---\n")
    result = load_manifests(tmp_path)
    assert (result.services, result.slices, result.nodes, result.rejected) == ({}, {}, {}, [])
    with pytest.raises(FileNotFoundError):
        load_manifests(tmp_path / "missing")


# --- ServiceCIDR ------------------------------------------------------------------------------


def test_service_cidr_one_range_per_family() -> None:
    parsed = parse_object(api_service_cidr("10.96.0.0/16", "fd00:96:0::/112"))
    assert parsed == ServiceCIDR("kubernetes", ("10.96.0.0/16", "fd00:96::/112"))
    assert parse_service_cidr(api_service_cidr("fd00:96::/112")).cidrs == ("fd00:96::/112",)


@pytest.mark.parametrize(
    ("cidrs", "field", "code"),
    [
        (("10.96.0.1/16",), "spec.cidrs[0]", "invalid_cidr"),  # host bits: the API refuses it
        (("10.96.0.0/16", "fd00::5/64"), "spec.cidrs[1]", "invalid_cidr"),
        (("10.96.0.0",), "spec.cidrs[0]", "invalid_cidr"),
        (("10.96.0.0/33",), "spec.cidrs[0]", "invalid_cidr"),
        ((7,), "spec.cidrs[0]", "invalid_type"),
        ((), "spec.cidrs", "missing_field"),
        (("10.96.0.0/16", "10.97.0.0/16"), "spec.cidrs", "invalid_value"),
        (("10.96.0.0/16", "fd00::/64", "fd01::/64"), "spec.cidrs", "invalid_value"),
    ],
)
def test_service_cidr_with_a_bad_prefix_is_rejected(
    cidrs: tuple[Any, ...], field: str, code: str
) -> None:
    error = rejected(parse_service_cidr, api_service_cidr(*cidrs))
    assert (error.kind, error.object, error.field, error.code) == (
        "ServiceCIDR",
        "kubernetes",
        field,
        code,
    )


def test_service_cidr_junk_is_rejected_cleanly() -> None:
    assert_junk_is_rejected_cleanly(api_service_cidr("10.96.0.0/16", "fd00:96::/112"))
