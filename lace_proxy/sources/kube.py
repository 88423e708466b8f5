"""The `kube` source: reflectors that list and watch the Kubernetes API, as client-go's do.

One reflector per resource (Services, EndpointSlices, this node's Node, ServiceCIDRs, the
Lace resources) lists, then watches from the list's resourceVersion with bookmarks, and
resumes from the last version it saw after a dropped connection. The first list asks for
`resourceVersion=0`, as client-go's does: kube-apiserver's watch cache answers it whole and
at once, without etcd (bench/README measures what it saves at 30k). A `410 Gone`
(the version left the server's history, or a page's continue token expired) leads to a
consistent relist, paged (`limit`/`continue`) from etcd, whose result is diffed against what
was delivered, so the table sees only real changes — no flush.
Failures back off exponentially with jitter; every read has a timeout so a stalled server
is noticed.

Every reflector is a task on the proxy's event loop (`kubernetes.aio`, over aiohttp): no
threads, and parsed, validated changes reach the change handler directly, in order. An
object that fails validation keeps its last good version, as with the files source.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes.aio import client as k8s
from kubernetes.aio import config as k8s_config

from lace_proxy.gcpause import collection_paused
from lace_proxy.model import (
    HEADLESS_LABEL,
    LACE_GROUP_VERSION,
    LACE_KINDS,
    SERVICE_PROXY_NAME_LABEL,
    Rejections,
    ValidationError,
    parse_endpoint_slice,
    parse_node,
    parse_service,
    parse_service_cidr,
)
from lace_proxy.sources import ChangeHandler
from lace_proxy.sources.wire import ENDPOINT_SLICES, SERVICES, WHOLE, Decoders, decode

log = logging.getLogger(__name__)

SOURCE_NAME = "kube"
#: kube-proxy's selector for Services and EndpointSlices: skip other proxies' and headless ones.
PROXY_SELECTOR = f"!{SERVICE_PROXY_NAME_LABEL},!{HEADLESS_LABEL}"


@dataclass(frozen=True)
class Timing:
    """Timeouts and backoff; tests shrink them.

    kube-apiserver sends nothing on a watch whose resource has not changed since the watch
    began, not even a bookmark, until it ends the watch at timeoutSeconds. So the longest
    watch (2 x watch_timeout) must end before read_timeout, or every quiet watch times out
    and backs off as if the server had stalled.
    """

    connect_timeout: float = 10.0
    read_timeout: float = 90.0  # > 2 x watch_timeout: a healthy watch always ends first
    watch_timeout: int = 40  # timeoutSeconds asked of the server; jittered up to 2x
    backoff_initial: float = 0.8
    backoff_max: float = 30.0
    rediscover: float = 60.0  # how often an unserved custom resource is asked for again
    page_size: int = 500  # objects per page of a list etcd serves (as client-go's pager)


class Gone(Exception):
    """The server no longer has the requested resourceVersion: relist."""


class NotServed(Exception):
    """The API does not serve this (optional) resource: its CRD is not installed, or the server
    predates it (ServiceCIDRs before Kubernetes 1.33)."""


@dataclass(frozen=True)
class Resource:
    """One watched resource: where it lives, how to parse it, how to deliver it.

    An `optional` resource (a custom resource, ServiceCIDRs) may not be served: then it is
    reported as empty, and asked for again every `Timing.rediscover` seconds.
    """

    name: str
    path: str
    label_selector: str | None
    field_selector: str | None
    parse: Callable[[dict[str, Any]], Any]
    upsert: Callable[[ChangeHandler, Any], None]
    delete: Callable[[ChangeHandler, str], None]
    optional: bool = False
    decoders: Decoders = WHOLE


def _lace(kind: str, plural: str) -> Resource:
    """A Lace custom resource: watched when the API serves it (its CRD is installed)."""
    return Resource(
        plural,
        f"/apis/{LACE_GROUP_VERSION}/{plural}",
        None,
        None,
        LACE_KINDS[kind],
        lambda h, o: h.lace_upserted(o),
        lambda h, key: h.lace_deleted(kind, key),
        optional=True,
    )


def resources(node_name: str) -> list[Resource]:
    """What the proxy watches: Services, EndpointSlices, its own Node, the ServiceCIDRs (where
    the API serves them: Kubernetes 1.33 on) and the Lace resources."""
    return [
        Resource(
            "servicecidrs",
            "/apis/networking.k8s.io/v1/servicecidrs",
            None,
            None,
            parse_service_cidr,
            lambda h, o: h.service_cidr_upserted(o),
            lambda h, key: h.service_cidr_deleted(key),
            optional=True,
        ),
        _lace("Network", "networks"),
        _lace("NetworkBindingPolicy", "networkbindingpolicies"),
        _lace("NetworkRoutingPolicy", "networkroutingpolicies"),
        _lace("ServiceRoutingPolicy", "serviceroutingpolicies"),
        Resource(
            "services",
            "/api/v1/services",
            PROXY_SELECTOR,
            None,
            parse_service,
            lambda h, o: h.service_upserted(o),
            lambda h, key: h.service_deleted(key),
            decoders=SERVICES,
        ),
        Resource(
            "endpointslices",
            "/apis/discovery.k8s.io/v1/endpointslices",
            PROXY_SELECTOR,
            None,
            parse_endpoint_slice,
            lambda h, o: h.slice_upserted(o),
            lambda h, key: h.slice_deleted(key),
            decoders=ENDPOINT_SLICES,
        ),
        Resource(
            "nodes",
            "/api/v1/nodes",
            None,
            f"metadata.name={node_name}",
            parse_node,
            lambda h, o: h.node_upserted(o),
            lambda h, key: h.node_deleted(key),
        ),
    ]


class ApiConfigError(Exception):
    """The API client cannot be configured (no in-cluster environment, a bad kubeconfig)."""


@dataclass(frozen=True)
class ApiConnection:
    """Where the API server is and who the proxy is to it: a kubeconfig file, else the pod's
    service account (in-cluster), with `master` overriding the address (as kube-proxy's)."""

    kubeconfig: str | None = None
    master: str | None = None

    def describe(self) -> str:
        return self.master or self.kubeconfig or "the in-cluster config"

    async def configuration(self) -> k8s.Configuration:
        """The client configuration; ApiConfigError names what is wrong (callers may check
        it before starting anything: it holds no connection)."""
        configuration = k8s.Configuration()
        try:
            if self.kubeconfig:
                await k8s_config.load_kube_config(
                    config_file=self.kubeconfig, client_configuration=configuration
                )
            elif self.master is None:
                k8s_config.load_incluster_config(client_configuration=configuration)
        except Exception as exc:
            raise ApiConfigError(
                f"cannot configure the API client from {self.describe()}: {exc}"
            ) from exc
        if self.master:
            configuration.host = self.master
        # As client-go's REST client: a 429 (or 5xx) with Retry-After is waited out and the
        # GET sent again (up to 10 times), not reported as a failure.
        configuration.client_go_retries = True
        return configuration


def _object_key(raw: dict[str, Any]) -> str:
    meta = raw.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))


