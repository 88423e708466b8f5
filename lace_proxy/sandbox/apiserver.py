"""A Kubernetes API server emulator, for testing the proxy's watcher over real HTTP.

No kube-apiserver can be installed on the project's machines, and a patched client would test
the patch rather than the watcher. So this module serves the parts of the real protocol a
watcher depends on, with the real semantics:

* one global, monotonically increasing ``resourceVersion``; every write stamps the object's
  ``metadata`` (``resourceVersion``, ``uid``, ``creationTimestamp``, ``generation``), and a
  write that changes nothing changes nothing (no new version, no event);
* lists (``<Kind>List`` carrying the current version), ``limit``/``continue`` pages from a
  consistent snapshot, ``resourceVersionMatch=Exact``, label selectors (the whole set-based
  grammar) and ``metadata.name``/``metadata.namespace`` field selectors;
* watches from a version, replayed from a bounded history (older → an ``ERROR`` event with a
  410 ``Expired`` Status); ``""``/``"0"`` first send the current state as ``ADDED``; an object
  that stops matching a selector arrives as ``DELETED`` and one that starts matching as
  ``ADDED``; ``allowWatchBookmarks``, ``sendInitialEvents``, ``timeoutSeconds``;
* faults a test switches on while the server runs: dropped watches, stalls, outages (503 or
  refused connections), a forgotten history, latency, throttling (429 with Retry-After).

Served: core/v1 services, nodes and events (create only), discovery.k8s.io/v1 endpointslices
and, when enabled, the cluster-scoped lace-cni.io/v1alpha1 resources, plus discovery documents.
Test code mutates state through :meth:`ApiServer.apply` and :meth:`ApiServer.delete`, which go
through the same versioning and events as HTTP writes::

    with ApiServer(lace_crds=True, bookmark_interval=0.2) as api:
        api.apply({"apiVersion": "v1", "kind": "Service",
                   "metadata": {"name": "web", "namespace": "default"}, "spec": {...}})
        kubernetes.config.load_kube_config(config_file=str(api.kubeconfig_path))
        ...  # run the watcher against api.url
        api.drop_watches()

Loopback, plain HTTP, no authentication. Needs aiohttp (in the ``test`` extra).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import builtins
import contextlib
import copy
import json
import math
import re
import secrets
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from aiohttp import web

__all__ = ["ApiError", "ApiServer", "RecordedRequest"]

Obj = dict[str, Any]
Match = Callable[[Obj], bool]
_T = TypeVar("_T")

HOST = "127.0.0.1"
_VERBS = frozenset({"create", "delete", "get", "list", "patch", "update", "watch"})
_TRUE = frozenset({"1", "t", "T", "true", "TRUE", "True"})  # Go's strconv.ParseBool
_INITIAL_EVENTS_END = "k8s.io/initial-events-end"


@dataclass(frozen=True)
class Resource:
    """One served resource type; the router, the discovery documents and the store read it."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    verbs: frozenset[str] = _VERBS
    short_names: tuple[str, ...] = ()
    # DELETE answers with the object (services) rather than a Status (nodes, slices, CRs).
    returns_deleted_object: bool = False
    # Custom resources keep apiVersion/kind on list items and refuse strategic merge patches.
    custom: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """``plural.group``, as the API names a resource in its error messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


SERVICES = Resource(
    "", "v1", "Service", "services", True, short_names=("svc",), returns_deleted_object=True
)
NODES = Resource("", "v1", "Node", "nodes", False, short_names=("no",))
EVENTS = Resource("", "v1", "Event", "events", True, frozenset({"create"}), ("ev",))
ENDPOINT_SLICES = Resource("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", True)
SERVICE_CIDRS = Resource("networking.k8s.io", "v1", "ServiceCIDR", "servicecidrs", False)
LACE_RESOURCES = tuple(
    Resource("lace-cni.io", "v1alpha1", kind, plural, False, custom=True)
    for kind, plural in (
        ("Network", "networks"),
        ("NetworkBindingPolicy", "networkbindingpolicies"),
        ("NetworkRoutingPolicy", "networkroutingpolicies"),
        ("ServiceRoutingPolicy", "serviceroutingpolicies"),
    )
)
_BUILTIN = (SERVICES, NODES, EVENTS, ENDPOINT_SLICES, SERVICE_CIDRS)
_ALL = (*_BUILTIN, *LACE_RESOURCES)


# ---------------------------------------------------------------------------------------------
# Errors, as the API reports them


class ApiError(Exception):
    """A failure the API answers with a Status object; raised by the Python API too."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> Obj:
        status: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            status["details"] = self.details
        return status


def _details(res: Resource, name: str) -> Obj:
    details = {"name": name, "kind": res.plural}
    if res.group:
        details["group"] = res.group
    return details


def _not_found(res: Resource, name: str) -> ApiError:
    msg = f'{res.qualified} "{name}" not found'
    return ApiError(404, "NotFound", msg, _details(res, name))


def _bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def _expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def _too_large(rv: int, current: int) -> ApiError:
    return ApiError(
        504,
        "Timeout",
        f"Timeout: Too large resource version: {rv}, current: {current}",
        {
            "causes": [
                {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
            ],
            "retryAfterSeconds": 1,
        },
    )


def _unserved() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource")


# ---------------------------------------------------------------------------------------------
# Selectors

_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_OPERATORS = ("==", "!=", "=", "!", "<", ">", "(", ")", ",")


def _lex(text: str) -> list[tuple[str, str]]:
    """Split a label selector into ("op", symbol) and ("id", word) tokens, as labels.Parse."""
    tokens: list[tuple[str, str]] = []
    i = 0
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        op = next((o for o in _OPERATORS if text.startswith(o, i)), None)
        if op:
            tokens.append(("op", op))
            i += len(op)
            continue
        j = i
        while j < len(text) and not text[j].isspace() and text[j] not in "!=<>(),":
            j += 1
        tokens.append(("id", text[i:j]))
        i = j
    return tokens


def _check_key(key: str) -> str:
    prefix, _, name = key.rpartition("/")
    if not _LABEL_NAME.fullmatch(name) or (
        "/" in key and not (len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix))
    ):
        raise _bad_request(f"unable to parse requirement: invalid label key {key!r}")
    return key


