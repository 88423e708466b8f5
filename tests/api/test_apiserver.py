"""The API emulator, exercised over real HTTP with the real `kubernetes` client.

Where the client hides what the server sent (list item shapes, Status bodies, the end of a
watch stream), the test speaks raw HTTP. Each assertion is a behaviour of the real API
server that the proxy's watcher relies on.
"""

from __future__ import annotations

import http.client
import itertools
import json
import socket
import threading
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from lace_proxy.sandbox.apiserver import ApiError, ApiServer

from .conftest import BOOKMARK_INTERVAL

Obj = dict[str, Any]


def service(name: str, namespace: str = "default", labels: dict[str, str] | None = None) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {"ports": [{"port": 80, "protocol": "TCP"}]},
    }


def network(name: str) -> Obj:
    return {
        "apiVersion": "lace-cni.io/v1alpha1",
        "kind": "Network",
        "metadata": {"name": name},
        "spec": {"type": "l3", "ipv4Subnet": {"prefix": "10.1.0.0/16"}},
    }


def rv_of(obj: Obj) -> int:
    return int(obj["metadata"]["resourceVersion"])


Stream = Generator[Any, None, None]


def first(stream: Stream, count: int) -> list[Obj]:
    """The first ``count`` events of a watch stream, then close it."""
    events = list(itertools.islice(stream, count))
    stream.close()
    return events


def until_bookmark(stream: Stream) -> list[Obj]:
    """The events before the first BOOKMARK, then close the stream. Bookmarks come every
    BOOKMARK_INTERVAL, after the replay a watch starts with: this is all it had to catch up."""
    events = list(itertools.takewhile(lambda event: event["type"] != "BOOKMARK", stream))
    stream.close()
    return events


def dynamic(kube: client.ApiClient, tmp_path: Path) -> DynamicClient:
    """A dynamic client whose discovery cache is this test's own (the default one is shared
    in /tmp and keyed by URL, and ports get reused)."""
    return DynamicClient(kube, cache_file=str(tmp_path / "discovery.json"))


def request(
    api: ApiServer, method: str, path: str, body: Any = None, content_type: str = "application/json"
) -> tuple[int, Any]:
    """One raw request: the status and the body (parsed if JSON)."""
    conn = http.client.HTTPConnection("127.0.0.1", urlsplit(api.url).port, timeout=5)
    try:
        data = None if body is None else json.dumps(body)
        conn.request(method, path, body=data, headers={"Content-Type": content_type})
        response = conn.getresponse()
        text = response.read().decode()
        is_json = "json" in (response.getheader("Content-Type") or "")
        return response.status, json.loads(text) if is_json else text
    finally:
        conn.close()


def raw_watch(api: ApiServer, path: str) -> Stream:
    """The events of a raw watch request, read line by line until the server ends it."""
    conn = http.client.HTTPConnection("127.0.0.1", urlsplit(api.url).port, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        assert response.status == 200
        assert response.getheader("Transfer-Encoding") == "chunked"
        while line := response.readline():
            yield json.loads(line)
    finally:
        conn.close()


# -- connection and lists -------------------------------------------------------------------


def test_kubeconfig_points_the_client_at_the_loopback_server(api, kube):
    assert api.url.startswith("http://127.0.0.1:")
    assert kube.configuration.host == api.url
    assert client.CoreV1Api(kube).list_namespaced_service("default").items == []


def test_list_carries_the_current_resource_version_and_stamped_objects(api, kube):
    api.apply(service("web"))
    api.apply(service("db", "prod"))
    api.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    core = client.CoreV1Api(kube)

    listed = core.list_service_for_all_namespaces()
    assert listed.metadata.resource_version == str(api.resource_version)
    assert [(s.metadata.namespace, s.metadata.name) for s in listed.items] == [
        ("default", "web"),
        ("prod", "db"),
    ]
    versions = [int(s.metadata.resource_version) for s in listed.items]
    assert versions[0] < versions[1] < api.resource_version  # the node came last
    for svc in listed.items:
        assert svc.metadata.uid and svc.metadata.creation_timestamp
        assert svc.metadata.generation == 1
    assert [s.metadata.name for s in core.list_namespaced_service("prod").items] == ["db"]

    status, raw = request(api, "GET", "/api/v1/services")
    assert status == 200
    assert (raw["kind"], raw["apiVersion"]) == ("ServiceList", "v1")
    assert "kind" not in raw["items"][0]  # built-in list items carry no type, as upstream


def test_get_and_a_missing_object(api, kube):
    api.apply(service("web"))
    core = client.CoreV1Api(kube)
    assert core.read_namespaced_service("web", "default").spec.ports[0].port == 80
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_service("nope", "default")
    status = json.loads(missing.value.body)
    assert (missing.value.status, status["kind"], status["reason"]) == (404, "Status", "NotFound")
    assert status["message"] == 'services "nope" not found'
    # Unknown paths are the mux's plain-text 404, not a Status.
    assert request(api, "GET", "/api/v1/widgets") == (404, "404 page not found\n")


def test_endpointslices_and_nodes_are_served_at_their_scopes(api, kube):
    api.apply(
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"name": "web-abc", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.1.0.5"]}],
            "ports": [{"port": 8080}],
        }
    )
    api.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    slices = client.DiscoveryV1Api(kube)
    everywhere = slices.list_endpoint_slice_for_all_namespaces()
    assert everywhere.metadata.resource_version == str(api.resource_version)
    assert everywhere.items[0].endpoints[0].addresses == ["10.1.0.5"]
    selected = slices.list_namespaced_endpoint_slice(
        "default", label_selector="kubernetes.io/service-name=web"
    )
    assert [s.metadata.name for s in selected.items] == ["web-abc"]
    assert [n.metadata.name for n in client.CoreV1Api(kube).list_node().items] == ["n1"]
    assert "namespace" not in api.get("Node", None, "n1")["metadata"]
    assert request(api, "GET", "/api/v1/namespaces/default/nodes")[0] == 404


