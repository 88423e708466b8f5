"""Health endpoints over real HTTP on loopback: kube-proxy's /healthz, /livez, service health."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
import pytest
import uvloop

from lace_proxy.health import (
    HealthCheckPorts,
    ProxierHealth,
    ProxyServers,
    ServiceHealthServers,
    _go_time,
    is_node_eligible,
    split_host_port,
)
from lace_proxy.metrics import ProxyMetrics
from lace_proxy.model.endpointslice import EndpointPort
from lace_proxy.model.service import ServicePort
from lace_proxy.table import ServiceTable

from .tablekit import ep, eps, svc

LOOPBACK = "127.0.0.1"
T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
SYNC_PERIOD = 30.0  # health timeout: 60 s


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def metrics() -> ProxyMetrics:
    return ProxyMetrics()


@pytest.fixture
def health(clock: Clock, metrics: ProxyMetrics) -> ProxierHealth:
    return ProxierHealth(SYNC_PERIOD, metrics, clock=clock)


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    """Run on uvloop, the loop the proxy runs on."""

    async def main() -> None:
        await scenario()

    uvloop.run(main())


Reply = tuple[int, dict[str, str], bytes]


async def get(url: str) -> Reply:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return resp.status, dict(resp.headers), await resp.read()


async def get_json(url: str) -> tuple[int, dict[str, Any]]:
    status, headers, body = await get(url)
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Content-Type-Options"] == "nosniff"
    return status, json.loads(body)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def port_taken() -> Iterator[int]:
    """A loopback port someone else is listening on."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        s.listen()
        yield s.getsockname()[1]


def servers(health: ProxierHealth, metrics: ProxyMetrics, **kw: Any) -> ProxyServers:
    kw.setdefault("healthz_address", f"{LOOPBACK}:0")
    kw.setdefault("metrics_address", f"{LOOPBACK}:0")
    return ProxyServers(health, metrics, **kw)


# -- /healthz and /livez --


def test_healthy_while_starting_up_and_after_an_update(
    health: ProxierHealth, metrics: ProxyMetrics, clock: Clock
) -> None:
    async def scenario() -> None:
        s = servers(health, metrics)
        await s.start()
        try:
            url = f"http://{LOOPBACK}:{s.healthz_port}"
            status, body = await get_json(f"{url}/healthz")
            now = "2023-11-14T22:13:20Z"
            assert (status, body) == (
                200,
                {"lastUpdated": now, "currentTime": now, "nodeEligible": True, "healthy": True},
            )
            health.queued()  # queued before the first update: still starting up
            clock.now += 3600
            assert (await get_json(f"{url}/healthz"))[0] == 200
            health.updated()
            clock.now += 1.5
            status, body = await get_json(f"{url}/livez")
            current = "2023-11-14T23:13:21.5Z"
            family = {"lastUpdated": "2023-11-14T23:13:20Z", "healthy": True}
            assert (status, body) == (
                200,
                {
                    "lastUpdated": current,  # a 200 reports the current time, as kube-proxy
                    "currentTime": current,
                    "healthy": True,
                    "status": {"IPv4": family, "IPv6": family},
                },
            )
        finally:
            await s.stop()

    run(scenario)


def test_a_change_queued_longer_than_twice_the_sync_period_is_unhealthy(
    health: ProxierHealth, metrics: ProxyMetrics, clock: Clock
) -> None:
    async def scenario() -> None:
        s = servers(health, metrics)
        await s.start()
        try:
            url = f"http://{LOOPBACK}:{s.healthz_port}"
            health.updated()
            clock.now += 10
            health.queued()
            clock.now += 30
            health.queued()  # a later change does not move the deadline
            clock.now += 29.9
            assert (await get_json(f"{url}/healthz"))[0] == 200
            clock.now += 0.1  # the first queued change is now 60 s old
            for path in ("healthz", "livez"):
                status, body = await get_json(f"{url}/{path}")
                assert status == 503
                assert body["healthy"] is False
                assert body["lastUpdated"] == _go_time(T0)  # the real last update
                assert body["status"]["IPv6"] == {"lastUpdated": _go_time(T0), "healthy": False}
            assert not health.healthy()
            health.updated()
            assert (await get_json(f"{url}/healthz"))[0] == 200
            assert (await get_json(f"{url}/livez"))[0] == 200
        finally:
            await s.stop()
        healthz = "kubeproxy_proxy_healthz_total"
        assert metrics.registry.get_sample_value(healthz, {"code": "200"}) == 2
        assert metrics.registry.get_sample_value(healthz, {"code": "503"}) == 1
        livez = "kubeproxy_proxy_livez_total"
        assert metrics.registry.get_sample_value(livez, {"code": "503"}) == 1

    run(scenario)


