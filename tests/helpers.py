"""Shared test helpers: a recording change handler, API object builders, waiting."""

from __future__ import annotations

import asyncio
import copy
import inspect
from collections.abc import Callable, Iterator
from typing import Any

from lace_proxy.metrics import ProxyMetrics
from lace_proxy.model import EndpointSlice, Node, Service, ServiceCIDR


class Recorder:
    """A change handler that records what it was told, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.objects: dict[str, Any] = {}

    def service_upserted(self, svc: Service) -> None:
        self.events.append(("service+", svc.key))
        self.objects[svc.key] = svc

    def service_deleted(self, key: str) -> None:
        self.events.append(("service-", key))

    def slice_upserted(self, sl: EndpointSlice) -> None:
        self.events.append(("slice+", sl.key))
        self.objects[sl.key] = sl

    def slice_deleted(self, key: str) -> None:
        self.events.append(("slice-", key))

    def node_upserted(self, node: Node) -> None:
        self.events.append(("node+", node.name))

    def node_deleted(self, name: str) -> None:
        self.events.append(("node-", name))

    def service_cidr_upserted(self, cidr: ServiceCIDR) -> None:
        self.events.append(("servicecidr+", cidr.name))
        self.objects[f"ServiceCIDR/{cidr.name}"] = cidr

    def service_cidr_deleted(self, name: str) -> None:
        self.events.append(("servicecidr-", name))

    def lace_upserted(self, obj: Any) -> None:
        self.events.append((f"{obj.kind}+", obj.key))
        self.objects[f"{obj.kind}/{obj.key}"] = obj

    def lace_deleted(self, kind: str, name: str) -> None:
        self.events.append((f"{kind}-", name))

    def synced(self, source: str) -> None:
        self.events.append(("synced", source))

    def take(self) -> list[tuple[str, str]]:
        events, self.events = self.events, []
        return events


def api_service(name: str, port: int = 80, **labels: str) -> dict[str, Any]:
    """A minimal v1 Service as the API serves it (ClusterIP 10.96.0.10)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": port}]},
    }


def annotated_service(annotations: dict[str, Any] | None) -> dict[str, Any]:
    """`api_service("web")` with these metadata.annotations (None: the key present, null)."""
    obj = api_service("web")
    obj["metadata"]["annotations"] = annotations
    return obj


def api_service_cidr(*cidrs: str, name: str = "kubernetes") -> dict[str, Any]:
    """A networking.k8s.io/v1 ServiceCIDR (the API server's own is named `kubernetes`)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "ServiceCIDR",
        "metadata": {"name": name},
        "spec": {"cidrs": list(cidrs)},
    }


def api_slice(name: str, service: str, ip: str = "10.0.0.1") -> dict[str, Any]:
    """A minimal EndpointSlice of one endpoint on port 8080."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": "IPv4",
        "ports": [{"port": 8080}],
        "endpoints": [{"addresses": [ip]}],
    }


async def eventually(check: Callable[[], Any], timeout: float = 10.0) -> None:
    """Wait until check() (a bool, or a coroutine giving one) holds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        assert asyncio.get_running_loop().time() < deadline, "not reached in time"
        await asyncio.sleep(0.02)


#: Wrong values of every JSON type, for the parsers' fuzz tests.
JUNK = [None, "", "x", 0, 70000, -1, True, 1.5, [], [1], ["x"], {}, {"a": 1}]


def json_paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path to a value inside a JSON tree."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, child in items:
        yield (*prefix, key)
        if isinstance(child, dict | list):
            yield from json_paths(child, (*prefix, key))


def with_junk(base: dict[str, Any]) -> Iterator[tuple[tuple[Any, ...], Any, dict[str, Any]]]:
    """(path, junk, a copy of `base` with that junk at that path), for every path and junk."""
    for path in json_paths(base):
        for junk in JUNK:
            obj = copy.deepcopy(base)
            target = obj
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = junk
            yield path, junk, obj


def assert_junk_is_rejected_cleanly(base: dict[str, Any]) -> None:
    """Junk at any place of a valid object gives a ValidationError or a model, never a crash."""
    from lace_proxy.model import ValidationError, parse_object

    for path, junk, obj in with_junk(base):
        try:
            parse_object(obj)
        except ValidationError as error:
            assert error.code, (path, junk)
            str(error)


def exercise_metrics(m: ProxyMetrics) -> None:
    """The recording calls the proxier, sources, health and egress make, so that every family
    (including those with no label value until something is recorded) has samples."""
    m.record_change("service", "default/web")
    m.record_change("endpoints", "default/web-abc", trigger_time=1.0, family="IPv4")
    m.record_queued()
    m.record_sync(0.02, full=True, ok=True)
    m.record_sync(0.01, full=False, ok=False)
    m.record_rejection("Service", "invalid_port")
    m.source_event("relist", "services")
    m.source_event("watch_restart", "endpointslices")
    m.record_conditions(["unknown_network"])
    m.record_egress_sync(True, 2)
    m.record_healthz(200)
    m.record_livez(503)
    m.record_healthcheck_bind_failure()
    m.record_udp_flows_moved(3, 1)