def test_paginated_list_is_a_consistent_snapshot(api, kube):
    for name in "abcde":
        api.apply(service(name))
    core = client.CoreV1Api(kube)
    page = core.list_namespaced_service("default", limit=2)
    assert [s.metadata.name for s in page.items] == ["a", "b"]
    assert page.metadata.remaining_item_count == 3
    snapshot = page.metadata.resource_version

    api.delete("Service", "default", "d")  # changes after the first page stay invisible
    api.apply(service("f"))
    page = core.list_namespaced_service("default", limit=2, _continue=page.metadata._continue)
    assert [s.metadata.name for s in page.items] == ["c", "d"]
    assert page.metadata.resource_version == snapshot
    page = core.list_namespaced_service("default", limit=2, _continue=page.metadata._continue)
    assert [s.metadata.name for s in page.items] == ["e"]
    assert page.metadata._continue is None

    token = core.list_namespaced_service("default", limit=1).metadata._continue
    api.apply(service("g"))
    api.expire_history()
    with pytest.raises(ApiException) as expired:
        core.list_namespaced_service("default", limit=1, _continue=token)
    assert (expired.value.status, json.loads(expired.value.body)["reason"]) == (410, "Expired")


def test_list_at_an_exact_version_and_from_the_future(api):
    api.apply(service("a"))
    before = api.resource_version
    api.apply(service("b"))
    status, old = request(
        api, "GET", f"/api/v1/services?resourceVersion={before}&resourceVersionMatch=Exact"
    )
    assert status == 200
    assert [s["metadata"]["name"] for s in old["items"]] == ["a"]
    assert old["metadata"]["resourceVersion"] == str(before)
    # A version the server has not reached is a 504 Timeout naming ResourceVersionTooLarge.
    status, body = request(api, "GET", f"/api/v1/services?resourceVersion={before + 100}")
    assert (status, body["details"]["causes"][0]["reason"]) == (504, "ResourceVersionTooLarge")


# -- selectors -------------------------------------------------------------------------------

LABELLED = {
    "web": {"app": "web", "tier": "front", "weight": "5"},
    "api": {"app": "api", "tier": "back", "weight": "20"},
    "db": {"app": "db", "example.com/critical": ""},
    "bare": {},
}


