"""Metrics: kube-proxy's names, types, labels and buckets; what each recording call changes."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lace_proxy import __version__, implementation
from lace_proxy.metrics import NETWORK_PROGRAMMING_BUCKETS, SYNC_BUCKETS, ProxyMetrics
from lace_proxy.model.service import ServicePort
from lace_proxy.table import ServiceTable

from ..helpers import exercise_metrics
from .tablekit import ep, eps, svc

V4, V6 = {"ip_family": "IPv4"}, {"ip_family": "IPv6"}


class Clocks:
    """Wall and monotonic time that only move when a test says so."""

    def __init__(self) -> None:
        self.wall = 1_700_000_000.0
        self.mono = 100.0

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


@pytest.fixture
def m(clocks: Clocks) -> ProxyMetrics:
    return ProxyMetrics(clock=lambda: clocks.wall, monotonic=lambda: clocks.mono)


def value(m: ProxyMetrics, name: str, labels: dict[str, str] | None = None) -> float | None:
    return m.registry.get_sample_value(name, labels or {})


def text(m: ProxyMetrics) -> str:
    return m.exposition()[0].decode()


def types(exposition: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", exposition, re.MULTILINE))


KUBE_PROXY = {
    # name: (type, labels) as kube-proxy (pkg/proxy/metrics/metrics.go) exports them
    "kubeproxy_sync_proxy_rules_duration_seconds": ("histogram", {"ip_family"}),
    "kubeproxy_sync_full_proxy_rules_duration_seconds": ("histogram", {"ip_family"}),
    "kubeproxy_sync_partial_proxy_rules_duration_seconds": ("histogram", {"ip_family"}),
    "kubeproxy_sync_proxy_rules_last_timestamp_seconds": ("gauge", {"ip_family"}),
    "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds": ("gauge", {"ip_family"}),
    "kubeproxy_network_programming_duration_seconds": ("histogram", {"ip_family"}),
    "kubeproxy_sync_proxy_rules_endpoint_changes_pending": ("gauge", set()),
    "kubeproxy_sync_proxy_rules_endpoint_changes_total": ("counter", set()),
    "kubeproxy_sync_proxy_rules_service_changes_pending": ("gauge", set()),
    "kubeproxy_sync_proxy_rules_service_changes_total": ("counter", set()),
    "kubeproxy_sync_proxy_rules_nftables_sync_failures_total": ("counter", {"ip_family"}),
    "kubeproxy_sync_proxy_rules_no_local_endpoints_total": (
        "gauge",
        {"traffic_policy", "ip_family"},
    ),
    "kubeproxy_proxy_healthz_total": ("counter", {"code"}),
    "kubeproxy_proxy_livez_total": ("counter", {"code"}),
}
LACE = {
    "lace_proxy_sync_failures_total": ("counter", {"mode"}),
    "lace_proxy_rejected_objects_total": ("counter", {"kind", "reason"}),
    "lace_proxy_watch_restarts_total": ("counter", {"resource"}),
    "lace_proxy_relists_total": ("counter", {"resource"}),
    "lace_proxy_service_healthcheck_bind_failures_total": ("counter", set()),
    "lace_proxy_build_info": ("gauge", {"version", "table"}),
    "lace_proxy_network_conditions": ("gauge", {"code"}),
    "lace_proxy_egress_syncs_total": ("counter", {"result"}),
    "lace_proxy_udp_flows_moved_total": ("counter", {"result"}),
    "lace_proxy_egress_ranges": ("gauge", set()),
    "lace_proxy_bgp_peers": ("gauge", {"state"}),
    "lace_proxy_bgp_announced_routes": ("gauge", set()),
    "lace_proxy_bgp_errors_total": ("counter", {"kind"}),
    "lace_proxy_table_services": ("gauge", set()),
    "lace_proxy_table_plans": ("gauge", set()),
    "lace_proxy_table_backends": ("gauge", set()),
    "lace_proxy_frontend_conflicts": ("gauge", set()),
}


def test_names_types_and_labels(m: ProxyMetrics) -> None:
    exercise_metrics(m)
    exposition = text(m)
    assert types(exposition) == {name: kind for name, (kind, _) in {**KUBE_PROXY, **LACE}.items()}
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:
            base = (
                re.sub(r"_(bucket|count|sum)$", "", s.name)
                if family.type == "histogram"
                else s.name
            )
            labels.setdefault(base, set()).update(k for k in s.labels if k != "le")
    assert labels == {name: names for name, (_, names) in {**KUBE_PROXY, **LACE}.items()}
    assert m.exposition()[1] == "text/plain; version=0.0.4; charset=utf-8"


def test_promtool_accepts_the_exposition(m: ProxyMetrics) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (scripts/setup installs the prometheus package)")
    exercise_metrics(m)
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text(m), capture_output=True, text=True, timeout=30
    )
    problems = (result.stdout + result.stderr).strip().splitlines()
    # The one lint promtool has is kube-proxy's own: a gauge whose name ends in _total. Its
    # name is kept for dashboard compatibility; anything else (or a parse error) fails.
    assert problems in (
        [],
        [
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total "
            'non-counter metrics should not have "_total" suffix'
        ],
    ), problems
    assert result.returncode in (0, 3), result  # 3: lint problems only


def bucket_bounds(m: ProxyMetrics, name: str) -> list[str]:
    (family,) = (f for f in text_string_to_metric_families(text(m)) if f.name == name)
    return [
        s.labels["le"]
        for s in family.samples
        if s.name == f"{name}_bucket" and s.labels["ip_family"] == "IPv4"
    ]


def test_histogram_buckets_are_kube_proxys(m: ProxyMetrics) -> None:
    sync = ["0.001", "0.002", "0.004", "0.008", "0.016", "0.032", "0.064", "0.128", "0.256"]
    sync += ["0.512", "1.024", "2.048", "4.096", "8.192", "16.384", "+Inf"]
    for name in (
        "kubeproxy_sync_proxy_rules_duration_seconds",
        "kubeproxy_sync_full_proxy_rules_duration_seconds",
        "kubeproxy_sync_partial_proxy_rules_duration_seconds",
    ):
        assert bucket_bounds(m, name) == sync
    assert len(SYNC_BUCKETS) == 15
    # MergeBuckets(Linear(0.25, 0.25, 2), Linear(1, 1, 59), Linear(60, 5, 12), Linear(120, 30, 7))
    # after Go's leading 0.
    expected = [0, 0.25, 0.5, *range(1, 60), *range(60, 120, 5), *range(120, 301, 30)]
    assert list(NETWORK_PROGRAMMING_BUCKETS) == [float(x) for x in expected]
    assert len(NETWORK_PROGRAMMING_BUCKETS) == 1 + 2 + 59 + 12 + 7
    bounds = bucket_bounds(m, "kubeproxy_network_programming_duration_seconds")
    assert [float(b) for b in bounds[:-1]] == [float(x) for x in expected]
    assert bounds[-1] == "+Inf"


def test_a_sync_is_observed_per_family_and_by_mode(m: ProxyMetrics, clocks: Clocks) -> None:
    m.record_sync(0.003, full=True, ok=True)
    m.record_sync(0.5, full=False, ok=True)
    for family in (V4, V6):
        assert value(m, "kubeproxy_sync_proxy_rules_duration_seconds_count", family) == 2
        assert value(m, "kubeproxy_sync_proxy_rules_duration_seconds_sum", family) == 0.503
        assert value(m, "kubeproxy_sync_full_proxy_rules_duration_seconds_count", family) == 1
        assert value(m, "kubeproxy_sync_partial_proxy_rules_duration_seconds_sum", family) == 0.5
        assert value(m, "kubeproxy_sync_proxy_rules_last_timestamp_seconds", family) == clocks.wall
    bucket = {**V4, "le": "0.004"}
    assert value(m, "kubeproxy_sync_proxy_rules_duration_seconds_bucket", bucket) == 1


def test_a_refused_sync_counts_a_failure_and_keeps_the_last_timestamp(
    m: ProxyMetrics, clocks: Clocks
) -> None:
    m.record_sync(0.01, full=True, ok=True)
    synced_at = clocks.wall
    clocks.advance(5)
    m.record_sync(0.01, full=False, ok=False)
    m.record_sync(0.01, full=True, ok=False)
    assert value(m, "lace_proxy_sync_failures_total", {"mode": "partial"}) == 1
    assert value(m, "lace_proxy_sync_failures_total", {"mode": "full"}) == 1
    for family in (V4, V6):
        assert value(m, "kubeproxy_sync_proxy_rules_nftables_sync_failures_total", family) == 2
        assert value(m, "kubeproxy_sync_proxy_rules_last_timestamp_seconds", family) == synced_at
        assert value(m, "kubeproxy_sync_proxy_rules_duration_seconds_count", family) == 3


def test_changes_stay_pending_until_a_sync_that_started_after_them_succeeds(
    m: ProxyMetrics, clocks: Clocks
) -> None:
    m.record_change("service", "default/a")
    m.record_change("service", "default/a")  # the same object again: one pending change
    m.record_change("service", "default/b")
    m.record_change("endpoints", "default/a-1")
    assert value(m, "kubeproxy_sync_proxy_rules_service_changes_total") == 3
    assert value(m, "kubeproxy_sync_proxy_rules_service_changes_pending") == 2
    assert value(m, "kubeproxy_sync_proxy_rules_endpoint_changes_pending") == 1
    clocks.advance(1)
    m.record_sync(0.5, full=False, ok=False)  # refused: nothing got programmed
    assert value(m, "kubeproxy_sync_proxy_rules_service_changes_pending") == 2
    clocks.advance(1)
    # A sync starts; a change arrives while it runs; the sync ends after 0.5 s.
    clocks.advance(0.2)
    m.record_change("endpoints", "default/b-1")
    clocks.advance(0.3)
    m.record_sync(0.5, full=False, ok=True)
    assert value(m, "kubeproxy_sync_proxy_rules_service_changes_pending") == 0
    assert value(m, "kubeproxy_sync_proxy_rules_endpoint_changes_pending") == 1
    assert value(m, "kubeproxy_sync_proxy_rules_endpoint_changes_total") == 2


def test_network_programming_latency_is_observed_once_programmed(
    m: ProxyMetrics, clocks: Clocks
) -> None:
    m.record_change("endpoints", "default/web-v4", trigger_time=clocks.wall - 2, family="IPv4")
    m.record_change("endpoints", "default/web-v6", trigger_time=clocks.wall - 3, family="IPv6")
    m.record_change("endpoints", "default/web-fqdn", trigger_time=clocks.wall, family="FQDN")
    m.record_change("endpoints", "default/web-old")  # no annotation: no latency
    clocks.advance(1)
    m.record_sync(0.1, full=False, ok=True)
    assert value(m, "kubeproxy_network_programming_duration_seconds_count", V4) == 1
    assert value(m, "kubeproxy_network_programming_duration_seconds_sum", V4) == 3
    assert value(m, "kubeproxy_network_programming_duration_seconds_sum", V6) == 4
    bucket = {**V6, "le": "4.0"}
    assert value(m, "kubeproxy_network_programming_duration_seconds_bucket", bucket) == 1
    m.record_sync(0.1, full=False, ok=True)  # observed once, not at every sync
    assert value(m, "kubeproxy_network_programming_duration_seconds_count", V4) == 1


def test_a_refused_sync_consumes_its_trigger_times_as_kube_proxy(
    m: ProxyMetrics, clocks: Clocks
) -> None:
    m.record_change("endpoints", "default/web", trigger_time=clocks.wall - 2, family="IPv4")
    clocks.advance(1)
    m.record_sync(0.1, full=False, ok=False)
    m.record_change("endpoints", "default/web", trigger_time=clocks.wall - 1, family="IPv4")
    clocks.advance(1)
    m.record_sync(0.1, full=True, ok=True)
    assert value(m, "kubeproxy_network_programming_duration_seconds_count", V4) == 1
    assert value(m, "kubeproxy_network_programming_duration_seconds_sum", V4) == 2


def test_queued_timestamp(m: ProxyMetrics, clocks: Clocks) -> None:
    m.record_queued()
    for family in (V4, V6):
        name = "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds"
        assert value(m, name, family) == clocks.wall


def test_table_gauges_read_the_committed_table(m: ProxyMetrics) -> None:
    table = ServiceTable("n1")
    m.watch_table(table)
    assert value(m, "lace_proxy_table_plans") == 0
    http = ServicePort("http", "TCP", 80, 8080, 30080)
    # Dual-stack LoadBalancer with externalTrafficPolicy Local, endpoints only on other nodes.
    table.upsert_service(
        svc(
            "lb",
            ips=("10.96.0.1", "fd00::1"),
            ports=(http,),
            type="LoadBalancer",
            external_traffic_policy="Local",
            health_check_node_port=32000,
        )
    )
    table.upsert_slice(eps(ep("10.0.0.1", "n2"), ep("10.0.0.2", "n3"), service="lb"))
    table.upsert_slice(eps(ep("fd00:1::1", "n2"), service="lb", name="lb-v6", address_type="IPv6"))
    # internalTrafficPolicy Local with a local endpoint: served, not counted.
    table.upsert_service(svc("itp", ips=("10.96.0.2",), internal_traffic_policy="Local"))
    table.upsert_slice(eps(ep("10.0.0.3", "n1"), service="itp"))
    # Two services claiming one external IP: the second does not serve it.
    for name, cluster_ip in (("a", "10.96.0.3"), ("b", "10.96.0.4")):
        table.upsert_service(svc(name, ips=(cluster_ip,), external_ips=("192.0.2.7",)))
    table.build()
    assert value(m, "lace_proxy_table_plans") == 0  # nothing committed (programmed) yet
    table.commit()
    assert value(m, "lace_proxy_table_services") == 4
    assert value(m, "lace_proxy_table_plans") == 5
    assert value(m, "lace_proxy_table_backends") == 2 + 1 + 1  # a and b have no endpoints
    assert value(m, "lace_proxy_frontend_conflicts") == 1
    no_local = "kubeproxy_sync_proxy_rules_no_local_endpoints_total"
    assert value(m, no_local, {"traffic_policy": "external", **V4}) == 1
    assert value(m, no_local, {"traffic_policy": "external", **V6}) == 1
    assert value(m, no_local, {"traffic_policy": "internal", **V4}) == 0


def test_sources_rejections_and_build_info(m: ProxyMetrics) -> None:
    m.source_event("relist", "services")
    m.source_event("watch_restart", "services")
    m.source_event("watch_restart", "services")
    m.record_rejection("Service", "invalid_port")
    assert value(m, "lace_proxy_relists_total", {"resource": "services"}) == 1
    assert value(m, "lace_proxy_watch_restarts_total", {"resource": "services"}) == 2
    labels = {"kind": "Service", "reason": "invalid_port"}
    assert value(m, "lace_proxy_rejected_objects_total", labels) == 1
    build = {"version": __version__, "table": implementation()}
    assert value(m, "lace_proxy_build_info", build) == 1
    with pytest.raises(ValueError, match="unknown source event"):
        m.source_event("resync", "services")


def test_known_label_values_start_at_zero(m: ProxyMetrics) -> None:
    assert value(m, "kubeproxy_proxy_healthz_total", {"code": "503"}) == 0
    assert value(m, "kubeproxy_sync_proxy_rules_nftables_sync_failures_total", V6) == 0
    assert value(m, "lace_proxy_sync_failures_total", {"mode": "full"}) == 0


def test_ipvs_mode_has_no_nftables_series_and_single_stack_one_family() -> None:
    m = ProxyMetrics(mode="ipvs", families=("IPv4",))
    m.record_sync(0.01, full=True, ok=False)
    exposition = text(m)
    assert "nftables" not in exposition
    assert 'ip_family="IPv6"' not in exposition
    assert value(m, "lace_proxy_sync_failures_total", {"mode": "full"}) == 1


def test_each_instance_has_its_own_registry() -> None:
    a, b = ProxyMetrics(), ProxyMetrics()
    a.record_change("service", "default/web")
    assert value(a, "kubeproxy_sync_proxy_rules_service_changes_total") == 1
    assert value(b, "kubeproxy_sync_proxy_rules_service_changes_total") == 0