class Reflector:
    """Lists and watches one resource, delivering changes to the handler."""

    def __init__(
        self,
        resource: Resource,
        api: k8s.ApiClient,
        handler: ChangeHandler,
        rejections: Rejections,
        timing: Timing,
        on_synced: Callable[[], None],
        metrics: Callable[[str, str], None] | None = None,
        on_contact: Callable[[str, bool], None] | None = None,
    ) -> None:
        self.resource = resource
        self.api = api
        self.handler = handler
        self.rejections = rejections
        self.timing = timing
        self.on_synced = on_synced
        self.metrics = metrics or (lambda event, resource: None)
        self.on_contact = on_contact
        self._in_contact: bool | None = None
        self.delivered: dict[str, Any] = {}  # key -> last good model object
        self.resource_version: str | None = None
        self.relists = 0
        self.watch_restarts = 0
        #: Watches the server answered. It registers a watch before sending the headers, so
        #: once this counts one, a change is that watch's to report (one made before it
        #: began is folded into its start, and no bookmark reports it).
        self.watches = 0
        self.pages = 0  # list responses read, all lists together
        self._synced = False
        self._failure: str | None = None  # why the last request failed, until one succeeds
        self._listing: tuple[int, int] | None = None  # (pages, objects) of the list under way

    @property
    def synced(self) -> bool:
        """Whether its first list has been delivered."""
        return self._synced

    def progress(self) -> str:
        """Where its first list stands, for the startup log and /healthz."""
        if self._failure is not None:
            return f"retrying after {self._failure}"
        if self._listing is not None:
            pages, objects = self._listing
            return f"listing, {pages} pages of {self.timing.page_size} ({objects:,} objects) so far"
        return "waiting for the API's first answer"

    # -- running --

    async def run(self) -> None:
        """List, watch, resume, relist; until cancelled."""
        delay = self.timing.backoff_initial
        while True:
            try:
                if self.resource_version is None:
                    await self._list()
                await self._watch()
                delay = self.timing.backoff_initial  # a watch that ends normally: resume
            except NotServed:
                self._apply_list({})  # its objects, if any, are gone
                self._mark_synced()
                await asyncio.sleep(self.timing.rediscover)
            except Gone as exc:
                log.info(
                    "%s: resourceVersion %s expired (%s); relisting",
                    self.resource.name,
                    self.resource_version,
                    exc,
                )
                self.resource_version = None
                self.relists += 1
                self.metrics("relist", self.resource.name)
            except Exception as exc:  # any failure: back off and retry
                self._contact(False)
                self._failure = _describe(exc)
                self.watch_restarts += 1
                self.metrics("watch_restart", self.resource.name)
                log.warning("%s: %s; retrying in %.1fs", self.resource.name, self._failure, delay)
                await asyncio.sleep(delay * random.uniform(1.0, 1.5))
                delay = min(delay * 2, self.timing.backoff_max)

    # -- protocol --

    async def _get(self, query: dict[str, str]) -> aiohttp.ClientResponse:
        """The response to a GET of the resource, its body not yet read (streamable)."""
        query = dict(query)
        if self.resource.label_selector:
            query["labelSelector"] = self.resource.label_selector
        if self.resource.field_selector:
            query["fieldSelector"] = self.resource.field_selector
        method, url, headers, body, post = await self.api.param_serialize(
            "GET",
            self.resource.path,
            query_params=list(query.items()),
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        timeout = aiohttp.ClientTimeout(
            total=None, connect=self.timing.connect_timeout, sock_read=self.timing.read_timeout
        )
        response = (
            await self.api.call_api(method, url, headers, body, post, _request_timeout=timeout)
        ).response
        if response.status >= 400:
            try:
                data = await response.read()
            finally:
                response.release()
            # 404: the CRD is not installed; 403: we may not read it (RBAC). Either way
            # the resource is absent for us, and must not hold up the other resources.
            if response.status in (403, 404) and self.resource.optional:
                self._contact(True)  # the API answers; it just has no such resource
                self.resource_version = None
                raise NotServed(self.resource.path)
            if response.status == 410:  # a list's continue token (or version) expired
                self._contact(True)
                raise Gone(_message(data))
            raise k8s.ApiException(status=response.status, reason=response.reason, body=data)
        self._contact(True)
        self._failure = None
        return response

    async def _list(self) -> None:
        """Page by page, all at one resourceVersion (the first page's snapshot): delivered
        only once complete, as one list. The collector is paused meanwhile (gcpause)."""
        with collection_paused():
            parsed, version = await self._pages()
            self._apply_list(parsed)
        self.resource_version = version
        self._listing = None
        self._mark_synced()

    async def _pages(self) -> tuple[dict[str, Any], str]:
        """Every object of the list, parsed (None where invalid, see _apply_list), and the
        list's resourceVersion."""
        parsed: dict[str, Any] = {}
        token, version, pages = "", "", 0
        self._listing = None
        while True:
            query = {"limit": str(self.timing.page_size)}
            if token:  # the rest of the first page's snapshot (no version with a token)
                query["continue"] = token
            elif not self.relists:
                # As client-go's reflector: the first list may be as old as the watch cache,
                # which serves it whole, without etcd (the limit is ignored there); the watch
                # from its version brings everything after it. Once the server has answered
                # 410 Gone, a list is consistent (from etcd, paged by the limit).
                query["resourceVersion"] = "0"
            response = await self._get(query)
            try:
                meta, items = self.resource.decoders.list(await response.read())
            finally:
                response.release()
            self.pages += 1
            pages += 1
            for raw in items:
                parsed[_object_key(raw)] = self._parse(raw)
            self._listing = (pages, len(parsed))
            version = str(meta.get("resourceVersion") or version)
            token = meta.get("continue") or ""
            if not token:
                return parsed, version

    def _mark_synced(self) -> None:
        if not self._synced:
            self._synced = True
            self.on_synced()

    def _apply_list(self, parsed: dict[str, Any | None]) -> None:
        """Deliver the difference between a (re)list and what was delivered."""
        kept = {}
        for key, obj in parsed.items():
            if obj is None:  # invalid now: keep the last good version, if any
                if key in self.delivered:
                    kept[key] = self.delivered[key]
            else:
                kept[key] = obj
        for key in self.delivered.keys() - kept.keys():
            self.resource.delete(self.handler, key)
        for key, obj in kept.items():
            if self.delivered.get(key) != obj:
                self.resource.upsert(self.handler, obj)
        self.delivered = kept

    async def _watch(self) -> None:
        timeout = int(self.timing.watch_timeout * random.uniform(1.0, 2.0))
        query = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout),
            "resourceVersion": self.resource_version or "",
        }
        response = await self._get(query)
        self.watches += 1
        try:
            async for event in _events(response.content, self.resource.decoders):
                self._event(event)
        finally:
            response.release()

    def _event(self, event: dict[str, Any]) -> None:
        kind, raw = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if raw.get("code") == 410:
                raise Gone(raw.get("message", "expired"))
            raise RuntimeError(f"watch error: {raw.get('message', raw)}")
        version = (raw.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            self.resource_version = version or self.resource_version
            return
        key = _object_key(raw)
        if kind == "DELETED":
            if self.delivered.pop(key, None) is not None:
                self.resource.delete(self.handler, key)
        elif kind in ("ADDED", "MODIFIED"):
            obj = self._parse(raw)
            if obj is not None and self.delivered.get(key) != obj:
                self.delivered[key] = obj
                self.resource.upsert(self.handler, obj)
        if version:
            self.resource_version = version

    def _contact(self, ok: bool) -> None:
        """Report a change in whether the API answers (for health)."""
        if ok != self._in_contact:
            self._in_contact = ok
            if self.on_contact is not None:
                self.on_contact(self.resource.name, ok)

    def _parse(self, raw: dict[str, Any]) -> Any:
        try:
            return self.resource.parse(raw)
        except ValidationError as error:
            self.rejections.record(error)
            return None


async def _events(stream: aiohttp.StreamReader, decoders: Decoders) -> AsyncIterator[Any]:
    """Newline-delimited JSON watch events from a streaming response (an event may be far
    longer than aiohttp's line limit: a slice of a thousand endpoints)."""
    pending = bytearray()
    async for chunk in stream.iter_any():
        pending += chunk
        start = 0
        while (end := pending.find(b"\n", start)) >= 0:
            line = bytes(pending[start:end])
            start = end + 1
            if line.strip():
                yield decoders.event(line)
        del pending[:start]
    if pending.strip():
        yield decoders.event(bytes(pending))


def _message(data: bytes) -> str:
    """A Status body's message, else the body."""
    try:
        return str(decode(data).get("message") or data[:200])
    except (ValueError, AttributeError):
        return repr(data[:200])


def _describe(exc: Exception) -> str:
    if isinstance(exc, TimeoutError):  # aiohttp.ServerTimeoutError too
        return "read timed out"
    if isinstance(exc, k8s.ApiException):
        return f"API error {exc.status} {exc.reason}"
    return f"{type(exc).__name__}: {exc}"


class KubeSource:
    """Every reflector of the proxy, reporting `synced` once all have listed."""

    def __init__(
        self,
        server: ApiConnection,
        handler: ChangeHandler,
        node_name: str,
        rejections: Rejections | None = None,
        timing: Timing | None = None,
        metrics: Callable[[str, str], None] | None = None,
        on_contact: Callable[[str, bool], None] | None = None,
    ) -> None:
        self.server = server
        self.handler = handler
        self.node_name = node_name
        self.rejections = rejections or Rejections()
        self.timing = timing or Timing()
        self.metrics = metrics
        self.on_contact = on_contact
        self.reflectors: list[Reflector] = []

    def waiting(self) -> list[str]:
        """The resources whose first list has not been delivered, each with where it stands
        (`Proxier.describe_source`)."""
        if not self.reflectors:
            return ["not started"]
        return [f"{r.resource.name} ({r.progress()})" for r in self.reflectors if not r.synced]

    async def run(self, stop: asyncio.Event) -> None:
        """Watch until `stop` is set; ApiConfigError if the client cannot be configured."""
        pending = {r.name for r in resources(self.node_name)}
        started = time.monotonic()

        def synced(name: str) -> Callable[[], None]:
            def done() -> None:
                pending.discard(name)
                if not pending:
                    log.info(
                        "initial lists delivered in %.1f s: %s",
                        time.monotonic() - started,
                        ", ".join(
                            f"{r.resource.name} {len(r.delivered):,}" for r in self.reflectors
                        ),
                    )
                    self.handler.synced(SOURCE_NAME)

            return done

        async with k8s.ApiClient(await self.server.configuration()) as api:
            self.reflectors = [
                Reflector(
                    r,
                    api,
                    self.handler,
                    self.rejections,
                    self.timing,
                    synced(r.name),
                    self.metrics,
                    self.on_contact,
                )
                for r in resources(self.node_name)
            ]
            tasks = [
                asyncio.create_task(r.run(), name=f"reflector-{r.resource.name}")
                for r in self.reflectors
            ]
            try:
                await stop.wait()
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
