"""The real control plane, from a test's side: a REST helper for every kind, the objects the
source reads, the `kube` source running with a recording handler, and the fixtures for them.

Shared by tests/api (the source against the real kube-apiserver) and tests/netns (the proxy
end to end); the control plane itself is testkit.controlplane.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from lace_proxy.model import LACE_GROUP_VERSION, ZONE_LABEL
from lace_proxy.sources.kube import SOURCE_NAME, ApiConnection, KubeSource, Reflector, Timing
from testkit.controlplane.cluster import ControlPlane
from testkit.controlplane.faultproxy import FaultProxy
from testkit.controlplane.faults import Cut, can_cut
from testkit.controlplane.pytest_plugin import control_plane, real_kube

from . import crdschema
from .helpers import Recorder, api_service, api_slice

__all__ = ["control_plane", "real_kube"]  # fixtures, re-exported for the conftest

#: The real server sends a watch nothing while its resource does not change, not even a
#: bookmark, until it ends the watch at timeoutSeconds (3..6 s here), with a bookmark 2 s
#: before if the resource moved while the watch was open; so the read timeout must outlast
#: the longest watch.
REAL = Timing(
    connect_timeout=1.0,
    read_timeout=8.0,
    watch_timeout=3,
    backoff_initial=0.05,
    backoff_max=0.3,
    rediscover=0.2,
)

#: The chart's CRDs, as Helm installs them (read once, by crdschema).
CRDS = [doc for _, doc in crdschema.CRDS.values()]
LACE_PLURALS = {kind: doc["spec"]["names"]["plural"] for kind, (_, doc) in crdschema.CRDS.items()}
_COLLECTIONS = {
    "Service": "/api/v1/namespaces/{namespace}/services",
    "EndpointSlice": "/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
    "Node": "/api/v1/nodes",
    "ServiceCIDR": "/apis/networking.k8s.io/v1/servicecidrs",
    "Event": "/api/v1/namespaces/{namespace}/events",
    "CustomResourceDefinition": "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    **{kind: f"/apis/{LACE_GROUP_VERSION}/{plural}" for kind, plural in LACE_PLURALS.items()},
}


def unique(prefix: str) -> str:
    """Names unique per test: the session's control plane is shared."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def where(kind: str, name: str = "", namespace: str = "") -> str:
    path = _COLLECTIONS[kind].format(namespace=namespace)
    return f"{path}/{name}" if name else path


# --- talking to the server ----------------------------------------------------------------------


class Rest:
    """Raw REST through a `kubernetes` ApiClient, as (status, JSON body): one helper for every
    kind (built-in and custom), and refusals returned rather than raised."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, dict[str, Any]]:
        request = self.api.param_serialize(
            method,
            path,
            query_params=list((query or {}).items()),
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(*request, _request_timeout=(5, 10))
        response.read()
        return response.status, json.loads(response.data) if response.data else {}

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        status, body = self.call("POST", where(obj["kind"], "", meta.get("namespace", "")), obj)
        assert status == 201, body
        return body

    def merge(self, kind: str, name: str, patch: dict[str, Any], namespace: str = "") -> None:
        status, body = self.call(
            "PATCH",
            where(kind, name, namespace),
            patch,
            content_type="application/merge-patch+json",
        )
        assert status == 200, body

    def delete(self, kind: str, name: str, namespace: str = "") -> None:
        status, body = self.call("DELETE", where(kind, name, namespace))
        assert status in (200, 202), body


def served(plane: ControlPlane, **labels: str) -> int:
    """How many requests the apiserver counted (apiserver_request_total) with these labels:
    the server's own view of what a client did."""
    status, body = plane.get("/metrics")
    assert status == 200
    total = 0
    for line in body.decode().splitlines():
        if line.startswith("apiserver_request_total{"):
            found = dict(re.findall(r'(\w+)="([^"]*)"', line[: line.rindex("}")]))
            if all(found.get(k) == v for k, v in labels.items()):
                total += int(float(line.rsplit(" ", 1)[1]))
    return total


def lists(plane: ControlPlane) -> dict[str, int]:
    """The LISTs the server answered, per resource the source reads."""
    return {
        resource: served(plane, verb="LIST", resource=resource)
        for resource in ("services", "endpointslices", "nodes", "servicecidrs")
    }


# --- objects ------------------------------------------------------------------------------------


def service(name: str, namespace: str, port: int = 80, **labels: str) -> dict[str, Any]:
    """A Service whose ClusterIP the server allocates (api_service's fixed one would clash)."""
    obj = api_service(name, port, **labels)
    obj["metadata"]["namespace"] = namespace
    obj["spec"] = {"ports": [{"port": port}]}
    return obj


def endpoint_slice(name: str, namespace: str, svc: str, ip: str, **labels: str) -> dict[str, Any]:
    obj = api_slice(name, svc, ip)
    obj["metadata"]["namespace"] = namespace
    obj["metadata"]["labels"].update(labels)
    return obj