def _check_value(value: str) -> str:
    if not _LABEL_VALUE.fullmatch(value):
        raise _bad_request(f"unable to parse requirement: invalid label value {value!r}")
    return value


def _parse_label_selector(text: str) -> Callable[[Mapping[str, str]], bool]:
    """Compile a label selector: ``=``, ``==``, ``!=``, ``in``, ``notin``, ``key``, ``!key``,
    ``<``/``>`` on integers, comma-separated and all required; ApiError 400 if malformed."""
    tokens = _lex(text)
    pos = 0
    requirements: list[Callable[[Mapping[str, str]], bool]] = []

    def fail(problem: str) -> ApiError:
        return _bad_request(f"unable to parse requirement: {problem} in {text!r}")

    def take(kind: str | None = None, value: str | None = None) -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise fail("unexpected end")
        tok_kind, tok = tokens[pos]
        if (kind and tok_kind != kind) or (value and tok != value):
            raise fail(f"unexpected {tok!r}")
        pos += 1
        return tok

    def peek() -> tuple[str, str] | None:
        return tokens[pos] if pos < len(tokens) else None

    def value_or_empty() -> str:
        nxt = peek()
        return _check_value(take("id")) if nxt and nxt[0] == "id" else ""

    def requirement() -> Callable[[Mapping[str, str]], bool]:
        if peek() == ("op", "!"):
            take()
            missing = _check_key(take("id"))
            return lambda labels: missing not in labels
        key = _check_key(take("id"))
        nxt = peek()
        if nxt is None or nxt == ("op", ","):
            return lambda labels: key in labels
        op = take()
        if op in ("=", "=="):
            want = value_or_empty()
            return lambda labels: labels.get(key) == want
        if op == "!=":
            avoid = value_or_empty()
            return lambda labels: labels.get(key) != avoid
        if op in ("<", ">"):
            bound = take("id")
            if not re.fullmatch(r"-?\d+", bound):
                raise fail(f"{bound!r} is not an integer")
            return lambda labels: _compare(labels.get(key), op, int(bound))
        if op in ("in", "notin"):
            take("op", "(")
            if peek() == ("op", ")"):
                raise fail(f"an empty set of values for {op!r}")
            members: set[str] = set()
            while True:
                members.add(value_or_empty())
                if take("op") == ")":
                    break
            if op == "in":
                return lambda labels: labels.get(key) in members
            return lambda labels: labels.get(key) not in members
        raise fail(f"unknown operator {op!r}")

    while tokens:
        requirements.append(requirement())
        if pos == len(tokens):
            break
        take("op", ",")
    return lambda labels: all(req(labels) for req in requirements)


def _compare(value: str | None, op: str, bound: int) -> bool:
    if value is None or not re.fullmatch(r"-?\d+", value):
        return False
    return int(value) < bound if op == "<" else int(value) > bound


def _parse_field_selector(text: str) -> Match:
    """Compile a field selector over ``metadata.name`` and ``metadata.namespace`` (the fields
    every resource, custom ones included, supports); other fields are a 400 as upstream."""
    terms: list[tuple[str, bool, str]] = []
    for term in filter(None, (t.strip() for t in text.split(","))):
        op = next((o for o in ("!=", "==", "=") if o in term), None)
        if op is None:
            raise _bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
        path, value = (part.strip() for part in term.split(op, 1))
        if path not in ("metadata.name", "metadata.namespace"):
            raise _bad_request(f'field label not supported: "{path}"')
        terms.append((path.removeprefix("metadata."), op != "!=", value))
    return lambda obj: all(
        (obj["metadata"].get(key, "") == value) == equal for key, equal, value in terms
    )


def _selector(query: Mapping[str, str]) -> tuple[Match, bool]:
    """The request's combined selector, and whether it selects everything."""
    labels = _parse_label_selector(query.get("labelSelector", ""))
    fields = _parse_field_selector(query.get("fieldSelector", ""))
    empty = not (query.get("labelSelector", "").strip() or query.get("fieldSelector", "").strip())
    return (lambda obj: labels(obj["metadata"].get("labels") or {}) and fields(obj)), empty


# ---------------------------------------------------------------------------------------------
# Patches


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: maps merge, null deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


