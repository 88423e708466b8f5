"""Health endpoints, as kube-proxy serves them (pkg/proxy/healthcheck), on the control-plane loop.

* `ProxierHealth`: is the proxy keeping up? It is told when changes are queued and when syncs
  succeed; a change left unprogrammed for 2 x syncPeriod makes it unhealthy. /healthz also
  fails while the node is being deleted (so load balancers drain it first), and once the proxy
  has waited that long for its first programmed state (its body says what for); /livez does
  not.
* `ServiceHealthServers`: one listener per healthCheckNodePort (LoadBalancer services with
  externalTrafficPolicy Local), telling the cloud load balancer whether this node has local
  endpoints; `HealthCheckPorts` derives what they serve from the plans each sync programs.
* `ProxyServers`: /healthz and /livez on healthzBindAddress; /metrics, /proxyMode and a plain
  /healthz on metricsBindAddress.

Everything runs on the asyncio (uvloop) loop with aiohttp; state is only touched on that loop.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from lace_proxy.metrics import ProxyMetrics
from lace_proxy.table import Changeset, Plan

log = logging.getLogger(__name__)

#: The taint the cluster autoscaler puts on a node it is about to delete.
TO_BE_DELETED_TAINT = "ToBeDeletedByClusterAutoscaler"
DEFAULT_HEALTHZ_ADDRESS = "0.0.0.0:10256"
DEFAULT_METRICS_ADDRESS = "127.0.0.1:10249"
#: kube-proxy retries a healthz or metrics listener that failed to bind every 5 seconds.
BIND_RETRY_SECONDS = 5.0
#: How long stopping a server waits for requests in flight (health answers are immediate).
_SHUTDOWN_SECONDS = 1.0
_JSON_HEADERS = {"Content-Type": "application/json", "X-Content-Type-Options": "nosniff"}
_TEXT_HEADERS = {"Content-Type": "text/plain; charset=utf-8", "X-Content-Type-Options": "nosniff"}


def is_node_eligible(deleting: bool, taint_keys: Iterable[str] = ()) -> bool:
    """kube-proxy's rule: a node being deleted, or marked for deletion by the autoscaler, is not."""
    return not deleting and TO_BE_DELETED_TAINT not in taint_keys


def _go_time(ts: float | None) -> str:
    """A UNIX time as Go's encoding/json writes a time.Time (RFC 3339, UTC); None is Go's zero."""
    if ts is None:
        return "0001-01-01T00:00:00Z"
    dt = datetime.fromtimestamp(ts, UTC)
    text = dt.strftime("%Y-%m-%dT%H:%M:%S")
    if dt.microsecond:
        text += f".{dt.microsecond:06d}".rstrip("0")
    return text + "Z"