@pytest.mark.parametrize(
    ("selector", "names"),
    [
        ("app=web", ["web"]),
        ("app==web", ["web"]),
        ("app!=web", ["api", "bare", "db"]),  # != also matches objects without the key
        ("app in (web, api)", ["api", "web"]),
        ("app notin (web,api)", ["bare", "db"]),
        ("tier", ["api", "web"]),
        ("!tier", ["bare", "db"]),
        ("example.com/critical", ["db"]),
        ("example.com/critical=", ["db"]),
        ("app,tier=back", ["api"]),
        ("  app = web ,  tier  ", ["web"]),
        ("weight>10", ["api"]),
        ("weight<10", ["web"]),
        ("app in (web),!weight", []),
        ("", ["api", "bare", "db", "web"]),
    ],
)
def test_label_selector_grammar(api, selector, names):
    for name, labels in LABELLED.items():
        api.apply(service(name, labels=labels))
    status, body = request(api, "GET", f"/api/v1/services?labelSelector={quote(selector)}")
    assert status == 200
    assert [s["metadata"]["name"] for s in body["items"]] == names


@pytest.mark.parametrize(
    "selector", ["app in ()", "app in (a", "=web", "app web", "app>x", "-bad=1", "a=b c"]
)
def test_malformed_label_selectors_are_bad_requests(api, selector):
    status, body = request(api, "GET", f"/api/v1/services?labelSelector={quote(selector)}")
    assert (status, body["reason"]) == (400, "BadRequest")


def test_field_selectors(api, kube):
    api.apply(service("web"))
    api.apply(service("web", "prod"))
    api.apply(service("db", "prod"))
    core = client.CoreV1Api(kube)

    def names(selector: str) -> list[str]:
        found = core.list_service_for_all_namespaces(field_selector=selector).items
        return [f"{s.metadata.namespace}/{s.metadata.name}" for s in found]

    assert names("metadata.name=web") == ["default/web", "prod/web"]
    assert names("metadata.namespace==prod,metadata.name!=web") == ["prod/db"]
    with pytest.raises(ApiException) as unsupported:
        names("spec.clusterIP=10.0.0.1")
    assert unsupported.value.status == 400
    assert "field label not supported" in json.loads(unsupported.value.body)["message"]


# -- writes ----------------------------------------------------------------------------------


def test_create_replace_and_delete_over_http(api, kube):
    core = client.CoreV1Api(kube)
    created = core.create_namespaced_service("default", service("web"))
    assert int(created.metadata.resource_version) == api.resource_version
    with pytest.raises(ApiException) as exists:
        core.create_namespaced_service("default", service("web"))
    assert (exists.value.status, json.loads(exists.value.body)["reason"]) == (409, "AlreadyExists")

    changed = service("web")
    changed["spec"]["ports"][0]["port"] = 81
    changed["metadata"]["resourceVersion"] = created.metadata.resource_version
    replaced = core.replace_namespaced_service("web", "default", changed)
    assert replaced.metadata.generation == 2  # a spec change bumps the generation
    assert replaced.metadata.uid == created.metadata.uid
    with pytest.raises(ApiException) as stale:  # the same precondition is stale now
        core.replace_namespaced_service("web", "default", changed)
    assert (stale.value.status, json.loads(stale.value.body)["reason"]) == (409, "Conflict")

    deleted = core.delete_namespaced_service("web", "default")
    assert deleted.metadata.name == "web"  # services answer DELETE with the object
    assert api.get("Service", "default", "web") is None
    status, body = request(api, "DELETE", "/api/v1/nodes/none")
    assert (status, body["reason"]) == (404, "NotFound")


def test_patches(api, kube):
    api.apply(service("web"))
    core = client.CoreV1Api(kube)
    before = api.resource_version
    # A dict body goes out as a strategic merge patch; a metadata change keeps the generation.
    patched = core.patch_namespaced_service("web", "default", {"metadata": {"labels": {"a": "1"}}})
    assert patched.metadata.labels == {"a": "1"}
    assert (int(patched.metadata.resource_version), patched.metadata.generation) == (before + 1, 1)
    # A list body goes out as a JSON patch.
    patched = core.patch_namespaced_service(
        "web", "default", [{"op": "replace", "path": "/spec/ports/0/port", "value": 90}]
    )
    assert (patched.spec.ports[0].port, patched.metadata.generation) == (90, 2)
    status, body = request(
        api,
        "PATCH",
        "/api/v1/namespaces/default/services/web",
        {"metadata": {"labels": {"a": None, "b": "2"}, "resourceVersion": "1"}},
        "application/merge-patch+json",
    )
    assert (status, body["reason"]) == (409, "Conflict")  # a pinned stale version
    status, body = request(
        api,
        "PATCH",
        "/api/v1/namespaces/default/services/web",
        {"metadata": {"labels": {"a": None, "b": "2"}}},
        "application/merge-patch+json",
    )
    assert (status, body["metadata"]["labels"]) == (200, {"b": "2"})
    status, body = request(
        api, "PATCH", "/api/v1/namespaces/default/services/web", [{"op": "test", "path": "/x"}],
        "application/json-patch+json",
    )  # fmt: skip
    assert status == 422