def _json_patch(doc: Obj, operations: list[Any]) -> Obj:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test); 422 if one cannot apply."""
    result: Any = copy.deepcopy(doc)

    def pointer(path: str) -> list[str]:
        if path and not path.startswith("/"):
            raise ValueError(f"bad JSON pointer {path!r}")
        return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]

    def parent(tokens: list[str]) -> tuple[Any, str]:
        node = result
        for tok in tokens[:-1]:
            node = node[int(tok)] if isinstance(node, list) else node[tok]
        return node, tokens[-1]

    def get(tokens: list[str]) -> Any:
        if not tokens:
            return result
        node, last = parent(tokens)
        return node[int(last)] if isinstance(node, list) else node[last]

    def add(tokens: list[str], value: Any) -> None:
        nonlocal result
        if not tokens:
            result = value
            return
        node, last = parent(tokens)
        if isinstance(node, list):
            index = len(node) if last == "-" else int(last)
            if not 0 <= index <= len(node):
                raise IndexError(last)
            node.insert(index, value)
        else:
            node[last] = value

    def remove(tokens: list[str]) -> Any:
        node, last = parent(tokens)
        return node.pop(int(last)) if isinstance(node, list) else node.pop(last)

    try:
        for op in operations:
            path = pointer(op["path"])
            kind = op["op"]
            if kind == "add":
                add(path, copy.deepcopy(op["value"]))
            elif kind == "remove":
                remove(path)
            elif kind == "replace":
                remove(path)
                add(path, copy.deepcopy(op["value"]))
            elif kind == "move":
                add(path, remove(pointer(op["from"])))
            elif kind == "copy":
                add(path, copy.deepcopy(get(pointer(op["from"]))))
            elif kind == "test":
                if get(path) != op["value"]:
                    raise ValueError(f"test failed at {op['path']!r}")
            else:
                raise ValueError(f"unknown operation {kind!r}")
    except (KeyError, IndexError, ValueError, TypeError, AttributeError) as exc:
        raise ApiError(422, "Invalid", f"the JSON patch could not be applied: {exc!r}") from exc
    if not isinstance(result, dict):
        raise ApiError(422, "Invalid", "the JSON patch did not produce an object")
    return result


# ---------------------------------------------------------------------------------------------
# State


@dataclass(frozen=True)
class _Change:
    """One write, as the history keeps it: ``prev`` is None for a creation, ``obj`` for a
    deletion. Watchers derive their event types from the pair (see ``_watch_event``)."""

    rv: int
    resource: Resource
    obj: Obj | None
    prev: Obj | None

    @property
    def key(self) -> tuple[str, str]:
        obj = self.obj if self.obj is not None else self.prev
        assert obj is not None
        return _key(obj)


def _key(obj: Obj) -> tuple[str, str]:
    """Where an object lives: (namespace, name), "" for cluster-scoped; also the list order."""
    return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def _stamped(obj: Obj, rv: int) -> Obj:
    """The object as a deletion (or a selector exit) reports it: last state, event's version."""
    return {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(rv)}}