def test_an_api_outage_fails_healthz_on_time_but_not_livez_or_service_checks(
    health: ProxierHealth, metrics: ProxyMetrics, clock: Clock
) -> None:
    async def scenario() -> None:
        s = servers(health, metrics)
        hc = ServiceHealthServers(health, metrics, addresses=[LOOPBACK])
        port = free_port()
        await s.start()
        await hc.sync({port: ("default/web", 1)})
        try:
            url = f"http://{LOOPBACK}:{s.healthz_port}"
            health.updated()
            health.source_contact("services", False)
            clock.now += 2 * SYNC_PERIOD - 0.1
            assert (await get_json(f"{url}/healthz"))[0] == 200
            health.source_contact("services", False)  # still out: the first loss counts
            clock.now += 0.1
            status, body = await get_json(f"{url}/healthz")
            assert (status, body["healthy"]) == (503, False)
            # Restarting the proxy would not bring the API back; the kernel keeps serving,
            # so the load balancers keep this node.
            assert (await get_json(f"{url}/livez"))[0] == 200
            assert (await service_reply(port))[0] == 200
            health.source_contact("services", True)
            assert (await get_json(f"{url}/healthz"))[0] == 200
        finally:
            await hc.stop()
            await s.stop()

    run(scenario)


def test_healthz_fails_while_the_node_is_not_eligible_livez_does_not(
    health: ProxierHealth, metrics: ProxyMetrics
) -> None:
    async def scenario() -> None:
        s = servers(health, metrics)
        await s.start()
        try:
            url = f"http://{LOOPBACK}:{s.healthz_port}"
            health.updated()
            health.node_eligible(False)
            status, body = await get_json(f"{url}/healthz")
            assert status == 503
            assert body["nodeEligible"] is False
            assert body["healthy"] is True  # the proxier itself is fine
            status, body = await get_json(f"{url}/livez")
            assert status == 200 and "nodeEligible" not in body
            health.node_eligible(True)
            assert (await get_json(f"{url}/healthz"))[0] == 200
        finally:
            await s.stop()

    run(scenario)


def test_node_eligibility_rule() -> None:
    assert is_node_eligible(False)
    assert is_node_eligible(False, ["node.kubernetes.io/unschedulable"])
    assert not is_node_eligible(True)
    assert not is_node_eligible(False, ["ToBeDeletedByClusterAutoscaler"])


def test_go_time_format() -> None:
    assert _go_time(None) == "0001-01-01T00:00:00Z"
    assert _go_time(T0) == "2023-11-14T22:13:20Z"
    assert _go_time(T0 + 0.25) == "2023-11-14T22:13:20.25Z"


# -- the metrics server --


def test_metrics_server_serves_metrics_proxy_mode_and_healthz(
    health: ProxierHealth, metrics: ProxyMetrics
) -> None:
    async def scenario() -> None:
        s = servers(health, metrics, healthz_address=None, proxy_mode="nftables")
        await s.start()
        try:
            assert s.healthz_port is None
            url = f"http://{LOOPBACK}:{s.metrics_port}"
            status, headers, body = await get(f"{url}/metrics")
            assert status == 200
            assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
            assert b"# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram" in body
            status, headers, body = await get(f"{url}/proxyMode")
            assert (status, body) == (200, b"nftables")
            assert headers["Content-Type"] == "text/plain; charset=utf-8"
            assert headers["X-Content-Type-Options"] == "nosniff"
            assert (await get(f"{url}/healthz"))[::2] == (200, b"ok")
            assert (await get(f"{url}/configz"))[0] == 404
        finally:
            await s.stop()

    run(scenario)