def test_a_write_that_changes_nothing_makes_no_version_and_no_event(api, kube):
    stored = api.apply(service("web"))
    core = client.CoreV1Api(kube)
    unchanged = core.replace_namespaced_service("web", "default", service("web"))
    assert unchanged.metadata.resource_version == stored["metadata"]["resourceVersion"]
    assert api.apply(service("web")) == stored
    assert api.resource_version == rv_of(stored)


def test_the_python_api_is_thread_safe(api):
    def writer(index: int) -> None:
        for n in range(50):
            api.apply(service(f"s{index}-{n % 10}", labels={"n": str(n)}))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert api.resource_version == 1 + 200  # every write got its own version
    assert len(api.list("Service")) == 40
    events = until_bookmark(
        raw_watch(api, "/api/v1/services?watch=1&resourceVersion=1&allowWatchBookmarks=1")
    )
    assert [rv_of(e["object"]) for e in events] == list(range(2, 202))
    assert sum(e["type"] == "ADDED" for e in events) == 40


# -- watches ---------------------------------------------------------------------------------


def test_watch_streams_added_modified_deleted(api, kube, when_watching):
    core = client.CoreV1Api(kube)
    start = core.list_namespaced_service("default").metadata.resource_version

    def writes() -> None:
        core.create_namespaced_service("default", service("web"))
        core.patch_namespaced_service("web", "default", {"metadata": {"labels": {"a": "1"}}})
        core.delete_namespaced_service("web", "default")

    when_watching(writes)
    stream = watch.Watch().stream(
        core.list_namespaced_service, "default", resource_version=start, timeout_seconds=5
    )
    events = first(stream, 3)
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert isinstance(events[0]["object"], client.V1Service)
    versions = [int(e["object"].metadata.resource_version) for e in events]
    # A deletion's object is the last state, stamped with the deletion's version.
    assert versions == [int(start) + 1, int(start) + 2, int(start) + 3]
    assert events[2]["object"].metadata.labels == {"a": "1"}


def test_watch_from_a_version_replays_only_later_changes(api, kube):
    api.apply(service("a"))
    after_a = api.resource_version
    api.apply(service("b"))
    api.apply(service("a", labels={"x": "1"}))
    core = client.CoreV1Api(kube)

    def replay(since: int) -> list[tuple[str, str]]:
        stream = watch.Watch().stream(
            core.list_namespaced_service,
            "default",
            resource_version=str(since),
            allow_watch_bookmarks=True,
        )
        return [(e["type"], e["object"].metadata.name) for e in until_bookmark(stream)]

    assert replay(after_a) == [("ADDED", "b"), ("MODIFIED", "a")]
    assert replay(after_a + 1) == [("MODIFIED", "a")]


@pytest.mark.parametrize("version", ["", "&resourceVersion=0", "&resourceVersion="])
def test_watch_without_a_version_starts_with_the_current_state(api, version, when_watching):
    api.apply(service("a"))
    api.apply(service("b", "prod"))
    when_watching(lambda: api.apply(service("c")))
    stream = raw_watch(api, f"/api/v1/services?watch=true{version}")
    events = [(e["type"], e["object"]["metadata"]["name"]) for e in first(stream, 3)]
    assert events == [("ADDED", "a"), ("ADDED", "b"), ("ADDED", "c")]


def test_watch_of_a_single_object(api):
    api.apply(service("a"))
    api.apply(service("b"))
    api.apply(service("a", labels={"x": "1"}))
    path = "/api/v1/namespaces/default/services/a?watch=1&resourceVersion=1&allowWatchBookmarks=1"
    assert [e["type"] for e in until_bookmark(raw_watch(api, path))] == ["ADDED", "MODIFIED"]