def _body(obj: Obj) -> Obj:
    """What ``metadata.generation`` tracks: everything but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata", "status")}


def _conflict(res: Resource, name: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {res.qualified} "{name}": the object has been '
        "modified; please apply your changes to the latest version and try again",
        _details(res, name),
    )


class _Store:
    """Objects, the global resourceVersion and the bounded change history, behind one lock.

    Server handlers and test threads call it alike; ``notify`` (run after every write, outside
    the lock) wakes the watchers. Stored objects are never mutated, only replaced, so readers
    may share them. The history keeps every change after ``floor``: reading from an older
    version is answered 410, as by a compacted etcd or a watch cache that has rolled over.
    """

    def __init__(self, history: int, notify: Callable[[], None]) -> None:
        self._lock = threading.Lock()
        self._objects: dict[Resource, dict[tuple[str, str], Obj]] = {r: {} for r in _ALL}
        self._history: deque[_Change] = deque(maxlen=history)
        self._rv = 1
        self._floor = self._rv
        self._notify = notify

    @property
    def rv(self) -> int:
        return self._rv

    def check_rv(self, rv: int) -> None:
        """A version from the future is an error (upstream waits ~3 s for it first)."""
        if rv > self._rv:
            raise _too_large(rv, self._rv)

    # Writes: admit outside the lock, change under it, notify after it.

    def create(self, res: Resource, obj: Obj) -> Obj:
        obj = _admit(res, obj)
        with self._lock:
            self._create(res, obj)
        self._notify()
        return copy.deepcopy(obj)

    def update(self, res: Resource, obj: Obj, precondition: str | None) -> Obj:
        """Replace an object; a ``precondition`` (resourceVersion) that is stale is a 409."""
        obj = _admit(res, obj)
        with self._lock:
            stored = self._update(res, obj, precondition)
        self._notify()
        return copy.deepcopy(stored)

    def apply(self, res: Resource, obj: Obj) -> Obj:
        """Create or replace, ignoring any resourceVersion the object carries."""
        obj = _admit(res, obj)
        with self._lock:
            if _key(obj) in self._objects[res]:
                obj = self._update(res, obj, None)
            else:
                self._create(res, obj)
        self._notify()
        return copy.deepcopy(obj)

    def delete(self, res: Resource, namespace: str, name: str) -> Obj:
        with self._lock:
            old = self._objects[res].pop((namespace, name), None)
            if old is None:
                raise _not_found(res, name)
            self._record(res, None, old)
        self._notify()
        return copy.deepcopy(old)

    def _record(self, res: Resource, obj: Obj | None, prev: Obj | None) -> int:
        self._rv += 1
        if len(self._history) == self._history.maxlen:
            self._floor = self._history[0].rv
        self._history.append(_Change(self._rv, res, obj, prev))
        return self._rv

    def _create(self, res: Resource, obj: Obj) -> None:
        objects, meta = self._objects[res], obj["metadata"]
        if _key(obj) in objects:
            msg = f'{res.qualified} "{meta["name"]}" already exists'
            raise ApiError(409, "AlreadyExists", msg, _details(res, meta["name"]))
        meta.update(
            uid=str(uuid.uuid4()),
            creationTimestamp=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            generation=1,
        )
        meta["resourceVersion"] = str(self._record(res, obj, None))
        objects[_key(obj)] = obj

    def _update(self, res: Resource, obj: Obj, precondition: str | None) -> Obj:
        objects, meta = self._objects[res], obj["metadata"]
        old = objects.get(_key(obj))
        if old is None:
            raise _not_found(res, meta["name"])
        old_meta = old["metadata"]
        if precondition and precondition != old_meta["resourceVersion"]:
            raise _conflict(res, meta["name"])
        for server_owned in ("uid", "creationTimestamp", "resourceVersion", "generation"):
            meta[server_owned] = old_meta[server_owned]
        if obj == old:  # a no-op write: no new version, no event, as upstream
            return old
        if _body(obj) != _body(old):
            meta["generation"] = old_meta["generation"] + 1
        meta["resourceVersion"] = str(self._record(res, obj, old))
        objects[_key(obj)] = obj
        return obj

    # Reads.

    def get(self, res: Resource, namespace: str, name: str) -> Obj:
        with self._lock:
            obj = self._objects[res].get((namespace, name))
        if obj is None:
            raise _not_found(res, name)
        return copy.deepcopy(obj)

    def snapshot(self, res: Resource, rv: int | None = None) -> tuple[list[Obj], int]:
        """The objects of ``res`` (sorted by namespace and name; shared, so not to be mutated)
        as of ``rv`` (default: now), rebuilt by undoing the newer changes; and that version."""
        with self._lock:
            if rv is None:
                rv = self._rv
            self.check_rv(rv)
            if rv < self._floor:
                raise _expired(f"too old resource version: {rv} ({self._floor})")
            objects = dict(self._objects[res])
            for change in reversed(self._history):
                if change.rv <= rv:
                    break
                if change.resource is not res:
                    continue
                if change.prev is None:
                    del objects[change.key]
                else:
                    objects[change.key] = change.prev
        return [objects[k] for k in sorted(objects)], rv

    def changes_since(self, rv: int) -> tuple[list[_Change], int]:
        """Every change after ``rv``, and the version they bring the reader to."""
        with self._lock:
            if rv < self._floor:
                raise _expired(f"too old resource version: {rv} ({self._floor})")
            newer: list[_Change] = []
            for change in reversed(self._history):
                if change.rv <= rv:
                    break
                newer.append(change)
            return newer[::-1], self._rv

    def expire(self) -> None:
        """Forget the history: only the current version can still be resumed from."""
        with self._lock:
            self._history.clear()
            self._floor = self._rv


def _admit(res: Resource, obj: Obj) -> Obj:
    """A private copy of an incoming object, with what its resource fixes filled in."""
    obj = copy.deepcopy(obj)
    for field_name, want in (("apiVersion", res.api_version), ("kind", res.kind)):
        if obj.setdefault(field_name, want) != want:
            raise _bad_request(
                f"the {field_name} in the data ({obj[field_name]}) does not match the "
                f"expected {field_name} ({want})"
            )
    meta = obj.setdefault("metadata", {})
    if not isinstance(meta, dict):
        raise _bad_request("metadata must be an object")
    if not res.namespaced:
        meta.pop("namespace", None)
    elif not meta.get("namespace"):
        meta["namespace"] = "default"
    if not meta.get("name") and meta.get("generateName"):
        meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
    if not meta.get("name"):
        raise ApiError(
            422,
            "Invalid",
            f'{res.kind} "" is invalid: metadata.name: Required value: '
            "name or generateName is required",
            {"kind": res.kind},
        )
    return obj


# ---------------------------------------------------------------------------------------------
# The server


class RecordedRequest(NamedTuple):
    """A request as the server received it, for asserting how a client resumed or retried."""

    method: str
    path: str
    query: dict[str, str]


@dataclass(eq=False)
class _Watch:
    """One open watch: what it asked for, and its connection (for drop_watches)."""

    res: Resource
    namespace: str | None
    match: Match
    bookmarks: bool
    deadline: float
    transport: asyncio.Transport | None
    dropped: bool = False


@dataclass
class _Faults:
    latency: float = 0.0
    stall_until: float = 0.0
    unavailable: bool = False  # every request is answered 503
    throttled: int = 0  # so many requests more are answered 429 (with Retry-After)
    retry_after: int = 1
    refusing: bool = False  # the listening socket is closed


@dataclass
class _Runtime:
    """What exists only while the server runs; owned by its event loop."""

    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    runner: web.AppRunner
    site: web.TCPSite | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class ApiServer:
    """An emulated kube-apiserver on 127.0.0.1 (an ephemeral port), run in its own thread.

    ``lace_crds`` serves the lace-cni.io resources (otherwise their paths are 404 and discovery
    omits them); ``history`` bounds the replayable changes; ``bookmark_interval`` is the period
    of BOOKMARK events (upstream: about a minute); the kubeconfig goes to ``directory`` (default:
    a temporary one removed on exit). Use it as a context manager. Every other method is
    thread-safe, and none may be called from the server's own loop.
    """

    def __init__(
        self,
        *,
        lace_crds: bool = False,
        history: int = 1000,
        bookmark_interval: float = 1.0,
        directory: Path | None = None,
    ) -> None:
        self._store = _Store(history, self._notify)
        self._bookmark_interval = bookmark_interval
        self._directory = directory
        self._tempdir: tempfile.TemporaryDirectory[str] | None = None
        self._served = _serving(lace_crds)
        self._faults = _Faults()
        self._watches: set[_Watch] = set()
        self._requests: list[RecordedRequest] = []
        self._rt: _Runtime | None = None
        self._port = 0
        self.kubeconfig_path = Path()

    # -- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> ApiServer:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="lace-apiserver", daemon=True)
        thread.start()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # Cancelling handlers on disconnect ends the watches of clients that went away.
        runner = web.AppRunner(
            app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0
        )
        self._rt = _Runtime(loop, thread, runner)
        try:
            self._call(runner.setup())
            self._call(self._listen())
        except BaseException:
            self._stop_loop()
            raise
        directory = self._directory
        if directory is None:
            self._tempdir = tempfile.TemporaryDirectory(prefix="lace-apiserver-")
            directory = Path(self._tempdir.name)
        self.kubeconfig_path = directory / "kubeconfig"
        self.kubeconfig_path.write_text(json.dumps(self._kubeconfig(), indent=2))
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._call(self._shutdown())
        finally:
            self._stop_loop()
            if self._tempdir is not None:
                self._tempdir.cleanup()
                self._tempdir = None

    async def _listen(self) -> None:
        """Listen on the port (a new ephemeral one the first time, the same one afterwards)."""
        assert self._rt is not None
        self._rt.site = web.TCPSite(self._rt.runner, HOST, self._port)
        await self._rt.site.start()
        self._port = self._rt.runner.addresses[0][1]

    async def _shutdown(self) -> None:
        assert self._rt is not None
        self._faults = _Faults()
        await self._drop_watches()
        await self._rt.runner.cleanup()

    def _stop_loop(self) -> None:
        assert self._rt is not None
        rt, self._rt = self._rt, None
        rt.loop.call_soon_threadsafe(rt.loop.stop)
        rt.thread.join()
        rt.loop.close()

    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run a coroutine on the server's loop and wait for it."""
        if self._rt is None:
            coro.close()
            raise RuntimeError("the API server is not running (use it as a context manager)")
        return asyncio.run_coroutine_threadsafe(coro, self._rt.loop).result(timeout=30)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self._port}"

    def _kubeconfig(self) -> Obj:
        name = "lace-emulator"
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": name, "cluster": {"server": self.url}}],
            "users": [{"name": name, "user": {}}],
            "contexts": [
                {"name": name, "context": {"cluster": name, "user": name, "namespace": "default"}}
            ],
            "current-context": name,
        }

    # -- state, for tests -----------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        """The current global resourceVersion (what a list reports now)."""
        return self._store.rv

    def _resource(self, kind: str) -> Resource:
        for res in self._served.values():
            if res.kind == kind:
                return res
        raise _unserved()

    def apply(self, obj: Obj) -> Obj:
        """Create or replace ``obj`` (found by kind, namespace and name; a namespaced object
        without a namespace goes to ``default``); returns it as stored."""
        return self._store.apply(self._resource(obj.get("kind", "")), obj)

    def delete(self, kind: str, namespace: str | None, name: str) -> Obj:
        """Delete an object (``namespace`` None for cluster-scoped); ApiError 404 if absent."""
        return self._store.delete(self._resource(kind), namespace or "", name)

    def get(self, kind: str, namespace: str | None, name: str) -> Obj | None:
        try:
            return self._store.get(self._resource(kind), namespace or "", name)
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise

    def list(self, kind: str, namespace: str | None = None) -> list[Obj]:
        """The objects of a kind (in one namespace, if given), sorted by namespace and name."""
        items, _ = self._store.snapshot(self._resource(kind))
        return [
            copy.deepcopy(o)
            for o in items
            if namespace is None or o["metadata"].get("namespace") == namespace
        ]

    def events(self) -> builtins.list[Obj]:
        """The core/v1 Events clients have created, oldest first."""
        return sorted(self.list("Event"), key=lambda o: int(o["metadata"]["resourceVersion"]))

    @property
    def lace_crds(self) -> bool:
        return LACE_RESOURCES[0] in self._served.values()

    def set_lace_crds(self, enabled: bool) -> None:
        """Install or remove the lace-cni.io CRDs while running. Removal deletes their objects
        (watchers see DELETED) and then ends those watches, as deleting a CRD does."""
        if not enabled:
            for res in LACE_RESOURCES:
                for obj in self._store.snapshot(res)[0]:
                    with contextlib.suppress(ApiError):  # deleted meanwhile by someone else
                        self._store.delete(res, "", obj["metadata"]["name"])
        self._served = _serving(enabled)
        self._notify()

    # -- faults, for tests ----------------------------------------------------------------

    def drop_watches(self) -> int:
        """Close every open watch connection abruptly (no final chunk); returns how many."""
        return self._call(self._drop_watches())

    async def _drop_watches(self) -> int:
        dropped, self._watches = self._watches, set()
        for watch in dropped:
            watch.dropped = True
            if watch.transport is not None:
                watch.transport.abort()
        self._wake()
        return len(dropped)

    def stall(self, seconds: float) -> None:
        """For ``seconds`` from now, accept requests but answer none, and send nothing on open
        watches; ``stall(0)`` ends a stall early. Everything held back proceeds afterwards."""
        self._faults.stall_until = time.monotonic() + seconds
        self._notify()

    def unavailable(self, down: bool = True, *, refuse: bool = False) -> None:
        """Take the API down: every request is answered 503, or with ``refuse`` the listening
        socket closes (connections are refused) and every open connection is reset.
        ``unavailable(False)`` brings it back, on the same port."""
        self._call(self._set_unavailable(down, refuse))

    async def _set_unavailable(self, down: bool, refuse: bool) -> None:
        assert self._rt is not None
        self._faults.unavailable = down and not refuse
        if down and refuse and not self._faults.refusing:
            self._faults.refusing = True
            if self._rt.site is not None:
                await self._rt.site.stop()
                self._rt.site = None
            await self._drop_watches()
            server = self._rt.runner.server
            for conn in server.connections if server is not None else ():
                if conn.transport is not None:
                    conn.transport.abort()
        elif not (down and refuse) and self._faults.refusing:
            self._faults.refusing = False
            await self._listen()

    def expire_history(self) -> None:
        """Forget the change history, as a compaction would: resuming a watch or a paginated
        list from any version older than the current one gets 410 Expired."""
        self._store.expire()

    def latency(self, seconds: float) -> None:
        """Delay every response by ``seconds`` (0 turns it off)."""
        self._faults.latency = seconds

    def throttle(self, requests: int, retry_after: int = 1) -> None:
        """Answer the next ``requests`` API requests 429 Too Many Requests with Retry-After,
        as API Priority and Fairness answers when a priority level's queues are full (the
        real server does so only under load it cannot be made to show on demand)."""
        self._faults.throttled, self._faults.retry_after = requests, retry_after

    # -- observation, for tests -----------------------------------------------------------

    def requests(self) -> builtins.list[RecordedRequest]:
        """Every request received so far, in order (fault switches hide none)."""
        return list(self._requests)

    @property
    def open_watches(self) -> int:
        return len(self._watches)

    def wait_for_watches(self, count: int, timeout: float = 5.0) -> None:
        """Block until at least ``count`` watches are open and past their initial events, so
        that whatever a test writes next reaches them as a change."""
        deadline = time.monotonic() + timeout
        while len(self._watches) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self._watches)} watches open, waited for {count}")
            time.sleep(0.01)

    # -- waking handlers ------------------------------------------------------------------

    def _notify(self) -> None:
        """Wake every waiting handler; callable from any thread, a no-op while stopped."""
        rt = self._rt
        if rt is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closing
                rt.loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        assert self._rt is not None
        woken, self._rt.wake = self._rt.wake, asyncio.Event()
        woken.set()

    async def _sleep(self, seconds: float, wake: asyncio.Event | None = None) -> None:
        """Sleep until ``seconds`` pass or anything changes (a write, a fault switch) after
        ``wake`` was taken (default: now)."""
        assert self._rt is not None
        wake = wake or self._rt.wake
        if math.isinf(seconds):
            await wake.wait()
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), max(seconds, 0.0))

    async def _unstalled(self) -> None:
        while (left := self._faults.stall_until - time.monotonic()) > 0:
            await self._sleep(left)

    # -- HTTP -----------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self._requests.append(RecordedRequest(request.method, request.path, dict(request.query)))
        if self._faults.latency:
            await asyncio.sleep(self._faults.latency)
        await self._unstalled()
        try:
            if self._faults.unavailable:
                raise ApiError(
                    503,
                    "ServiceUnavailable",
                    "the server is currently unable to handle the request",
                )
            if request.path in ("/healthz", "/livez", "/readyz"):
                return web.Response(text="ok")
            if self._faults.throttled > 0:
                self._faults.throttled -= 1
                error = ApiError(
                    429, "TooManyRequests", "Too many requests, please try again later."
                )
                headers = {"Retry-After": str(self._faults.retry_after)}
                return web.json_response(error.status(), status=429, headers=headers)
            discovery = self._discovery(request.path)
            if discovery is not None:
                if request.method != "GET":
                    raise _method_not_allowed()
                return web.json_response(discovery)
            target = self._route(request.path)
            if target is None:  # upstream answers unknown paths in plain text, not a Status
                return web.Response(status=404, text="404 page not found\n")
            return await self._serve(request, *target)
        except ApiError as exc:
            return web.json_response(exc.status(), status=exc.code)

    def _route(self, path: str) -> tuple[Resource, str | None, str | None] | None:
        """``(resource, namespace, name)`` for a resource URL; None for an unknown path."""
        parts = [p for p in path.split("/") if p]
        if parts[:1] == ["api"] and len(parts) >= 3:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 4:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        namespace = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        res = self._served.get((group, version, rest[0]))
        if res is None or len(rest) > 2 or (namespace is not None and not res.namespaced):
            return None
        name = rest[1] if len(rest) == 2 else None
        if name is not None and res.namespaced and namespace is None:
            return None
        return res, namespace, name

    async def _serve(
        self, request: web.Request, res: Resource, namespace: str | None, name: str | None
    ) -> web.StreamResponse:
        watch = request.query.get("watch", "") in _TRUE
        if name is None:
            verb = {"GET": "watch" if watch else "list", "POST": "create"}.get(request.method)
        else:
            verb = {
                "GET": "watch" if watch else "get",
                "PUT": "update",
                "PATCH": "patch",
                "DELETE": "delete",
            }.get(request.method)
        if verb not in res.verbs or (verb == "create" and res.namespaced and namespace is None):
            raise _method_not_allowed()
        ns = namespace or ""
        if verb == "watch":
            return await self._watch(request, res, namespace, name)
        if verb == "list":
            return web.json_response(self._list(res, namespace, request.query))
        if verb == "create":
            obj = _named(res, await _json_body(request, dict), ns, None)
            return web.json_response(self._store.create(res, obj), status=201)
        assert name is not None
        if verb == "get":
            return web.json_response(self._store.get(res, ns, name))
        if verb == "update":
            obj = _named(res, await _json_body(request, dict), ns, name)
            precondition = obj["metadata"].get("resourceVersion")
            return web.json_response(self._store.update(res, obj, precondition))
        if verb == "patch":
            return web.json_response(await self._patch(request, res, ns, name))
        deleted = self._store.delete(res, ns, name)
        if res.returns_deleted_object:
            return web.json_response(deleted)
        details = {**_details(res, name), "uid": deleted["metadata"]["uid"]}
        success = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
        return web.json_response({**success, "details": details})

    async def _patch(self, request: web.Request, res: Resource, ns: str, name: str) -> Obj:
        content_type = request.content_type
        if content_type == "application/json-patch+json":
            operations = await _json_body(request, list)

            def patch(current: Obj) -> Obj:
                return _json_patch(current, operations)

        elif content_type == "application/merge-patch+json" or (
            # Approximated: lists are replaced, not merged by their patchMergeKey.
            content_type == "application/strategic-merge-patch+json" and not res.custom
        ):
            merge = await _json_body(request, dict)

            def patch(current: Obj) -> Obj:
                patched: Obj = _merge_patch(current, merge)
                return patched

        else:
            accepted = "application/json-patch+json, application/merge-patch+json"
            if not res.custom:
                accepted += ", application/strategic-merge-patch+json"
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types "
                f"include: {accepted}",
            )
        while True:  # as upstream: re-apply to the newest version unless the patch pins one
            current = self._store.get(res, ns, name)
            patched = _named(res, patch(current), ns, name)
            version = current["metadata"]["resourceVersion"]
            pinned = patched["metadata"].get("resourceVersion", version)
            try:
                return self._store.update(res, patched, pinned)
            except ApiError as exc:
                if exc.code != 409 or pinned != version:
                    raise

    def _list(self, res: Resource, namespace: str | None, query: Mapping[str, str]) -> Obj:
        match, everything = _selector(query)
        start: tuple[str, str] | None = None
        if query.get("continue"):
            if query.get("resourceVersion"):
                raise _bad_request("specifying resource version is not allowed when using continue")
            rv, start = _decode_continue(query["continue"])
            try:
                items, rv = self._store.snapshot(res, rv)
            except ApiError as exc:
                if exc.code != 410:
                    raise
                raise _expired(
                    "The provided continue parameter is too old to display a consistent list "
                    "result. You can start a new list without the continue parameter."
                ) from exc
        else:
            wanted = _parse_rv(query.get("resourceVersion", ""))
            exact = query.get("resourceVersionMatch") == "Exact"
            if exact and not wanted:
                raise _bad_request("resourceVersionMatch=Exact needs a non-zero resourceVersion")
            self._store.check_rv(wanted)
            items, rv = self._store.snapshot(res, wanted if exact else None)
        selected = [
            o
            for o in items
            if namespace in (None, o["metadata"].get("namespace"))
            and (start is None or _key(o) > start)
            and match(o)
        ]
        meta: Obj = {"resourceVersion": str(rv)}
        limit = _number(query, "limit")
        if limit and limit < len(selected):
            meta["continue"] = _encode_continue(rv, _key(selected[limit - 1]))
            if everything:  # upstream counts the rest only when nothing is filtered
                meta["remainingItemCount"] = len(selected) - limit
            selected = selected[:limit]
        return {
            "kind": f"{res.kind}List",
            "apiVersion": res.api_version,
            "metadata": meta,
            # Upstream drops apiVersion/kind from the items of built-in lists, not from CRs'.
            "items": selected if res.custom else [_without_type(o) for o in selected],
        }

    async def _watch(
        self, request: web.Request, res: Resource, namespace: str | None, name: str | None
    ) -> web.StreamResponse:
        query = request.query
        match, _ = _selector(query)
        if name is not None:
            match = _and_named(match, name)
        since = _parse_rv(query.get("resourceVersion", ""))
        self._store.check_rv(since)
        bookmarks = query.get("allowWatchBookmarks", "") in _TRUE
        send_initial = query.get("sendInitialEvents", "") in _TRUE
        timeout = _number(query, "timeoutSeconds")  # 0, like none, means the server's default
        deadline = time.monotonic() + timeout if timeout else math.inf
        watch = _Watch(res, namespace, match, bookmarks, deadline, request.transport)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        try:
            # "" and "0" (or sendInitialEvents) start with the current state, as ADDED events.
            if not since or send_initial:
                items, since = self._store.snapshot(res)
                for obj in items:
                    if namespace in (None, obj["metadata"].get("namespace")) and match(obj):
                        await _send(response, "ADDED", obj)
                if send_initial and bookmarks:
                    end = _bookmark(res, since, {_INITIAL_EVENTS_END: "true"})
                    await _send(response, "BOOKMARK", end)
            self._watches.add(watch)
            await self._stream(response, watch, since)
            self._watches.discard(watch)  # before the client can see the end
            if not watch.dropped:
                await response.write_eof()
        except ConnectionError:
            pass  # the client went away, or drop_watches() reset the connection
        finally:
            self._watches.discard(watch)
        return response

    async def _stream(self, response: web.StreamResponse, watch: _Watch, cursor: int) -> None:
        """Send a watch's events after ``cursor`` until it times out, is dropped or its
        resource stops being served."""
        assert self._rt is not None
        interval = self._bookmark_interval
        next_bookmark = time.monotonic() + interval if watch.bookmarks else math.inf
        while True:
            await self._unstalled()
            if watch.dropped:
                return
            wake = self._rt.wake  # taken before reading, so no later write goes unnoticed
            try:
                changes, head = self._store.changes_since(cursor)
            except ApiError as exc:  # fell out of the history window
                await _send(response, "ERROR", exc.status())
                return
            for change in changes:
                if change.resource is watch.res and watch.namespace in (None, change.key[0]):
                    event = _watch_event(change, watch.match)
                    if event is not None:
                        await _send(response, *event)
            cursor = head
            if watch.res not in self._served.values():
                return
            now = time.monotonic()
            if now >= next_bookmark:
                await _send(response, "BOOKMARK", _bookmark(watch.res, cursor))
                next_bookmark = now + interval
            if now >= watch.deadline:
                return
            await self._sleep(min(watch.deadline, next_bookmark) - now, wake)

    def _discovery(self, path: str) -> Obj | None:
        """The discovery document at ``path``, if it is one."""
        path = path.rstrip("/")
        served = list(self._served.values())
        by_gv: dict[str, builtins.list[Resource]] = {}
        for res in served:
            by_gv.setdefault(res.api_version, []).append(res)
        if path == "/api":
            return {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{HOST}:{self._port}"}
                ],
            }
        if path == "/apis":
            groups = [_group(g, by_gv) for g in sorted({r.group for r in served if r.group})]
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        if path == "/version":
            return _VERSION
        core = path.removeprefix("/api/")
        if core != path and "/" not in core and core in by_gv:  # /api/v1
            return _resource_list(core, by_gv[core])
        named = path.removeprefix("/apis/")
        if named == path:
            return None
        if named in by_gv:  # /apis/<group>/<version>
            return _resource_list(named, by_gv[named])
        if any(r.group == named for r in served):  # /apis/<group>
            return {"kind": "APIGroup", "apiVersion": "v1", **_group(named, by_gv)}
        return None


