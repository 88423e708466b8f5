"""The kube source's decoding (lace_proxy.sources.wire): what it skips, the parsers never read.

Each rich object is parsed twice, once from `json.loads` and once from the source's decoders,
and must give the same model, or the same error, also with junk at every place of it (a
field the shapes dropped would parse as absent and show here).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from lace_proxy.model import ValidationError, parse_endpoint_slice, parse_service
from lace_proxy.sources.wire import ENDPOINT_SLICES, SERVICES

from ..helpers import with_junk

#: What the server adds that no parser reads: dropped by the shapes.
MANAGED = {
    "uid": "469a37fc-cfd3-40fa-b392-a3c8bcdf0c4c",
    "generation": 1,
    "creationTimestamp": "2026-12-06T11:46:10Z",
    "managedFields": [{"manager": "kube-controller-manager", "fieldsV1": {"f:spec": {}}}],
}

SERVICE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {
        "name": "web",
        "namespace": "shop",
        "resourceVersion": "4711",
        "labels": {"app": "web", "service.kubernetes.io/service-proxy-name": "lace"},
        "annotations": {
            "service.beta.kubernetes.io/load-balancer-source-ranges": "192.0.2.0/24",
            "lace-proxy.lace-cni.io/ipvs-scheduler": "wrr",
            "lace-proxy.lace-cni.io/bgp-advertise": "true",
            "lace-proxy.lace-cni.io/bgp-communities": "65000:1",
        },
        **MANAGED,
    },
    "spec": {
        "type": "LoadBalancer",
        "clusterIP": "10.96.0.10",
        "clusterIPs": ["10.96.0.10", "2001:db8::a"],
        "ipFamilies": ["IPv4", "IPv6"],
        "ports": [
            {"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080},
            {"name": "dns", "protocol": "UDP", "port": 53, "targetPort": "dns"},
        ],
        "externalIPs": ["198.51.100.7"],
        "externalTrafficPolicy": "Local",
        "internalTrafficPolicy": "Local",
        "trafficDistribution": "PreferClose",
        "sessionAffinity": "ClientIP",
        "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 300}},
        "healthCheckNodePort": 32000,
    },
    "status": {
        "loadBalancer": {"ingress": [{"ip": "203.0.113.5", "ipMode": "VIP"}, {"ip": "203.0.113.6"}]}
    },
}

SLICE: dict[str, Any] = {
    "apiVersion": "discovery.k8s.io/v1",
    "kind": "EndpointSlice",
    "metadata": {
        "name": "web-abc12",
        "namespace": "shop",
        "resourceVersion": "4712",
        "labels": {"kubernetes.io/service-name": "web"},
        "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2024-05-06T07:08:09Z"},
        **MANAGED,
    },
    "addressType": "IPv4",
    "endpoints": [
        {
            "addresses": ["10.0.0.1"],
            "conditions": {"ready": False, "serving": True, "terminating": True},
            "nodeName": "node-a",
            "zone": "zone-a",
            "hints": {"forZones": [{"name": "zone-a"}], "forNodes": [{"name": "node-a"}]},
            "targetRef": {"kind": "Pod", "name": "web-0", "uid": "u"},
        },
        {"addresses": ["10.0.0.2"]},
    ],
    "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
}

KINDS = [(SERVICE, SERVICES, parse_service), (SLICE, ENDPOINT_SLICES, parse_endpoint_slice)]


def outcome(parse: Callable[[Any], Any], obj: Any) -> Any:
    """The model, or the error as (code, field, value)."""
    try:
        return parse(obj)
    except ValidationError as error:
        return (error.code, error.field, error.value)


@pytest.mark.parametrize(("base", "decoders", "parse"), KINDS, ids=["service", "slice"])
def test_the_shapes_keep_every_field_a_parser_reads(base: Any, decoders: Any, parse: Any) -> None:
    data = json.dumps(base).encode()
    item = decoders.object(data)
    assert "managedFields" not in item["metadata"] and "uid" not in item["metadata"]
    assert item["metadata"]["resourceVersion"] == base["metadata"]["resourceVersion"]
    whole = outcome(parse, json.loads(data))
    assert not isinstance(whole, tuple), whole  # a model: the rich object is valid
    assert outcome(parse, item) == whole
    listing = json.dumps({"metadata": {"continue": "c"}, "items": [base]}).encode()
    meta, items = decoders.list(listing)
    assert meta == {"continue": "c"}
    assert [outcome(parse, item) for item in items] == [whole]


@pytest.mark.parametrize(("base", "decoders", "parse"), KINDS, ids=["service", "slice"])
def test_junk_anywhere_parses_alike_both_ways(base: Any, decoders: Any, parse: Any) -> None:
    for path, junk, obj in with_junk(base):
        data = json.dumps(obj).encode()
        expected = outcome(parse, json.loads(data))
        assert outcome(parse, decoders.object(data)) == expected, (path, junk)
        event = json.dumps({"type": "MODIFIED", "object": obj}).encode()
        assert outcome(parse, decoders.event(event)["object"]) == expected, (path, junk)


def test_an_error_event_keeps_its_status() -> None:
    status = {"kind": "Status", "code": 410, "message": "too old resource version: 1 (2)"}
    event = SERVICES.event(json.dumps({"type": "ERROR", "object": status}).encode())
    assert event == {"type": "ERROR", "object": status}


def test_an_event_of_another_shape_is_decoded_whole() -> None:
    assert SERVICES.event(b'["not", "an", "event"]') == ["not", "an", "event"]
    assert SERVICES.event(b'{"type": "BOOKMARK"}') == {"type": "BOOKMARK"}


def test_a_lists_items_are_decoded_one_by_one_each_by_its_own_shape() -> None:
    """An item of another shape is decoded whole (its parser names what is wrong) without
    costing the others their shape."""
    odd = {"metadata": "not an object"}
    data = json.dumps({"metadata": {"resourceVersion": "7"}, "items": [SERVICE, odd]}).encode()
    meta, items = SERVICES.list(data)
    good, bad = list(items)
    assert meta == {"resourceVersion": "7"}
    assert "managedFields" not in good["metadata"] and bad == odd