def test_selector_watch_sees_objects_enter_and_leave(api, kube, when_watching):
    api.apply(service("web", labels={"app": "web"}))
    api.apply(service("other", labels={"app": "other"}))
    start = api.resource_version

    def writes() -> None:
        api.apply(service("other", labels={"app": "other", "touched": "1"}))  # never matched
        api.apply(service("web", labels={"app": "moved"}))  # stops matching
        api.apply(service("web", labels={"app": "web", "back": "1"}))  # matches again
        api.delete("Service", "default", "web")

    when_watching(writes)
    core = client.CoreV1Api(kube)
    stream = watch.Watch().stream(
        core.list_namespaced_service,
        "default",
        label_selector="app=web",
        resource_version=str(start),
        timeout_seconds=5,
    )
    events = [(e["type"], e["raw_object"]) for e in first(stream, 3)]
    assert [t for t, _ in events] == ["DELETED", "ADDED", "DELETED"]
    left = events[0][1]
    # Leaving the selection reports the last matching state at the change's version.
    assert left["metadata"]["labels"] == {"app": "web"}
    assert rv_of(left) == start + 2
    assert events[1][1]["metadata"]["labels"] == {"app": "web", "back": "1"}


def test_bookmarks_carry_the_current_version(api, kube, when_watching):
    api.apply(service("web"))
    core = client.CoreV1Api(kube)
    stream = watch.Watch().stream(
        core.list_namespaced_service,
        "default",
        resource_version=str(api.resource_version),
        allow_watch_bookmarks=True,
        timeout_seconds=5,
    )
    first_bookmark = next(stream)
    assert first_bookmark["type"] == "BOOKMARK"
    assert first_bookmark["raw_object"] == {
        "kind": "Service",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": str(api.resource_version)},
    }
    api.apply(service("web", labels={"a": "1"}))
    api.apply(service("elsewhere", "prod"))  # another namespace: only the version moves
    modified, bookmark = first(stream, 2)
    assert modified["type"] == "MODIFIED"
    assert bookmark["type"] == "BOOKMARK"
    assert rv_of(bookmark["raw_object"]) == api.resource_version


def test_send_initial_events_ends_with_an_annotated_bookmark(api):
    api.apply(service("a"))
    path = (
        "/api/v1/services?watch=1&sendInitialEvents=true&allowWatchBookmarks=true"
        "&resourceVersionMatch=NotOlderThan"
    )
    added, end = first(raw_watch(api, path), 2)
    assert added["type"] == "ADDED"
    assert end["type"] == "BOOKMARK"
    assert end["object"]["metadata"] == {
        "resourceVersion": str(api.resource_version),
        "annotations": {"k8s.io/initial-events-end": "true"},
    }


def test_timeout_seconds_ends_a_watch_cleanly(api, kube):
    started = time.monotonic()
    core = client.CoreV1Api(kube)
    events = list(watch.Watch().stream(core.list_node, timeout_seconds=1))
    assert events == []
    assert time.monotonic() - started >= 1
    assert api.open_watches == 0


def test_drop_watches_ends_the_stream_abruptly(api, kube, when_watching):
    core = client.CoreV1Api(kube)
    dropped: list[int] = []
    dropper = when_watching(lambda: dropped.append(api.drop_watches()))
    with pytest.raises(urllib3.exceptions.ProtocolError, match="ended prematurely"):
        list(watch.Watch().stream(core.list_node, timeout_seconds=10))
    dropper.join()
    assert dropped == [1]
    assert api.open_watches == 0


def test_a_client_that_leaves_frees_its_watch(api, kube):
    stream = watch.Watch().stream(
        client.CoreV1Api(kube).list_node, allow_watch_bookmarks=True, timeout_seconds=10
    )
    assert next(stream)["type"] == "BOOKMARK"
    assert api.open_watches == 1
    stream.close()
    deadline = time.monotonic() + 5
    while api.open_watches and time.monotonic() < deadline:
        time.sleep(0.01)
    assert api.open_watches == 0


# -- 410 Gone --------------------------------------------------------------------------------


def test_resuming_from_expired_history_is_an_error_event(api):
    api.apply(service("a"))
    old = api.resource_version
    api.apply(service("b"))
    api.expire_history()
    (event,) = raw_watch(api, f"/api/v1/services?watch=1&resourceVersion={old}")
    assert event["type"] == "ERROR"
    assert event["object"] == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"too old resource version: {old} ({api.resource_version})",
        "reason": "Expired",
        "code": 410,
    }
    # The current version itself is still a valid place to resume from.
    now = f"/api/v1/services?watch=1&resourceVersion={api.resource_version}&allowWatchBookmarks=1"
    assert until_bookmark(raw_watch(api, now)) == []