def _serving(lace_crds: bool) -> dict[tuple[str, str, str], Resource]:
    """The served resources by (group, version, plural), as the router looks them up."""
    return {(r.group, r.version, r.plural): r for r in (_ALL if lace_crds else _BUILTIN)}


_VERSION: Obj = {
    "major": "1",
    "minor": "34",
    "gitVersion": "v1.34.0-lace-emulator",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-01-01T00:00:00Z",
    "goVersion": "go1.24.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def _group(group: str, by_gv: Mapping[str, Iterable[Resource]]) -> Obj:
    versions = [
        {"groupVersion": gv, "version": gv.partition("/")[2]}
        for gv in sorted(by_gv)
        if gv.partition("/")[0] == group and "/" in gv
    ]
    return {"name": group, "versions": versions, "preferredVersion": versions[0]}


def _resource_list(group_version: str, resources: Iterable[Resource]) -> Obj:
    entries = []
    for res in sorted(resources, key=lambda r: r.plural):
        entry: Obj = {
            "name": res.plural,
            "singularName": res.kind.lower(),
            "namespaced": res.namespaced,
            "kind": res.kind,
            "verbs": sorted(res.verbs),
        }
        if res.short_names:
            entry["shortNames"] = list(res.short_names)
        entries.append(entry)
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": entries,
    }


