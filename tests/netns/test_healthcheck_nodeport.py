"""Health servers inside a node namespace, probed from another host over the veth (IPv4, IPv6).

What a cloud load balancer's health checker sees: the healthCheckNodePort and /healthz on the
node's own addresses, both families from one wildcard, as kube-proxy's Go listeners answer.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest
import uvloop

from lace_proxy.demo.testbed import UPLINK_NODE4, UPLINK_NODE6, Netns, Testbed
from lace_proxy.health import ProxierHealth, ProxyServers, ServiceHealthServers
from lace_proxy.metrics import ProxyMetrics

pytestmark = pytest.mark.netns

HEALTH_CHECK_PORT = 32123  # not one of the testbed's server ports
T = TypeVar("T")


@contextmanager
def loop_in(ns: Netns) -> Iterator[asyncio.AbstractEventLoop]:
    """A uvloop whose thread lives in `ns`, so every socket it opens belongs to that namespace."""
    loop = uvloop.new_event_loop()
    thread = threading.Thread(target=ns.call, args=(loop.run_forever,), daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def on(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run_coroutine_threadsafe(coro, loop).result(10)


def http_get(tb: Testbed, ip: str, port: int, path: str = "/") -> tuple[int, dict[str, str], Any]:
    """GET from the client namespace: (status, headers, parsed JSON body)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with tb.client.ns.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        sock.connect((ip, port))
        host = f"[{ip}]" if ":" in ip else ip
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in header_lines)
    return int(status_line.split()[1]), headers, json.loads(body)


@pytest.fixture
def tb(make_testbed: Callable[..., Testbed]) -> Testbed:
    return make_testbed(pods=0)


def test_health_check_node_port_answers_the_load_balancer(tb: Testbed) -> None:
    metrics = ProxyMetrics()
    health = ProxierHealth(30, metrics)
    servers = ServiceHealthServers(health, metrics)  # every address, both families
    with loop_in(tb.node.ns) as loop:
        on(loop, servers.sync({HEALTH_CHECK_PORT: ("default/web", 2)}))
        try:
            for node_ip in (UPLINK_NODE4, UPLINK_NODE6):
                status, headers, body = http_get(tb, node_ip, HEALTH_CHECK_PORT)
                assert status == 200
                assert headers["X-Load-Balancing-Endpoint-Weight"] == "2"
                assert body["service"] == {"namespace": "default", "name": "web"}
            on(loop, servers.sync({HEALTH_CHECK_PORT: ("default/web", 0)}))
            status, _, body = http_get(tb, UPLINK_NODE6, HEALTH_CHECK_PORT)
            assert (status, body["localEndpoints"]) == (503, 0)
            on(loop, servers.sync({}))
            with pytest.raises(ConnectionRefusedError):
                http_get(tb, UPLINK_NODE4, HEALTH_CHECK_PORT)
        finally:
            on(loop, servers.stop())


def test_healthz_on_a_wildcard_answers_both_families_metrics_stay_local(tb: Testbed) -> None:
    metrics = ProxyMetrics()
    health = ProxierHealth(30, metrics)
    servers = ProxyServers(health, metrics)  # kube-proxy's defaults: 0.0.0.0:10256, 127.0.0.1:10249
    with loop_in(tb.node.ns) as loop:
        on(loop, servers.start())
        try:
            assert (servers.healthz_port, servers.metrics_port) == (10256, 10249)
            for node_ip in (UPLINK_NODE4, UPLINK_NODE6):
                status, _, body = http_get(tb, node_ip, 10256, "/healthz")
                assert (status, body["healthy"], body["nodeEligible"]) == (200, True, True)
            with pytest.raises(ConnectionRefusedError):
                http_get(tb, UPLINK_NODE4, 10249, "/metrics")
        finally:
            on(loop, servers.stop())