def test_the_kubernetes_watch_retries_a_410_once_then_raises(api, kube):
    api.apply(service("a"))
    old = str(api.resource_version)
    api.apply(service("b"))
    api.expire_history()
    core = client.CoreV1Api(kube)
    with pytest.raises(ApiException) as gone:
        list(watch.Watch().stream(core.list_namespaced_service, "default", resource_version=old))
    assert gone.value.status == 410
    watches = [r for r in api.requests() if r.query.get("watch") == "true"]
    assert [r.query["resourceVersion"] for r in watches] == [old, old]


@pytest.mark.parametrize("api", [{"history": 3}], indirect=True)
def test_the_history_is_bounded(api):
    for n in range(5):
        api.apply(service(f"s{n}"))  # versions 2..6; 4, 5 and 6 are kept
    (gone,) = raw_watch(api, "/api/v1/services?watch=1&resourceVersion=2")
    assert (gone["type"], gone["object"]["code"]) == ("ERROR", 410)
    kept = raw_watch(api, "/api/v1/services?watch=1&resourceVersion=3&allowWatchBookmarks=1")
    assert [e["object"]["metadata"]["name"] for e in until_bookmark(kept)] == ["s2", "s3", "s4"]


# -- faults ----------------------------------------------------------------------------------


def test_unavailable_answers_503_then_recovers(api, kube):
    core = client.CoreV1Api(kube)
    api.unavailable(True)
    with pytest.raises(ApiException) as down:
        core.list_node()
    assert (down.value.status, json.loads(down.value.body)["reason"]) == (503, "ServiceUnavailable")
    api.unavailable(False)
    assert core.list_node().items == []


def test_unavailable_refusing_connections_then_recovers(api, kube, when_watching):
    core = client.CoreV1Api(kube)
    core.list_node()  # leaves a kept-alive connection in the client's pool
    port = urlsplit(api.url).port
    when_watching(lambda: api.unavailable(True, refuse=True))
    with pytest.raises(urllib3.exceptions.ProtocolError):
        list(watch.Watch().stream(core.list_node, timeout_seconds=10))
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    with pytest.raises(urllib3.exceptions.MaxRetryError, match="Connection refused"):
        core.list_node()
    api.unavailable(False)
    assert urlsplit(api.url).port == port
    assert core.list_node().items == []


def test_stall_times_out_a_client_with_a_read_timeout(api, kube):
    core = client.CoreV1Api(kube)
    api.stall(30)
    try:
        # urllib3 retries a timed-out GET three times before giving up.
        with pytest.raises(urllib3.exceptions.MaxRetryError, match="Read timed out"):
            core.list_node(_request_timeout=(1, 0.1))
    finally:
        api.stall(0)
    assert core.list_node().items == []


def test_stall_silences_an_open_watch(api, kube):
    core = client.CoreV1Api(kube)
    stream = watch.Watch().stream(
        core.list_node, allow_watch_bookmarks=True, _request_timeout=(1, 4 * BOOKMARK_INTERVAL)
    )
    assert next(stream)["type"] == "BOOKMARK"  # bookmarks keep a healthy stream talking
    api.stall(30)
    try:
        with pytest.raises(urllib3.exceptions.ReadTimeoutError):
            next(stream)
    finally:
        api.stall(0)


def test_latency_delays_every_response(api, kube):
    api.latency(0.3)
    started = time.monotonic()
    client.CoreV1Api(kube).list_node()
    assert time.monotonic() - started >= 0.3


# -- lace-cni.io resources, discovery, events ------------------------------------------------


def test_lace_resources_are_absent_unless_enabled(api, kube, tmp_path):
    assert request(api, "GET", "/apis/lace-cni.io/v1alpha1/networks") == (
        404,
        "404 page not found\n",
    )
    assert request(api, "GET", "/apis/lace-cni.io/v1alpha1")[0] == 404
    groups = [g["name"] for g in request(api, "GET", "/apis")[1]["groups"]]
    assert groups == ["discovery.k8s.io", "networking.k8s.io"]
    with pytest.raises(ApiException) as missing:
        client.CustomObjectsApi(kube).list_cluster_custom_object(
            "lace-cni.io", "v1alpha1", "networks"
        )
    assert missing.value.status == 404
    with pytest.raises(ResourceNotFoundError):
        dynamic(kube, tmp_path).resources.get(api_version="lace-cni.io/v1alpha1", kind="Network")
    with pytest.raises(ApiError):
        api.apply(network("pods"))