async def _send(response: web.StreamResponse, kind: str, obj: Obj) -> None:
    """One watch event: a JSON line in its own chunk, as upstream streams them."""
    line = json.dumps({"type": kind, "object": obj}, separators=(",", ":"))
    await response.write(line.encode() + b"\n")


def _bookmark(res: Resource, rv: int, annotations: dict[str, str] | None = None) -> Obj:
    """A BOOKMARK's object: the resource's type and only a resourceVersion (and annotations)."""
    meta: Obj = {"resourceVersion": str(rv)}
    if annotations:
        meta["annotations"] = annotations
    return {"kind": res.kind, "apiVersion": res.api_version, "metadata": meta}


def _watch_event(change: _Change, match: Match) -> tuple[str, Obj] | None:
    """The event a selecting watcher sees for a change, decided as the apiserver's watch cache
    does: entering the selection is ADDED, leaving it DELETED (last matching state, new rv)."""
    matches_now = change.obj is not None and match(change.obj)
    matched_before = change.prev is not None and match(change.prev)
    if matches_now and change.obj is not None:
        return ("MODIFIED" if matched_before else "ADDED"), change.obj
    if matched_before and change.prev is not None:
        return "DELETED", _stamped(change.prev, change.rv)
    return None


def _and_named(match: Match, name: str) -> Match:
    """A watch on a single object's URL: its selector, restricted to that name."""
    return lambda obj: obj["metadata"]["name"] == name and match(obj)