def node(name: str, zone: str = "a") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {ZONE_LABEL: zone}},
    }


# --- the source, running ------------------------------------------------------------------------


class Running:
    """A KubeSource on the test's event loop with a Recorder as its handler (as in
    test_kube_source.py); `take` keeps only events about this test's objects, since the
    session's control plane holds other tests' objects too."""

    def __init__(self, kubeconfig: Path, node_name: str, timing: Timing, mine: tuple[str, ...]):
        self.recorder = Recorder()
        self.mine = mine
        self.contact: list[tuple[str, bool]] = []
        self.source = KubeSource(
            ApiConnection(kubeconfig=str(kubeconfig)),
            self.recorder,
            node_name,
            timing=timing,
            on_contact=lambda resource, ok: self.contact.append((resource, ok)),
        )

    def synced(self) -> bool:
        return ("synced", SOURCE_NAME) in self.recorder.events

    def reflector(self, name: str) -> Reflector:
        return next(r for r in self.source.reflectors if r.resource.name == name)

    def _ours(self, event: tuple[str, str]) -> bool:
        key = event[1]
        return any(key == m or (m.endswith("/") and key.startswith(m)) for m in self.mine)

    def seen(self) -> list[tuple[str, str]]:
        return [e for e in self.recorder.events if self._ours(e)]

    def take(self) -> list[tuple[str, str]]:
        return [e for e in self.recorder.take() if self._ours(e)]


def run(
    kubeconfig: Path,
    scenario: Callable[[Running], Awaitable[None]],
    *,
    node_name: str = "no-such-node",
    mine: tuple[str, ...] = (),
    timing: Timing = REAL,
    runner: Callable[[Coroutine[Any, Any, None]], None] = asyncio.run,
) -> None:
    """Run the source with a Recorder until `scenario` returns (on `runner`'s loop)."""

    async def main() -> None:
        running = Running(kubeconfig, node_name, timing, mine)
        stop = asyncio.Event()
        task = asyncio.create_task(running.source.run(stop))
        try:
            await scenario(running)
        finally:
            stop.set()
            await task

    runner(main())


async def quiet_for(r: Running, seconds: float) -> None:
    """Assert that nothing about our objects arrives for `seconds` (an outage's length)."""
    deadline = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < deadline:
        assert r.seen() == []
        await asyncio.sleep(0.05)


def install_crds(admin: Rest) -> None:
    """The chart's CRDs, as Helm installs them, and wait until the API serves them."""
    for crd in CRDS:
        status, body = admin.call("POST", where("CustomResourceDefinition"), crd)
        assert status in (201, 409), body
    for crd in CRDS:
        wait_until(lambda crd=crd: _established(admin, crd["metadata"]["name"]))


def remove_crds(admin: Rest) -> None:
    """Delete the CRDs (and so every Lace object), and wait until they are gone."""
    for crd in CRDS:
        admin.call("DELETE", where("CustomResourceDefinition", crd["metadata"]["name"]))
    for crd in CRDS:
        name = crd["metadata"]["name"]
        wait_until(
            lambda name=name: admin.call("GET", where("CustomResourceDefinition", name))[0] == 404
        )


def _established(admin: Rest, name: str) -> bool:
    status, body = admin.call("GET", where("CustomResourceDefinition", name))
    # A CRD just created may show `"conditions": null` until the controller fills them.
    conditions = ((body.get("status") or {}).get("conditions") or []) if status == 200 else []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def wait_until(check: Callable[[], bool], timeout: float = 15.0) -> None:
    """Poll `check` until it holds (blocking: also called from a scenario, briefly)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.05)


# --- fixtures -----------------------------------------------------------------------------------


@pytest.fixture
def admin(real_kube: client.ApiClient) -> Rest:
    return Rest(real_kube)


@pytest.fixture
def namespace(admin: Rest) -> Iterator[str]:
    name = unique("src")
    admin.call("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    yield name
    # Nothing finalizes namespaces without kube-controller-manager: delete the contents.
    admin.call("DELETE", where("Service", namespace=name))
    admin.call("DELETE", where("EndpointSlice", namespace=name))


@pytest.fixture
def cuts() -> Iterator[Callable[[ControlPlane], Cut]]:
    """Cut(plane) for the test, removed afterwards."""
    reason = can_cut()
    if reason:
        pytest.skip(reason)
    made: list[Cut] = []

    def make(plane: ControlPlane) -> Cut:
        made.append(Cut(plane))
        return made[-1]

    yield make
    for cut in made:
        cut.close()


@pytest.fixture
def fault_proxy(control_plane: ControlPlane, tmp_path: Path) -> Iterator[FaultProxy]:
    """The session's apiserver behind a FaultProxy (the faults it cannot show itself)."""
    with FaultProxy(control_plane, tmp_path) as proxy:
        yield proxy