def split_host_port(address: str) -> tuple[str | None, int]:
    """(host, port) of "IP:port" or "[IPv6]:port"; a wildcard host is None (all addresses).

    Go listens on 0.0.0.0 or [::] with one dual-stack socket; None makes asyncio bind both
    families, so kube-proxy's default 0.0.0.0:10256 answers over IPv6 too.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"not an IP:port address: {address!r}")
    ip = ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    return (None if ip.is_unspecified else str(ip)), int(port)


class ProxierHealth:
    """kube-proxy's proxier health: healthy unless a queued change waits longer than 2 x syncPeriod.

    As in kube-proxy, the proxy is healthy until its first `updated()` (it is starting up),
    and the node is eligible until told otherwise. `clock` (UNIX seconds) is injectable.
    """

    def __init__(
        self,
        sync_period: float,
        metrics: ProxyMetrics,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.timeout = 2 * sync_period
        self._metrics = metrics
        self._clock = clock
        self._last_updated: float | None = None
        self._oldest_queued: float | None = None
        self._node_eligible = True
        self._sources_lost: dict[str, float] = {}  # resource -> when contact was lost
        self._started: float | None = None
        self._waiting: Callable[[], list[str]] | None = None

    def queued(self) -> None:
        """A change that needs a sync arrived; the oldest unprogrammed one sets the deadline."""
        if self._oldest_queued is None:
            self._oldest_queued = self._clock()

    def updated(self) -> None:
        """A sync succeeded: everything queued so far is programmed."""
        self._oldest_queued = None
        self._last_updated = self._clock()

    def source_contact(self, resource: str, ok: bool) -> None:
        """The API source lost (or regained) contact for a resource.

        The kernel keeps serving what it has, but a proxy that cannot see changes for
        longer than the health timeout is reported unhealthy by /healthz, so operators
        notice. /livez is not: a restart cannot bring the API back, and kubelet would
        otherwise restart every node's proxy, leaving them in crash-loop backoff (not
        watching) when the API returns.
        """
        if ok:
            self._sources_lost.pop(resource, None)
        else:
            self._sources_lost.setdefault(resource, self._clock())

    def starting(self, waiting: Callable[[], list[str]]) -> None:
        """The proxy starts: until `waiting()` is empty, nothing of this run is programmed.

        kube-proxy stays healthy while it starts, however long; here /healthz (the
        readiness probe) turns 503 once that lasts 2 x syncPeriod, as a queued change does,
        so a node that serves nothing (or only what its kernel held) is seen, and a rollout
        waits. /livez does not: a restart would only start the lists over. Both bodies carry
        `waitingFor` (what it waits for) while it waits.
        """
        self._started = self._clock()
        self._waiting = waiting

    def _started_too_long(self, now: float) -> bool:
        """Whether the proxy has waited the health timeout for its first programmed state."""
        started = self._started
        return started is not None and now - started >= self.timeout and bool(self._waiting_for())

    def _waiting_for(self) -> list[str]:
        """What the proxy still waits for before its first programmed state ([] if nothing)."""
        if self._waiting is None:
            return []
        waiting = self._waiting()
        if not waiting:
            self._waiting = None  # programmed: it never waits again in this run
        return waiting

    def node_eligible(self, eligible: bool) -> None:
        """Whether this node should receive load-balancer traffic (see `is_node_eligible`)."""
        self._node_eligible = eligible

    def healthy(self) -> bool:
        """Whether syncing works (what the service health checks report): an API outage
        seen on every node must not take every node out of the load balancers."""
        return self._healthy(self._clock(), readiness=False)

    def _healthy(self, now: float, *, readiness: bool = True) -> bool:
        if readiness and any(now - lost >= self.timeout for lost in self._sources_lost.values()):
            return False
        if readiness and self._started_too_long(now):
            return False
        return (
            self._last_updated is None
            or self._oldest_queued is None
            or now - self._oldest_queued < self.timeout
        )

    def healthz(self) -> tuple[int, dict[str, Any]]:
        """/healthz: 503 when unhealthy or the node is not eligible; counted by code."""
        now = self._clock()
        proxier_healthy = self._healthy(now)
        code = 200 if proxier_healthy and self._node_eligible else 503
        self._metrics.record_healthz(code)
        return code, self._body(now, code == 200, proxier_healthy, self._node_eligible)

    def livez(self) -> tuple[int, dict[str, Any]]:
        """/livez: whether syncing works (a node being drained, or a proxy that cannot reach
        the API, is still alive)."""
        now = self._clock()
        healthy = self._healthy(now, readiness=False)
        code = 200 if healthy else 503
        self._metrics.record_livez(code)
        return code, self._body(now, healthy, healthy, None)

    def _body(
        self, now: float, ok: bool, proxier_healthy: bool, node_eligible: bool | None
    ) -> dict[str, Any]:
        """kube-proxy's ProxyHealth JSON, field for field.

        When the answer is 200, lastUpdated is the current time: older kube-proxies reported
        the last sync loop run there, and clients read a recent value as "syncing".
        """
        last = self._last_updated
        body: dict[str, Any] = {
            "lastUpdated": _go_time(now if ok else last),
            "currentTime": _go_time(now),
        }
        if node_eligible is not None:
            body["nodeEligible"] = node_eligible
        body["healthy"] = proxier_healthy
        if last is not None:  # one sync programs every family: they share one state
            family_status = {"lastUpdated": _go_time(last), "healthy": proxier_healthy}
            body["status"] = dict.fromkeys(self._metrics.families, family_status)
        waiting = self._waiting_for()
        if waiting:  # lace-proxy's own field: kube-proxy's clients read past it
            body["waitingFor"] = waiting
        return body


def _json_response(code: int, body: dict[str, Any]) -> web.Response:
    return web.Response(
        status=code, body=json.dumps(body, separators=(",", ":")).encode(), headers=_JSON_HEADERS
    )


class HealthCheckPorts:
    """healthCheckNodePort -> (service, local ready endpoints), from what each sync programs.

    Fed what the dataplane is fed (every plan on a full sync, the changeset on a partial one),
    so a partial sync costs O(changes) and not a pass over the table.
    """

    def __init__(self) -> None:
        self._plans: dict[str, Plan] = {}  # plan id -> plan, for plans with a health check port

    def replace(self, plans: Iterable[Plan]) -> None:
        """After a full sync: `plans` is everything programmed."""
        self._plans = {p.id: p for p in plans if p.health_check_node_port}

    def apply(self, changes: Changeset) -> None:
        """After a partial sync: `changes` is what it programmed."""
        for plan in changes.removed:
            self._plans.pop(plan.id, None)
        for plan in (*changes.added, *(new for _, new in changes.updated)):
            if plan.health_check_node_port:
                self._plans[plan.id] = plan
            else:
                self._plans.pop(plan.id, None)

    def mapping(self) -> dict[int, tuple[str, int]]:
        """What `ServiceHealthServers.sync` takes.

        kube-proxy counts a service's distinct ready local endpoint IPs (a pod serving two
        ports is one endpoint) per IP family; the larger family count stands for both here.
        """
        services: dict[int, str] = {}
        ips: dict[tuple[int, int], set[str]] = {}
        for plan in self._plans.values():
            port = plan.health_check_node_port
            services[port] = plan.service
            ips.setdefault((port, plan.family), set()).update(
                b.ip for b in plan.local_backends if b.ready
            )
        counts = dict.fromkeys(services, 0)
        for (port, _), family_ips in ips.items():
            counts[port] = max(counts[port], len(family_ips))
        return {port: (services[port], counts[port]) for port in services}


@dataclass
class _Check:
    service: str  # namespace/name
    endpoints: int
    runner: web.BaseRunner


class ServiceHealthServers:
    """One HTTP listener per healthCheckNodePort, answering as kube-proxy's service_health.go.

    200 while the service has local ready endpoints and the proxier is healthy, else 503; the
    endpoint count also goes in X-Load-Balancing-Endpoint-Weight for weighted load balancers.
    `addresses` None listens on every address of both families (kube-proxy's default);
    otherwise on those IPs (nodePortAddresses). A port that cannot be bound (someone else
    holds it) is logged once, counted, and retried at every `sync` while it is wanted.
    """

    def __init__(
        self,
        health: ProxierHealth,
        metrics: ProxyMetrics,
        *,
        addresses: Sequence[str] | None = None,
    ) -> None:
        self._health = health
        self._metrics = metrics
        self._hosts: Sequence[str | None] = list(addresses) if addresses is not None else [None]
        self._checks: dict[int, _Check] = {}
        self._failed: dict[int, str] = {}  # port -> the bind error already logged
        self._lock = asyncio.Lock()

    @property
    def ports(self) -> frozenset[int]:
        """The ports being listened on."""
        return frozenset(self._checks)

    async def sync(self, mapping: Mapping[int, tuple[str, int]]) -> None:
        """Serve exactly `mapping` ({port: (namespace/name, local endpoints)}).

        Listeners are opened and closed incrementally; a kept port only updates its answer.
        """
        async with self._lock:
            for port in [p for p in self._checks if p not in mapping]:
                closed = self._checks.pop(port)
                log.info("closing health check %s for %s", port, closed.service)
                await closed.runner.cleanup()
            for port in [p for p in self._failed if p not in mapping]:
                del self._failed[port]
            for port, (service, endpoints) in mapping.items():
                check = self._checks.get(port)
                if check is not None:
                    check.service, check.endpoints = service, endpoints
                    continue
                runner = await self._listen(port, service)
                if runner is not None:
                    self._checks[port] = _Check(service, endpoints, runner)

    async def stop(self) -> None:
        """Close every listener."""
        await self.sync({})

    async def _listen(self, port: int, service: str) -> web.BaseRunner | None:
        server = web.Server(functools.partial(self._handle, port), access_log=None)
        runner = web.ServerRunner(server, shutdown_timeout=_SHUTDOWN_SECONDS)
        await runner.setup()
        try:
            for host in self._hosts:
                await web.TCPSite(runner, host, port).start()
        except OSError as exc:
            await runner.cleanup()  # also closes the addresses already bound
            self._metrics.record_healthcheck_bind_failure()
            if self._failed.get(port) != str(exc):
                log.error("cannot serve health check %s for %s: %s", port, service, exc)
                self._failed[port] = str(exc)
            return None
        if self._failed.pop(port, None) is not None:
            log.info("health check %s for %s: listening now", port, service)
        else:
            log.info("opened health check %s for %s", port, service)
        return runner

    async def _handle(self, port: int, request: web.BaseRequest) -> web.Response:
        check = self._checks.get(port)
        if check is None:  # a kept-alive connection outlived its listener
            return web.Response(status=503, headers=_TEXT_HEADERS)
        proxy_healthy = self._health.healthy()
        namespace, _, name = check.service.partition("/")
        # Go's body is an indented template; json.dumps with a tab indent writes the same bytes.
        body = json.dumps(
            {
                "service": {"namespace": namespace, "name": name},
                "localEndpoints": check.endpoints,
                "serviceProxyHealthy": proxy_healthy,
            },
            indent="\t",
        )
        return web.Response(
            status=200 if check.endpoints and proxy_healthy else 503,
            body=body.encode(),
            headers={**_JSON_HEADERS, "X-Load-Balancing-Endpoint-Weight": str(check.endpoints)},
        )


class _Listener:
    """One aiohttp application on host:port; a failed bind is logged and retried until stopped."""

    def __init__(self, what: str, address: str, app: web.Application, retry: float) -> None:
        self.what = what
        self.address = address
        self.host, self._port = split_host_port(address)
        self.port: int | None = None  # once bound
        self._retry = retry
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=_SHUTDOWN_SECONDS)
        self._retrying: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._runner.setup()
        if not await self._bind(first=True):
            self._retrying = asyncio.create_task(self._keep_trying())

    async def _bind(self, first: bool) -> bool:
        site = web.TCPSite(self._runner, self.host, self._port)
        try:
            await site.start()
        except OSError as exc:
            await site.stop()
            if first:
                log.error(
                    "cannot serve %s on %s (%s); retrying every %g s",
                    self.what,
                    self.address,
                    exc,
                    self._retry,
                )
            return False
        self.port = self._runner.addresses[0][1]
        log.info("serving %s on %s", self.what, self.address)
        return True

    async def _keep_trying(self) -> None:
        while True:
            await asyncio.sleep(self._retry)
            if await self._bind(first=False):
                return

    async def stop(self) -> None:
        if self._retrying is not None:
            self._retrying.cancel()
        await self._runner.cleanup()
        self.port = None


class ProxyServers:
    """kube-proxy's two HTTP servers.

    healthz_address: /healthz and /livez (`ProxierHealth`). metrics_address: /metrics, the
    plain-text /proxyMode ("nftables" or "ipvs") and a plain /healthz ("ok"), as kube-proxy's
    metrics server has. None disables a server. A bind that fails (the port is taken) is
    logged and retried every `retry` seconds, kube-proxy's default (no bindAddressHardFail).
    Port 0 binds an ephemeral port (tests); `healthz_port` / `metrics_port` say which.
    """

    def __init__(
        self,
        health: ProxierHealth,
        metrics: ProxyMetrics,
        *,
        healthz_address: str | None = DEFAULT_HEALTHZ_ADDRESS,
        metrics_address: str | None = DEFAULT_METRICS_ADDRESS,
        proxy_mode: str = "nftables",
        retry: float = BIND_RETRY_SECONDS,
    ) -> None:
        self._health = health
        self._metrics = metrics
        self._proxy_mode = proxy_mode
        self._healthz: _Listener | None = None
        self._metrics_server: _Listener | None = None
        if healthz_address is not None:
            app = web.Application()
            app.router.add_route("*", "/healthz", self._healthz_handler)
            app.router.add_route("*", "/livez", self._livez_handler)
            self._healthz = _Listener("healthz", healthz_address, app, retry)
        if metrics_address is not None:
            app = web.Application()
            app.router.add_route("*", "/metrics", self._metrics_handler)
            app.router.add_route("*", "/proxyMode", self._proxy_mode_handler)
            app.router.add_route("*", "/healthz", self._ok_handler)
            self._metrics_server = _Listener("metrics", metrics_address, app, retry)

    @property
    def healthz_port(self) -> int | None:
        return self._healthz.port if self._healthz else None

    @property
    def metrics_port(self) -> int | None:
        return self._metrics_server.port if self._metrics_server else None

    async def start(self) -> None:
        """Listen (or start retrying to); returns at once."""
        for listener in self._listeners():
            await listener.start()

    async def stop(self) -> None:
        for listener in self._listeners():
            await listener.stop()

    def _listeners(self) -> list[_Listener]:
        return [s for s in (self._healthz, self._metrics_server) if s is not None]

    async def _healthz_handler(self, request: web.Request) -> web.Response:
        return _json_response(*self._health.healthz())

    async def _livez_handler(self, request: web.Request) -> web.Response:
        return _json_response(*self._health.livez())

    async def _metrics_handler(self, request: web.Request) -> web.Response:
        body, content_type = self._metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def _proxy_mode_handler(self, request: web.Request) -> web.Response:
        return web.Response(text=self._proxy_mode, headers=_TEXT_HEADERS)

    async def _ok_handler(self, request: web.Request) -> web.Response:
        return web.Response(text="ok", headers=_TEXT_HEADERS)