def _method_not_allowed() -> ApiError:
    return ApiError(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
    )


def _without_type(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}


def _parse_rv(text: str) -> int:
    """A resourceVersion parameter: 0 for "" and "0" (any, i.e. the current state)."""
    if not text:
        return 0
    if not text.isdigit():
        raise _bad_request(f"invalid resource version {text!r}")
    return int(text)


def _number(query: Mapping[str, str], name: str) -> int | None:
    """A non-negative integer parameter, None if absent."""
    text = query.get(name, "")
    if not text:
        return None
    try:
        value = int(text)
    except ValueError as exc:
        raise _bad_request(f"{name}: invalid value {text!r}") from exc
    if value < 0:
        raise _bad_request(f"{name}: must not be negative")
    return value


def _encode_continue(rv: int, start: tuple[str, str]) -> str:
    token = {"v": "meta.k8s.io/v1", "rv": rv, "start": list(start)}
    return base64.urlsafe_b64encode(json.dumps(token).encode()).decode()


def _decode_continue(token: str) -> tuple[int, tuple[str, str]]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        namespace, name = data["start"]
        return int(data["rv"]), (str(namespace), str(name))
    except (binascii.Error, ValueError, KeyError, TypeError) as exc:
        raise _bad_request("continue key is not valid") from exc


async def _json_body(request: web.Request, kind: type[_T]) -> _T:
    try:
        body = json.loads(await request.read())
    except ValueError as exc:
        raise _bad_request(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(body, kind):
        raise _bad_request(f"the request body must be a JSON {kind.__name__}")
    return body


def _named(res: Resource, obj: Obj, namespace: str, name: str | None) -> Obj:
    """Check an incoming object against its URL: names and namespaces must agree."""
    meta = obj.setdefault("metadata", {})
    if not isinstance(meta, dict):
        raise _bad_request("metadata must be an object")
    if name is not None and meta.setdefault("name", name) != name:
        raise _bad_request(
            f"the name of the object ({meta['name']}) does not match the name on the URL ({name})"
        )
    if res.namespaced and meta.setdefault("namespace", namespace) != namespace:
        raise _bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    return obj
