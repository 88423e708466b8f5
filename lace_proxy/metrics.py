"""Prometheus metrics: kube-proxy's names where the meaning matches, lace-proxy's own under `lace_`.

kube-proxy's series (pkg/proxy/metrics) keep their names, types, labels and buckets so its
dashboards and alerts work unchanged; lace-proxy programs both IP families in one sync, so
per-family series get the same observation under each family it serves, as a dual-stack
kube-proxy (one sync per family) would report. Everything lives in one `CollectorRegistry`
per `ProxyMetrics` (never the process-global default), so tests and embedders get their own
counters; callers use the recording methods and never touch prometheus objects.
"""

from __future__ import annotations

import collections
import functools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Literal, Protocol

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest

from lace_proxy import __version__, implementation
from lace_proxy.bgp import PEER_STATES

if TYPE_CHECKING:
    from lace_proxy.table import Plan

# kube-proxy exports no `_created` series; they would double the series count for nothing.
prometheus_client.disable_created_metrics()

#: The IP families a sync programs (the `ip_family` label values, as kube-proxy spells them).
FAMILIES: tuple[str, ...] = ("IPv4", "IPv6")
#: lace_proxy_network_conditions codes (see networks.graph.Condition).
CONDITION_CODES = (
    "unknown_network",
    "overlapping_prefixes",
    "selects_nothing",
    "two_bindings",
    "split_endpoints",
)

#: kube-proxy's sync buckets: ExponentialBuckets(0.001, 2, 15), 1 ms to 16.384 s.
SYNC_BUCKETS: tuple[float, ...] = tuple(0.001 * 2**i for i in range(15))

#: kube-proxy's network programming buckets. Its MergeBuckets starts from a 0 bucket (which
#: catches negative latencies from clock skew), then 0.25 s, 0.5 s, 1-59 s by 1, 60-115 s by 5
#: and 2-5 min by 30 s.
NETWORK_PROGRAMMING_BUCKETS: tuple[float, ...] = (
    0.0,
    0.25,
    0.5,
    *(float(s) for s in range(1, 60)),
    *(float(s) for s in range(60, 120, 5)),
    *(float(s) for s in range(120, 301, 30)),
)

#: What kube-proxy serves (client_golang's text format); newer prometheus_client releases
#: default to announcing version 1.0.0, which older scrapers may not expect.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

ChangeKind = Literal["service", "endpoints"]


class _Table(Protocol):
    """What the table gauges read from a ServiceTable."""

    def plans(self) -> Iterator[Plan]: ...

    @property
    def conflicts(self) -> Mapping[str, Sequence[str]]: ...