@pytest.mark.parametrize("api", [{"lace_crds": True}], indirect=True)
def test_lace_resources_when_enabled(api, kube, when_watching, tmp_path):
    status, resources = request(api, "GET", "/apis/lace-cni.io/v1alpha1")
    assert status == 200
    assert {(r["name"], r["kind"], r["namespaced"]) for r in resources["resources"]} == {
        ("networks", "Network", False),
        ("networkbindingpolicies", "NetworkBindingPolicy", False),
        ("networkroutingpolicies", "NetworkRoutingPolicy", False),
        ("serviceroutingpolicies", "ServiceRoutingPolicy", False),
    }
    assert dynamic(kube, tmp_path).resources.get(
        api_version="lace-cni.io/v1alpha1", kind="ServiceRoutingPolicy"
    )
    custom = client.CustomObjectsApi(kube)
    gvp = ("lace-cni.io", "v1alpha1", "networks")
    custom.create_cluster_custom_object(*gvp, network("pods"))
    listed = custom.list_cluster_custom_object(*gvp)
    assert listed["kind"] == "NetworkList"
    assert listed["items"][0]["kind"] == "Network"  # custom resources keep their type
    patched = custom.patch_cluster_custom_object(*gvp, "pods", {"spec": {"type": "l2"}})
    assert (patched["spec"]["type"], patched["metadata"]["generation"]) == ("l2", 2)
    status, _ = request(
        api, "PATCH", "/apis/lace-cni.io/v1alpha1/networks/pods", {"spec": {}},
        "application/strategic-merge-patch+json",
    )  # fmt: skip
    assert status == 415  # as upstream: no strategic merge for custom resources

    when_watching(lambda: api.apply(network("internet")))
    stream = watch.Watch().stream(
        custom.list_cluster_custom_object, *gvp, resource_version=str(rv_of(patched))
    )
    (added,) = first(stream, 1)
    assert (added["type"], added["object"]["metadata"]["name"]) == ("ADDED", "internet")


def test_lace_crds_can_come_and_go_while_running(api, kube, when_watching):
    api.set_lace_crds(True)
    api.apply(network("pods"))
    custom = client.CustomObjectsApi(kube)
    start = str(api.resource_version)
    when_watching(lambda: api.set_lace_crds(False))
    stream = watch.Watch().stream(
        custom.list_cluster_custom_object,
        "lace-cni.io",
        "v1alpha1",
        "networks",
        resource_version=start,
        timeout_seconds=10,
    )
    # Removing the CRD deletes its objects, then ends the watch.
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in stream] == [("DELETED", "pods")]
    assert not api.lace_crds
    assert request(api, "GET", "/apis/lace-cni.io/v1alpha1/networks")[0] == 404


def test_discovery_is_what_the_dynamic_client_needs(api, kube, tmp_path):
    status, core = request(api, "GET", "/api")
    assert (status, core["kind"], core["versions"]) == (200, "APIVersions", ["v1"])
    status, v1 = request(api, "GET", "/api/v1")
    assert (v1["kind"], v1["groupVersion"]) == ("APIResourceList", "v1")
    assert {r["name"] for r in v1["resources"]} == {"services", "nodes", "events"}
    status, group = request(api, "GET", "/apis/discovery.k8s.io")
    assert group["preferredVersion"] == {"groupVersion": "discovery.k8s.io/v1", "version": "v1"}
    discovered = dynamic(kube, tmp_path).resources
    slices = discovered.get(api_version="discovery.k8s.io/v1", kind="EndpointSlice")
    assert slices.namespaced
    assert discovered.get(api_version="v1", kind="Node").namespaced is False
    assert client.VersionApi(kube).get_code().major == "1"


def test_events_are_recorded(api, kube):
    core = client.CoreV1Api(kube)
    event = {
        "metadata": {"generateName": "web."},
        "involvedObject": {"kind": "Service", "namespace": "default", "name": "web"},
        "reason": "Synced",
        "message": "programmed 2 endpoints",
        "type": "Normal",
    }
    core.create_namespaced_event("default", event)
    (recorded,) = api.events()
    assert recorded["reason"] == "Synced"
    assert recorded["metadata"]["name"].startswith("web.")
    assert rv_of(recorded) == api.resource_version
    # Events are create-only here.
    status, body = request(api, "GET", "/api/v1/namespaces/default/events")
    assert (status, body["reason"]) == (405, "MethodNotAllowed")