def test_a_taken_port_is_retried_until_it_frees_up(
    health: ProxierHealth, metrics: ProxyMetrics, caplog: pytest.LogCaptureFixture
) -> None:
    taken: list[int] = []

    async def scenario() -> None:
        with port_taken() as port:
            taken.append(port)
            s = servers(health, metrics, healthz_address=f"{LOOPBACK}:{port}", retry=0.02)
            await s.start()
            assert s.healthz_port is None and s.metrics_port is not None
            await asyncio.sleep(0.1)
        try:
            for _ in range(100):
                if s.healthz_port == port:
                    break
                await asyncio.sleep(0.02)
            assert s.healthz_port == port
            assert (await get_json(f"http://{LOOPBACK}:{port}/healthz"))[0] == 200
        finally:
            await s.stop()

    with caplog.at_level(logging.ERROR, logger="lace_proxy.health"):
        run(scenario)
    errors = [r.message for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors  # logged once, not at every retry
    assert errors[0].startswith(f"cannot serve healthz on {LOOPBACK}:{taken[0]} (")
    assert "address already in use" in errors[0]


def test_split_host_port() -> None:
    assert split_host_port("0.0.0.0:10256") == (None, 10256)
    assert split_host_port("[::]:10256") == (None, 10256)
    assert split_host_port("127.0.0.1:10249") == ("127.0.0.1", 10249)
    assert split_host_port("[::1]:0") == ("::1", 0)
    with pytest.raises(ValueError):
        split_host_port("localhost")


# -- service health check ports --


async def service_reply(port: int) -> tuple[int, dict[str, str], bytes]:
    status, headers, body = await get(f"http://{LOOPBACK}:{port}/")
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Content-Type-Options"] == "nosniff"
    return status, headers, body


def test_service_health_answers_as_kube_proxy(
    health: ProxierHealth, metrics: ProxyMetrics, clock: Clock
) -> None:
    async def scenario() -> None:
        hc = ServiceHealthServers(health, metrics, addresses=[LOOPBACK])
        a, b = free_port(), free_port()
        await hc.sync({a: ("default/web", 2), b: ("prod/api", 0)})
        try:
            status, headers, body = await service_reply(a)
            assert status == 200
            assert headers["X-Load-Balancing-Endpoint-Weight"] == "2"
            # Byte for byte what kube-proxy's template writes.
            assert body == (
                b'{\n\t"service": {\n\t\t"namespace": "default",\n\t\t"name": "web"\n\t},'
                b'\n\t"localEndpoints": 2,\n\t"serviceProxyHealthy": true\n}'
            )
            status, headers, body = await service_reply(b)
            assert status == 503
            assert headers["X-Load-Balancing-Endpoint-Weight"] == "0"
            assert json.loads(body)["service"] == {"namespace": "prod", "name": "api"}
            # An unhealthy proxier fails every health check, local endpoints or not.
            health.updated()
            health.queued()
            clock.now += 2 * SYNC_PERIOD
            status, _, body = await service_reply(a)
            assert status == 503
            assert json.loads(body)["serviceProxyHealthy"] is False
            assert json.loads(body)["localEndpoints"] == 2
        finally:
            await hc.stop()

    run(scenario)


def test_listeners_open_and_close_with_the_mapping(
    health: ProxierHealth, metrics: ProxyMetrics
) -> None:
    async def scenario() -> None:
        hc = ServiceHealthServers(health, metrics, addresses=[LOOPBACK])
        a, b = free_port(), free_port()
        try:
            await hc.sync({a: ("default/web", 1)})
            assert hc.ports == {a}
            await hc.sync({a: ("default/web", 0), b: ("default/api", 3)})
            assert hc.ports == {a, b}
            assert (await service_reply(a))[0] == 503  # the kept port answers the new count
            assert (await service_reply(b))[1]["X-Load-Balancing-Endpoint-Weight"] == "3"
            await hc.sync({b: ("default/api", 3)})
            assert hc.ports == {b}
            with pytest.raises(aiohttp.ClientConnectorError):
                await get(f"http://{LOOPBACK}:{a}/")
            assert (await service_reply(b))[0] == 200
        finally:
            await hc.stop()
        assert hc.ports == frozenset()
        with pytest.raises(aiohttp.ClientConnectorError):
            await get(f"http://{LOOPBACK}:{b}/")

    run(scenario)


def test_a_port_someone_else_holds_is_logged_counted_and_retried(
    health: ProxierHealth, metrics: ProxyMetrics, caplog: pytest.LogCaptureFixture
) -> None:
    failures = "lace_proxy_service_healthcheck_bind_failures_total"

    async def scenario() -> None:
        hc = ServiceHealthServers(health, metrics, addresses=[LOOPBACK])
        other = free_port()
        try:
            with port_taken() as port:
                mapping = {port: ("default/web", 1), other: ("default/api", 1)}
                await hc.sync(mapping)
                await hc.sync(mapping)
                assert hc.ports == {other}  # the rest is served
                assert metrics.registry.get_sample_value(failures) == 2
            await hc.sync(mapping)  # freed: the next sync takes it
            assert hc.ports == {port, other}
            assert (await service_reply(port))[0] == 200
        finally:
            await hc.stop()
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1  # logged once, not at every sync
        assert f"cannot serve health check {port} for default/web" in errors[0].message

    with caplog.at_level(logging.INFO, logger="lace_proxy.health"):
        run(scenario)


def test_health_check_ports_from_plans_full_and_incremental() -> None:
    table = ServiceTable("n1")
    ports = (ServicePort("http", "TCP", 80, 8080, 30080), ServicePort("https", "TCP", 443, 8443))
    table.upsert_service(
        svc(
            "lb",
            ips=("10.96.0.1", "fd00::1"),
            ports=ports,
            type="LoadBalancer",
            external_traffic_policy="Local",
            health_check_node_port=32000,
        )
    )
    slice_ports = (EndpointPort("http", "TCP", 8080), EndpointPort("https", "TCP", 8443))
    # Two local pods (one not ready) and one remote: one ready local endpoint per family,
    # counted once although it serves two ports.
    table.upsert_slice(
        eps(
            ep("10.0.0.1"),
            ep("10.0.0.2", ready=False),
            ep("10.0.0.3", "n2"),
            service="lb",
            ports=slice_ports,
        )
    )
    table.upsert_slice(
        eps(ep("fd00:1::1"), service="lb", name="lb-v6", address_type="IPv6", ports=slice_ports)
    )
    table.upsert_service(svc("plain", ips=("10.96.0.2",)))
    full = HealthCheckPorts()
    incremental = HealthCheckPorts()
    incremental.apply(table.build())
    table.commit()
    full.replace(table.plans())
    assert full.mapping() == incremental.mapping() == {32000: ("default/lb", 1)}
    # A second ready local endpoint.
    table.upsert_slice(eps(ep("10.0.0.1"), ep("10.0.0.2"), service="lb", ports=slice_ports))
    incremental.apply(table.build())
    table.commit()
    assert incremental.mapping() == {32000: ("default/lb", 2)}
    # Only a terminating local endpoint: it still serves, but the health check fails.
    terminating = ep("10.0.0.1", ready=False, terminating=True)
    table.upsert_slice(eps(terminating, ep("10.0.0.3", "n2"), service="lb", ports=slice_ports))
    table.delete_slice("default/lb-v6")
    incremental.apply(table.build())
    table.commit()
    assert incremental.mapping() == {32000: ("default/lb", 0)}
    # Back to externalTrafficPolicy Cluster: no health check port.
    table.upsert_service(svc("lb", ips=("10.96.0.1", "fd00::1"), ports=ports, type="LoadBalancer"))
    incremental.apply(table.build())
    table.commit()
    assert incremental.mapping() == {}
