"""The proxier: one change tracker, one sync loop, one dataplane (as kube-proxy's pkg/proxy).

Sources call the change-tracker methods on the event loop; they only update the table and
wake the loop. The loop coalesces changes: a sync per `min_sync_period` at most, with a
burst of two (`SyncTokens`), a verified full reconcile every `sync_period`, and
nothing is programmed before every source has delivered its initial state; until the first
sync has programmed it, the log (after `startup_report` seconds, and as often again) and
/healthz say what the proxy waits for (`waiting_for`). The dataplane runs in its own thread
(pyroute2 and the nft subprocess must stay off the uvloop loop); a failed sync commits
nothing and the next one is a full reconcile, retried with exponential backoff (see
`retry_delay`). What it calls on the dataplane is the contract in `lace_proxy.dataplane.base`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from lace_proxy.dataplane.base import Dataplane
from lace_proxy.dataplane.routes import PolicyRoutes
from lace_proxy.health import (
    HealthCheckPorts,
    ProxierHealth,
    ServiceHealthServers,
    is_node_eligible,
)
from lace_proxy.metrics import ProxyMetrics
from lace_proxy.model import EndpointSlice, LaceObject, Node, Service, ServiceCIDR
from lace_proxy.networks.graph import Condition, NetworkLayout
from lace_proxy.networks.view import NetworkView
from lace_proxy.table import Access, Plan, ServiceTable

log = logging.getLogger(__name__)

#: Seconds after starting without a first sync before the log says what the proxy waits for.
STARTUP_REPORT = 60.0


@dataclass
class SyncStats:
    """Counters the metrics endpoint and tests read."""

    syncs: int = 0
    full_syncs: int = 0
    failures: int = 0
    failures_in_a_row: int = 0  # since the last successful sync: sets the retry backoff
    last_error: str | None = None
    last_sync_seconds: float = 0.0
    last_sync_time: float = 0.0


#: Syncs that may follow each other without waiting: the periodic full sync and a change.
SYNC_BURST = 2


class SyncTokens:
    """The sync loop's rate limit: a token per `period`, at most two saved, each sync takes
    one. kube-proxy v1.37's runner has no burst (a sync, then minSyncPeriod before the next),
    but its only periodic sync is hourly; lace-proxy verifies the kernel every syncPeriod, and
    the second token keeps that sync from holding up a change that comes right after it. A
    stream of changes still syncs once a period. With one token, bench_vs_kube_proxy's p99 at
    10k was 829 ms (2.3 ms with two; median 1.4 ms)."""

    def __init__(self, period: float) -> None:
        self.period = period
        self._tokens = float(SYNC_BURST)
        self._at = float("-inf")  # no sync yet: the bucket is full

    def _level(self, now: float) -> float:
        if self.period <= 0:
            return float(SYNC_BURST)
        return min(float(SYNC_BURST), self._tokens + (now - self._at) / self.period)

    def wait(self, now: float) -> float:
        """Seconds until a sync may start (0: now)."""
        return max(0.0, (1.0 - self._level(now)) * self.period)

    def take(self, now: float) -> None:
        """A sync starts."""
        self._tokens = self._level(now) - 1.0
        self._at = now


class Proxier:
    """Keeps the dataplane in step with the table, which the sources keep in step with the world."""

    def __init__(
        self,
        table: ServiceTable,
        dataplane: Dataplane,
        *,
        sources: Iterable[str],
        min_sync_period: float = 1.0,
        sync_period: float = 30.0,
        metrics: ProxyMetrics | None = None,
        health: ProxierHealth | None = None,
        service_health: ServiceHealthServers | None = None,
        routes: PolicyRoutes | None = None,
        pod_networks: Callable[[tuple[str, ...]], None] | None = None,
        node_pod_cidrs: Callable[[tuple[str, ...]], None] | None = None,
        takeover: Callable[[], None] | None = None,
        announce: Callable[[Iterable[Plan], NetworkLayout, Node | None], None] | None = None,
        startup_report: float = STARTUP_REPORT,
    ) -> None:
        self.table = table
        self.dataplane = dataplane
        self.min_sync_period = min_sync_period
        self.sync_period = sync_period
        self._tokens = SyncTokens(min_sync_period)
        self.stats = SyncStats()
        self.metrics = metrics or ProxyMetrics()
        self.health = health or ProxierHealth(sync_period, self.metrics)
        self.service_health = service_health
        self._hc_ports = HealthCheckPorts()
        self.metrics.watch_table(table)
        self._waiting_for = set(sources)
        # Per source: what it has not delivered yet (see describe_source).
        self._source_waiting: dict[str, Callable[[], list[str]]] = {}
        self.startup_report = startup_report
        self._started: float | None = None  # when run() began
        # From now: the health servers may answer before the loop runs.
        self.health.starting(self.waiting_for)
        self.lace: dict[tuple[str, str], LaceObject] = {}  # Networks and policies, by kind
        self.service_cidrs: dict[str, ServiceCIDR] = {}  # by name
        self.networks = NetworkView()
        # The slices as the sources delivered them, before the network model narrows them
        # for the table (which holds the services as delivered).
        self._slices: dict[str, dict[str, EndpointSlice]] = {}  # by service key, slice key
        self._slice_service: dict[str, str] = {}  # slice key -> service key
        self._wake = asyncio.Event()
        self._need_full = True
        # The network model's layout as the dataplane last took it (a sync hands over the
        # layout of the same moment as the plans).
        self._programmed_layout = NetworkLayout()
        # Policy routes for the node's own service traffic: they follow the network model
        # and the node's addresses; nftables also needs the node's podCIDRs.
        self.routes = routes
        # Told the pod networks' prefixes at each sync (egress SNAT: whose traffic, and
        # which destinations stay untranslated).
        self._pod_networks = pod_networks
        # Told this node's podCIDRs when they change (egress SNAT: where its pods are routed).
        self._on_node_pod_cidrs = node_pod_cidrs
        self._routes_pending = routes is not None
        self._node_pod_cidrs: tuple[str, ...] = ()
        self._node_addresses: tuple[str, ...] = ()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dataplane")
        # Run once, after the first sync that succeeded: what the proxy before lace-proxy
        # left (kube-proxy's rules) goes only once lace-proxy's serve (a switch-over loses
        # no connection). A full sync follows, in case it removed kernel state both shared.
        self._takeover = takeover
        # Told every plan, the layout and this node's Node after a successful sync that
        # changed any of them, and after each full one (BGP: what this node announces), on a
        # thread of its own so that the kernel's programming never waits for the speaker.
        # Its failures are its own: it never fails a sync.
        self._announce = announce
        self._announced: tuple[NetworkLayout, Node | None] | None = None
        self._bgp_executor = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="bgp") if announce else None
        )
        self.node: Node | None = None  # this node's Node object, once a source has it

    # -- change tracker (called by sources, on the loop) --

    def _queued(self) -> None:
        self.metrics.record_queued()
        self.health.queued()
        self._wake.set()

    def service_upserted(self, svc: Service) -> None:
        self.table.upsert_service(svc)
        if self.networks.enabled:
            self._narrow(svc.key)
        self.metrics.record_change("service", svc.key)
        self._queued()

    def service_deleted(self, key: str) -> None:
        self.networks.forget(key)
        self.table.delete_service(key)
        self.metrics.record_change("service", key)
        self._queued()

    def slice_upserted(self, sl: EndpointSlice) -> None:
        old = self._slice_service.get(sl.key)
        if old is not None and old != sl.service_key:
            self._forget_slice(sl.key)
            if self.networks.enabled:
                self._narrow(old)  # the service it left
        self._slice_service[sl.key] = sl.service_key
        self._slices.setdefault(sl.service_key, {})[sl.key] = sl
        if self.networks.enabled:
            self._narrow(sl.service_key)
        else:
            self.table.upsert_slice(sl)
        self.metrics.record_change(
            "endpoints", sl.key, trigger_time=sl.trigger_time, family=sl.address_type
        )
        self._queued()

    def slice_deleted(self, key: str) -> None:
        service_key = self._forget_slice(key)
        self.table.delete_slice(key)
        if self.networks.enabled and service_key is not None:
            self._narrow(service_key)
        self.metrics.record_change("endpoints", key)
        self._queued()

    def delivered_slices(self) -> Mapping[str, Mapping[str, EndpointSlice]]:
        """The slices as the sources delivered them (before the network model narrowed
        them), by service key then slice key; for reading only."""
        return self._slices

    def _forget_slice(self, key: str) -> str | None:
        """Drop a slice from the sources' view; returns the service it belonged to."""
        service_key = self._slice_service.pop(key, None)
        if service_key is not None:
            by_key = self._slices[service_key]
            by_key.pop(key, None)
            if not by_key:
                del self._slices[service_key]
        return service_key

    def _narrow(self, service_key: str, *, only_if_changed: bool = False) -> None:
        """Give the table the service's slices as the network model lets it see them.

        With `only_if_changed`, nothing reaches the table unless the service's binding
        changed: the narrowed slices follow from the binding.
        """
        before = self.networks.bindings.get(service_key)
        slices = list(self._slices.get(service_key, {}).values())
        narrowed = self.networks.narrow(self.table.service(service_key), slices)
        binding = self.networks.bindings.get(service_key)
        if only_if_changed and before == binding:
            return
        was = set(before.conditions) if before else set()
        now = set(binding.conditions) if binding else set()
        if was != now:
            _log_conditions(was, now)
            self.metrics.record_conditions(c.code for c in self.networks.conditions)
        if binding is None:
            self.table.set_access(service_key, None)
        else:
            sources = tuple(sorted(binding.sources))
            self.table.set_access(service_key, Access(binding.network, sources))
        for sl in narrowed:
            self.table.upsert_slice(sl)

    def node_upserted(self, node: Node) -> None:
        if node.name == self.table.node_name:
            self.node = node
            self.table.set_node(node.name, node.zone)
            self.health.node_eligible(is_node_eligible(node.deleting))
            internal = tuple(a for kind, a in node.addresses if kind == "InternalIP")
            if self.dataplane.node_addresses_changed(internal):
                self._need_full = True
            self._node_changed(node.pod_cidrs, internal)
            self._queued()

    def node_deleted(self, name: str) -> None:
        if name == self.table.node_name:
            self.node = None
            self.table.set_node(name, None)
            self.health.node_eligible(False)
            if self.dataplane.node_addresses_changed(()):
                self._need_full = True
            self._node_changed((), ())
            self._queued()

    def _node_changed(self, pod_cidrs: tuple[str, ...], addresses: tuple[str, ...]) -> None:
        if (pod_cidrs, addresses) != (self._node_pod_cidrs, self._node_addresses):
            if pod_cidrs != self._node_pod_cidrs and self._on_node_pod_cidrs is not None:
                self._on_node_pod_cidrs(pod_cidrs)
            self._node_pod_cidrs, self._node_addresses = pod_cidrs, addresses
            self._layout_changed()

    def service_cidr_upserted(self, cidr: ServiceCIDR) -> None:
        self.service_cidrs[cidr.name] = cidr
        self._queued()

    def service_cidr_deleted(self, name: str) -> None:
        if self.service_cidrs.pop(name, None) is not None:
            self._queued()

    def lace_upserted(self, obj: LaceObject) -> None:
        self.lace[(obj.kind, obj.key)] = obj
        self._networks_changed()

    def lace_deleted(self, kind: str, name: str) -> None:
        if self.lace.pop((kind, name), None) is not None:
            self._networks_changed()

    def _networks_changed(self) -> None:
        """A Network or policy changed: the bindings it may affect are worked out again, and
        only the services whose binding changed reach the table (and so the kernel)."""
        was_enabled = self.networks.enabled
        old = self.networks.graph
        self.networks.set_objects(self.lace.values())
        _log_conditions(set(old.conditions), set(self.networks.graph.conditions))
        same_mode = was_enabled == self.networks.enabled
        affected = self.networks.graph.affected_by(old) if same_mode else None
        if affected is None:
            # Services present, and those whose slices were narrowed while they were.
            keys = {*self.table.service_keys(), *self.networks.bindings, *self._slices}
        else:
            keys = self.networks.members(affected)
        for service_key in keys:
            self._narrow(service_key, only_if_changed=same_mode)
        self._layout_changed()
        self.metrics.record_conditions(c.code for c in self.networks.conditions)
        self._queued()

    def layout(self) -> NetworkLayout:
        """The network model as the kernel needs it, with this node's podCIDRs and the
        ServiceCIDR objects' ranges."""
        layout = self.networks.graph.layout()
        if layout.enabled:
            layout = replace(layout, local_pod_cidrs=self._node_pod_cidrs)
        cidrs = sorted({c for obj in self.service_cidrs.values() for c in obj.cidrs})
        return replace(layout, service_cidrs=tuple(cidrs)) if cidrs else layout

    def _layout_changed(self) -> None:
        self._routes_pending = self.routes is not None

    def synced(self, source: str) -> None:
        self._waiting_for.discard(source)
        self._wake.set()

    @property
    def ready(self) -> bool:
        """True once every source has delivered its initial state."""
        return not self._waiting_for

    def describe_source(self, name: str, waiting: Callable[[], list[str]]) -> None:
        """How source `name` tells what it has not delivered yet (one line per resource),
        for `waiting_for`."""
        self._source_waiting[name] = waiting

    def waiting_for(self) -> list[str]:
        """What stands between the proxy and its first programmed state, one line each;
        empty once a sync has succeeded. A node whose proxy waits serves only what its kernel
        held before (nothing on a new node), so the operator must be able to see why."""
        if self.stats.syncs:
            return []
        if self._waiting_for:
            lines = []
            for name in sorted(self._waiting_for):
                describe = self._source_waiting.get(name)
                details = describe() if describe is not None else []
                lines += [f"{name} source: {d}" for d in details] or [f"{name} source"]
            return lines
        if self.stats.last_error is not None:
            return [f"a first sync the kernel takes (the last one failed: {self.stats.last_error})"]
        return ["the first sync (running)"]

    async def _report_startup(self, stop: asyncio.Event, started: float) -> None:
        """Log what the proxy waits for every `startup_report` seconds until the first sync
        succeeds (or the proxy stops); `started` is when run() began (monotonic)."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.startup_report)
            waiting = self.waiting_for()
            if stop.is_set() or not waiting:
                return
            log.warning(
                "nothing programmed yet, %.0f s after starting: waiting for %s",
                time.monotonic() - started,
                "; ".join(waiting),
            )

    def retry_delay(self) -> float:
        """How long after a failed sync the next try waits: min_sync_period (at least
        0.1 s), doubled with each failure in a row, at most sync_period. A kernel that keeps
        refusing is not hammered, and one that recovers is used again soon."""
        failures = self.stats.failures_in_a_row
        if not failures:
            return self.min_sync_period
        base = max(self.min_sync_period, 0.1)
        return min(base * 2 ** min(failures - 1, 30), max(self.sync_period, base))

    # -- sync loop --

    async def run(self, stop: asyncio.Event) -> None:
        """Sync until `stop` is set."""
        last = last_full = float("-inf")
        self._started = started = time.monotonic()
        self.health.updated()  # as kube-proxy: the loop starting counts as an update
        self.metrics.record_queued()
        stopper = asyncio.ensure_future(stop.wait())
        reporter = asyncio.create_task(self._report_startup(stop, started), name="startup-report")
        try:
            while not stop.is_set():
                waker = asyncio.ensure_future(self._wake.wait())
                # The periodic full sync counts from the last full one: a stream of partial
                # syncs must not postpone drift repair forever.
                timeout = (
                    None
                    if not self.ready
                    else max(0.0, last_full + self.sync_period - time.monotonic())
                )
                done, _ = await asyncio.wait(
                    {waker, stopper}, timeout=timeout, return_when="FIRST_COMPLETED"
                )
                waker.cancel()
                # Woken by the timeout: the periodic full sync is due. Not judged by the clock
                # alone: uvloop's timers fire up to a millisecond early, and a partial sync
                # with nothing to do would spend the tokens a change needs right after.
                periodic = not done
                if stop.is_set():
                    break
                if not self.ready:
                    self.health.updated()  # kube-proxy: an uninitialized sync succeeds
                    self._wake.clear()
                    continue
                # Coalesce: no more syncs than the tokens allow (after a failure, none before
                # the retry backoff).
                now = time.monotonic()
                if self.stats.failures_in_a_row:
                    delay = last + self.retry_delay() - now
                else:
                    delay = self._tokens.wait(now)
                if delay > 0:
                    log.debug("sync waits %.0f ms (rate limit or retry backoff)", delay * 1000)
                    await asyncio.wait({stopper}, timeout=delay)
                    if stop.is_set():
                        break
                self._wake.clear()
                self._tokens.take(time.monotonic())
                full = (
                    self._need_full or periodic or time.monotonic() - last_full >= self.sync_period
                )
                synced_full = self.stats.full_syncs
                if not await self.sync(full=full):
                    self._wake.set()  # retry after the backoff, as a full sync
                last = time.monotonic()
                if self.stats.full_syncs != synced_full:
                    last_full = last
        finally:
            stopper.cancel()
            reporter.cancel()
            self._executor.shutdown(wait=True)
            if self._bgp_executor is not None:
                self._bgp_executor.shutdown(wait=True)

    async def sync(self, full: bool = False) -> bool:
        """Program what changed (or everything); True on success."""
        loop = asyncio.get_running_loop()
        start = time.monotonic()
        full = full or self._need_full
        changes = self.table.build()
        layout = self.layout()  # of the same moment as the plans
        if self._pod_networks is not None:
            self._pod_networks(tuple(prefix for prefix, _ in layout.pod_prefixes))
        try:
            count = 0
            if not full and (changes or layout != self._programmed_layout):
                count = await loop.run_in_executor(
                    self._executor, self.dataplane.apply, changes, layout
                )
                self.table.commit()
                self._programmed_layout = layout
            elif not full:
                self.table.commit()
            if full:
                self._need_full = False  # before the await: a change meanwhile sets it again
                self.table.commit()
                plans = list(self.table.plans())
                count = await loop.run_in_executor(
                    self._executor, self.dataplane.full_sync, plans, changes, layout
                )
                self._programmed_layout = layout
                self.stats.full_syncs += 1
            if self.routes is not None and (full or self._routes_pending):
                self._routes_pending = False  # before the await: a change meanwhile sets it
                count += await loop.run_in_executor(
                    self._executor, self.routes.sync, self.layout(), self._node_addresses
                )
        except Exception as exc:  # the kernel refused: keep serving what is programmed
            self._need_full = True
            self.stats.failures += 1
            self.stats.failures_in_a_row += 1
            self.stats.last_error = str(exc)
            self.metrics.record_sync(time.monotonic() - start, full=full, ok=False)
            log.error(
                "sync failed (%s); retrying with a full sync in %.1f s", exc, self.retry_delay()
            )
            return False
        self.stats.syncs += 1
        self.stats.failures_in_a_row = 0
        self.stats.last_sync_seconds = time.monotonic() - start
        if full and self.stats.syncs == 1 and self._started is not None:
            log.info(
                "first sync programmed %.1f s after starting (%d plans)",
                time.monotonic() - self._started,
                len(plans),
            )
        self.metrics.record_sync(self.stats.last_sync_seconds, full=full, ok=True)
        self.health.updated()
        if self.service_health is not None:
            if full:
                self._hc_ports.replace(plans)
            else:
                self._hc_ports.apply(changes)
            await self.service_health.sync(self._hc_ports.mapping())
        self.stats.last_sync_time = time.time()
        self.stats.last_error = None
        announced = (self.layout(), self.node)
        if self._announce is not None and (full or changes or announced != self._announced):
            self._announced = announced
            await loop.run_in_executor(
                self._bgp_executor, self._announce, list(self.table.plans()), *announced
            )
        if self._takeover is not None:
            takeover, self._takeover = self._takeover, None
            await loop.run_in_executor(self._executor, takeover)
            self._need_full = True
            self._wake.set()
        if not count:
            log.debug(
                "%s sync: nothing to change, %.1f ms",
                "full" if full else "partial",
                self.stats.last_sync_seconds * 1000,
            )
        else:
            log.info(
                "%s sync: %d plan changes, %d nft commands, %.1f ms",
                "full" if full else "partial",
                len(changes),
                count,
                self.stats.last_sync_seconds * 1000,
            )
        return True


def _log_conditions(was: set[Condition], now: set[Condition]) -> None:
    """Each network-model condition is logged when it appears and when it is resolved."""
    for c in sorted(now - was):
        log.warning("network model: %s %s: %s [%s]", c.subject, c.code, c.message, c.code)
    for c in sorted(was - now):
        log.info("network model: %s %s resolved", c.subject, c.code)