class ProxyMetrics:
    """The proxy's metrics and the small recording API the proxier, sources and health use.

    `clock` (wall time) stamps the timestamp gauges and network programming latency;
    `monotonic` orders changes against syncs. Both are injectable for tests.
    """

    def __init__(
        self,
        *,
        mode: str = "nftables",
        families: Sequence[str] = FAMILIES,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = CollectorRegistry()
        self.families = tuple(families)
        self._clock = clock
        self._monotonic = monotonic
        # (kind, key) -> when it last changed; cleared by the first sync that started later.
        self._pending: dict[str, dict[str, float]] = {"service": {}, "endpoints": {}}
        # (when recorded, family, trigger time) of endpoint changes not yet programmed.
        self._triggers: list[tuple[float, str, float]] = []
        self._tables = _TableCollector(self.families)
        r = self.registry

        self._sync = Histogram(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            ["ip_family"],
            buckets=SYNC_BUCKETS,
            registry=r,
        )
        self._full = Histogram(
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs",
            ["ip_family"],
            buckets=SYNC_BUCKETS,
            registry=r,
        )
        self._partial = Histogram(
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs",
            ["ip_family"],
            buckets=SYNC_BUCKETS,
            registry=r,
        )
        self._last_sync = Gauge(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            ["ip_family"],
            registry=r,
        )
        last_queued = Gauge(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued",
            ["ip_family"],
            registry=r,
        )
        self._network_programming = Histogram(
            "kubeproxy_network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            ["ip_family"],
            buckets=NETWORK_PROGRAMMING_BUCKETS,
            registry=r,
        )
        changes_pending = {
            "endpoints": Gauge(
                "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
                "Pending proxy rules Endpoint changes",
                registry=r,
            ),
            "service": Gauge(
                "kubeproxy_sync_proxy_rules_service_changes_pending",
                "Pending proxy rules Service changes",
                registry=r,
            ),
        }
        self._changes_total = {
            "endpoints": Counter(
                "kubeproxy_sync_proxy_rules_endpoint_changes",
                "Cumulative proxy rules Endpoint changes",
                registry=r,
            ),
            "service": Counter(
                "kubeproxy_sync_proxy_rules_service_changes",
                "Cumulative proxy rules Service changes",
                registry=r,
            ),
        }
        # kube-proxy registers the nftables failure counter only in nftables mode.
        self._nft_failures = (
            Counter(
                "kubeproxy_sync_proxy_rules_nftables_sync_failures",
                "Cumulative proxy nftables sync failures",
                ["ip_family"],
                registry=r,
            )
            if mode == "nftables"
            else None
        )
        self._healthz = Counter(
            "kubeproxy_proxy_healthz",
            "Cumulative proxy healthz HTTP status",
            ["code"],
            registry=r,
        )
        self._livez = Counter(
            "kubeproxy_proxy_livez",
            "Cumulative proxy livez HTTP status",
            ["code"],
            registry=r,
        )
        self._sync_failures = Counter(
            "lace_proxy_sync_failures",
            "Syncs the dataplane refused, by sync mode (the next sync is a full one)",
            ["mode"],
            registry=r,
        )
        self._rejected = Counter(
            "lace_proxy_rejected_objects",
            "API objects rejected by validation, by kind and reason code",
            ["kind", "reason"],
            registry=r,
        )
        self._watch_restarts = Counter(
            "lace_proxy_watch_restarts",
            "Lists or watches that failed (API unreachable, dropped, timed out) and were "
            "retried after a backoff",
            ["resource"],
            registry=r,
        )
        self._relists = Counter(
            "lace_proxy_relists",
            "Full relists of a resource (its resourceVersion expired)",
            ["resource"],
            registry=r,
        )
        self._bind_failures = Counter(
            "lace_proxy_service_healthcheck_bind_failures",
            "Attempts to listen on a healthCheckNodePort that failed (e.g. the port is taken)",
            registry=r,
        )
        self._conditions = Gauge(
            "lace_proxy_network_conditions",
            "Problems across Lace network objects (e.g. a binding to an unknown network), by code;"
            " each has a deterministic outcome shown by lace-proxy explain",
            ["code"],
            registry=r,
        )
        for code in CONDITION_CODES:
            self._conditions.labels(code)
        self._egress_syncs = Counter(
            "lace_proxy_egress_syncs",
            "Programmings of the egress SNAT table after a route change or resync, by result"
            " (error: the kernel refused it; retried with backoff)",
            ["result"],
            registry=r,
        )
        self._egress_ranges = Gauge(
            "lace_proxy_egress_ranges",
            "Destination ranges of the egress SNAT map (one per route with a preferred source)",
            registry=r,
        )
        for result in ("ok", "error"):
            self._egress_syncs.labels(result)
        self._udp_flows_moved = Counter(
            "lace_proxy_udp_flows_moved",
            "UDP flows moved off an endpoint that stopped serving (conntrack entries deleted),"
            " by whether replies still in flight were rescued (unrescued: the kernel refused"
            " the rescue, or more than 10,000 flows moved in one sync)",
            ["result"],
            registry=r,
        )
        for result in ("rescued", "unrescued"):
            self._udp_flows_moved.labels(result)
        self._bgp_peers = Gauge(
            "lace_proxy_bgp_peers",
            "This node's BGP peers by session state (Established, Active, ...; Down: the"
            " speaker does not run or has no session yet)",
            ["state"],
            registry=r,
        )
        self._bgp_routes = Gauge(
            "lace_proxy_bgp_announced_routes",
            "Routes this node announces by BGP (service addresses, service CIDR aggregates)",
            registry=r,
        )
        self._bgp_errors = Counter(
            "lace_proxy_bgp_errors",
            "BGP speaker failures, by kind (failed: BIRD refused the configuration or could"
            " not be run; restarted: BIRD was found dead and started again)",
            ["kind"],
            registry=r,
        )
        for kind in ("failed", "restarted"):
            self._bgp_errors.labels(kind)
        for state in PEER_STATES:
            self._bgp_peers.labels(state)
        Gauge(
            "lace_proxy_build_info",
            "lace-proxy's version and service table build (compiled or pure); always 1",
            ["version", "table"],
            registry=r,
        ).labels(__version__, implementation()).set(1)
        r.register(self._tables)

        # Read at scrape time: every Service and EndpointSlice event of a 30k start changes
        # them, and setting them per event cost more than the rest of the metrics.
        self._queued_at = 0.0
        for family in self.families:
            last_queued.labels(family).set_function(lambda: self._queued_at)
        for kind, gauge in changes_pending.items():
            gauge.set_function(functools.partial(len, self._pending[kind]))
        # Known label values start at zero, so rate() and absent() work from the first scrape.
        for family in self.families:
            for histogram in (self._sync, self._full, self._partial, self._network_programming):
                histogram.labels(family)
            if self._nft_failures is not None:
                self._nft_failures.labels(family)
        for code in ("200", "503"):
            self._healthz.labels(code)
            self._livez.labels(code)
        for sync_mode in ("full", "partial"):
            self._sync_failures.labels(sync_mode)

    # -- the proxier's change tracker and sync loop --

    def record_change(
        self,
        kind: ChangeKind,
        key: str,
        *,
        trigger_time: float | None = None,
        family: str | None = None,
    ) -> None:
        """A Service or EndpointSlice event (add, update or delete) reached the proxier.

        Counts it, and keeps `key` pending until a sync that started after it succeeds. An
        EndpointSlice's last-change-trigger-time (UNIX seconds) and address type (`family`)
        feed the network programming latency when the next sync programs it.
        """
        now = self._monotonic()
        self._changes_total[kind].inc()
        pending = self._pending[kind]
        pending[key] = now
        if trigger_time is not None and family in self.families:
            self._triggers.append((now, family, trigger_time))

    def record_queued(self) -> None:
        """A change asked for a sync (kube-proxy sets this on every queued sync)."""
        self._queued_at = self._clock()

    def record_sync(self, duration: float, *, full: bool, ok: bool) -> None:
        """One sync ended, after `duration` seconds; `ok` is False if the dataplane refused it.

        Call it right when the sync ends: changes recorded before it started are then taken
        as programmed (when `ok`; a refused sync leaves them pending) and their network
        programming latency is observed.
        """
        by_mode = self._full if full else self._partial
        for family in self.families:
            self._sync.labels(family).observe(duration)
            by_mode.labels(family).observe(duration)
        started = self._monotonic() - duration
        # As kube-proxy, a sync consumes the trigger times it started with, even if it fails
        # (so they cannot pile up while the dataplane refuses syncs).
        attempted = [t for t in self._triggers if t[0] <= started]
        if attempted:
            self._triggers = [t for t in self._triggers if t[0] > started]
        if not ok:
            self._sync_failures.labels("full" if full else "partial").inc()
            if self._nft_failures is not None:
                for family in self.families:
                    self._nft_failures.labels(family).inc()
            return
        wall = self._clock()
        for family in self.families:
            self._last_sync.labels(family).set(wall)
        for pending in self._pending.values():
            for key in [k for k, changed in pending.items() if changed <= started]:
                del pending[key]
        for _, family, trigger_time in attempted:
            self._network_programming.labels(family).observe(wall - trigger_time)

    def watch_table(self, table: _Table) -> None:
        """Export `table`'s sizes, conflicts and Local-policy gaps, read at each scrape.

        Reading at scrape time (not at each sync) keeps partial syncs O(changes); the values
        are those of the last committed (programmed) build, as kube-proxy's are.
        """
        self._tables.table = table

    # -- sources, validation, health --

    def record_conditions(self, codes: Iterable[str]) -> None:
        """The network model's current conditions (their codes, one per condition)."""
        counts = collections.Counter(codes)
        for code in {*CONDITION_CODES, *counts}:
            self._conditions.labels(code).set(counts.get(code, 0))

    def record_rejection(self, kind: str, reason: str) -> None:
        """An object of `kind` failed validation with reason code `reason`."""
        self._rejected.labels(kind, reason).inc()

    def source_event(self, event: str, resource: str) -> None:
        """A watch source's "watch_restart" or "relist" of `resource` (thread-safe)."""
        if event == "watch_restart":
            self._watch_restarts.labels(resource).inc()
        elif event == "relist":
            self._relists.labels(resource).inc()
        else:
            raise ValueError(f"unknown source event {event!r}")

    def record_egress_sync(self, ok: bool, ranges: int) -> None:
        """The egress table was programmed (ok) with `ranges` ranges, or refused."""
        self._egress_syncs.labels("ok" if ok else "error").inc()
        if ok:
            self._egress_ranges.set(ranges)

    def record_udp_flows_moved(self, rescued: int, unrescued: int) -> None:
        """A sync moved UDP flows off endpoints, rescuing the replies in flight of `rescued`."""
        self._udp_flows_moved.labels("rescued").inc(rescued)
        self._udp_flows_moved.labels("unrescued").inc(unrescued)

    def record_bgp(self, peer_states: Iterable[str], routes: int) -> None:
        """The BGP peers' states and the number of routes announced, as last seen."""
        counts = collections.Counter(peer_states)
        for state in {*PEER_STATES, *counts}:
            self._bgp_peers.labels(state).set(counts.get(state, 0))
        self._bgp_routes.set(routes)

    def record_bgp_error(self, kind: str) -> None:
        """A BGP speaker failure: "failed" or "restarted"."""
        self._bgp_errors.labels(kind).inc()

    def record_healthz(self, code: int) -> None:
        self._healthz.labels(str(code)).inc()

    def record_livez(self, code: int) -> None:
        self._livez.labels(str(code)).inc()

    def record_healthcheck_bind_failure(self) -> None:
        self._bind_failures.inc()

    # -- exposition --

    def exposition(self) -> tuple[bytes, str]:
        """The text exposition (format 0.0.4, as kube-proxy serves) and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE


class _TableCollector:
    """Scrape-time gauges over the committed table (zeros until `watch_table`)."""

    def __init__(self, families: tuple[str, ...]) -> None:
        self.families = families
        self.table: _Table | None = None

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        table = self.table
        if table is None:
            return self._families()
        services: set[str] = set()
        plans = backends = 0
        no_local = dict.fromkeys(
            ((p, f) for p in ("internal", "external") for f in self.families), 0
        )
        for plan in table.plans():
            plans += 1
            services.add(plan.service)
            backends += len(
                {(b.ip, b.port) for b in (*plan.cluster_backends, *plan.local_backends)}
            )
            family = f"IPv{plan.family}"
            # kube-proxy counts a service port whose Local policy leaves it no endpoint here
            # while other nodes have some: the "drop" verdicts (none at all is a "reject").
            if plan.internal_verdict == "drop" and ("internal", family) in no_local:
                no_local["internal", family] += 1
            if plan.external_verdict == "drop" and ("external", family) in no_local:
                no_local["external", family] += 1
        conflicts = sum(len(frontends) for frontends in table.conflicts.values())
        return self._families(len(services), plans, backends, conflicts, no_local)

    def _families(
        self,
        services: int = 0,
        plans: int = 0,
        backends: int = 0,
        conflicts: int = 0,
        no_local: Mapping[tuple[str, str], int] | None = None,
    ) -> list[Metric]:
        no_local_family = GaugeMetricFamily(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            "Number of services with a Local traffic policy and no endpoints",
            labels=["traffic_policy", "ip_family"],
        )
        for policy in ("internal", "external"):
            for family in self.families:
                count = no_local.get((policy, family), 0) if no_local else 0
                no_local_family.add_metric([policy, family], count)
        return [
            GaugeMetricFamily(
                "lace_proxy_table_services",
                "Services with at least one programmed service port",
                value=services,
            ),
            GaugeMetricFamily(
                "lace_proxy_table_plans",
                "Programmed service ports, one per IP family",
                value=plans,
            ),
            GaugeMetricFamily(
                "lace_proxy_table_backends",
                "Endpoints the programmed service ports forward to, summed over service ports",
                value=backends,
            ),
            GaugeMetricFamily(
                "lace_proxy_frontend_conflicts",
                "Frontends (address, protocol, port) a service does not serve because "
                "another service claimed them first",
                value=conflicts,
            ),
            no_local_family,
        ]
