"""`lace-proxy run` as a process on the node, following a manifest folder; the sandbox demo."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from lace_proxy.demo.sandbox import http_get, run_demo
from lace_proxy.demo.testbed import (
    CLIENT4,
    CLIENT6,
    POD_CIDR4,
    POD_CIDR6,
    SERVICE_CIDR4,
    UPLINK_NODE4,
    UPLINK_NODE6,
    Host,
    Result,
    Testbed,
    request_tcp,
)

from ..conftest import MODES
from ..lacekit import l3
from .proxykit import NODE, VIP4, VIP6, endpoints, names, service
from .runkit import RunProcess, lace_proxy, run_argv, wait_for, write

pytestmark = pytest.mark.netns

EXAMPLES = Path(__file__).resolve().parents[2] / "lace_proxy" / "demo" / "manifests"


@pytest.fixture(params=MODES)
def running(
    request: pytest.FixtureRequest, make_testbed: Callable[..., Testbed], tmp_path: Path
) -> Iterator[tuple[Testbed, Path, str]]:
    """`lace-proxy run` in each mode (IPVS inside the VM: tests/vm): testbed, folder, mode."""
    tb = make_testbed(pods=3)
    folder = tmp_path / "manifests"
    folder.mkdir()
    (folder / "web.yaml").write_text("")
    argv = run_argv(tb, folder, request.param, tmp_path / "state.sock")
    proxy = RunProcess(argv, tmp_path / "proxy.log")
    proxy.start()
    try:
        yield tb, folder, request.param
    finally:
        proxy.stop()


def answers(tb: Testbed, n: int = 30) -> set[str]:
    results: list[Result] = [request_tcp(tb.client, VIP4, 80, timeout=0.5) for _ in range(n)]
    return set(names(results))


def test_run_follows_the_folder_and_leaves_the_kernel_on_stop(
    running: tuple[Testbed, Path, str],
) -> None:
    tb, folder, _ = running
    write(folder, service("web", [VIP4]), endpoints("web", tb.pods))
    wait_for(lambda: answers(tb) == {"pod1", "pod2", "pod3"})
    write(folder, service("web", [VIP4]), endpoints("web", tb.pods[:1]))
    wait_for(lambda: answers(tb) == {"pod1"})
    (folder / "web.yaml").unlink()
    wait_for(lambda: answers(tb, 3) == {"escaped"})
    write(folder, service("web", [VIP4]), endpoints("web", tb.pods[1:2]))
    wait_for(lambda: answers(tb) == {"pod2"})


def test_stop_keeps_rules_and_cleanup_removes_them(running: tuple[Testbed, Path, str]) -> None:
    tb, folder, _ = running
    write(folder, service("web", [VIP4]), endpoints("web", tb.pods))
    wait_for(lambda: answers(tb) == {"pod1", "pod2", "pod3"})
    pkill = subprocess.run(
        ["pkill", "-TERM", "-f", f"lace_proxy run --manifests {folder}"], check=False
    )
    assert pkill.returncode == 0
    time.sleep(0.5)
    # Stopped: the kernel keeps serving what was programmed.
    assert answers(tb, 10) - {"pod1", "pod2", "pod3"} == set()
    out = subprocess.run(lace_proxy(tb, "cleanup"), capture_output=True, text=True, check=True)
    assert "removed" in out.stdout
    assert answers(tb, 3) == {"escaped"}
    again = subprocess.run(lace_proxy(tb, "cleanup"), capture_output=True, text=True, check=True)
    assert "not present" in again.stdout


def test_cleanup_removes_tables_rules_and_routes_the_proxy_made(
    make_testbed: Callable[..., Testbed], tmp_path: Path
) -> None:
    """State made by `lace-proxy run` itself (the network model on, so policy routes too),
    then `lace-proxy cleanup` with the same config: nothing of lace-proxy's remains."""
    tb = make_testbed(pods=1)
    folder = tmp_path / "manifests"
    folder.mkdir()
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE},
        "spec": {"podCIDRs": [POD_CIDR4]},
        "status": {"addresses": [{"type": "InternalIP", "address": UPLINK_NODE4}]},
    }
    (folder / "node.yaml").write_text(yaml.safe_dump_all([node, l3("pods", POD_CIDR4)]))
    config = tmp_path / "proxy.yaml"
    config.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
        f"clusterCIDR: {POD_CIDR4}\nlace:\n  serviceCIDRs: [{SERVICE_CIDR4}]\n"
        "  stateSocket: ''\n"
    )
    argv = ["--config", str(config), "--hostname-override", NODE]
    proc = subprocess.Popen(
        lace_proxy(tb, "run", *argv, "--manifests", str(folder)), stderr=subprocess.PIPE, text=True
    )

    def made() -> tuple[str, str, str]:
        rules = tb.exec(tb.node, ["ip", "rule"]).stdout
        routes = tb.exec(tb.node, ["ip", "route", "show", "table", "1450"], check=False).stdout
        return rules, routes, tb.exec(tb.node, ["nft", "list", "tables"]).stdout

    try:
        wait_for(lambda: "1450:" in made()[0] and "lace-proxy-egress" in made()[2])
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    rules, routes, tables = made()
    assert SERVICE_CIDR4 in routes and "table inet lace-proxy\n" in tables + "\n"
    out = subprocess.run(
        lace_proxy(tb, "cleanup", "--config", str(config)), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    rules, routes, tables = made()
    assert "1450:" not in rules and routes.strip() == ""
    assert "lace-proxy" not in tables
    assert (
        "1 removed"
        not in subprocess.run(
            lace_proxy(tb, "cleanup", "--config", str(config)), capture_output=True, text=True
        ).stdout
    )


def test_run_serves_health_and_metrics(running: tuple[Testbed, Path, str]) -> None:
    tb, folder, mode = running
    write(folder, service("web", [VIP4]), endpoints("web", tb.pods))
    wait_for(lambda: answers(tb) == {"pod1", "pod2", "pod3"})
    # /healthz on 0.0.0.0:10256, reachable from the client over the node's address.
    health = http_get(tb.client, tb.node.ipv4, 10256, path="/healthz")
    assert json.loads(health)["lastUpdated"], health
    assert http_get(tb.client, tb.node.ipv4, 10256, path="/livez").startswith("{")
    # /metrics and /proxyMode on 127.0.0.1:10249, inside the node only.
    metrics = http_get(tb.node, "127.0.0.1", 10249, path="/metrics")
    assert "kubeproxy_sync_proxy_rules_last_timestamp_seconds" in metrics
    assert "lace_proxy_table_services" in metrics
    assert http_get(tb.node, "127.0.0.1", 10249, path="/proxyMode") == mode
    # Egress SNAT is on (clusterCIDR given): a pod reaches the client, which knows no pod
    # addresses, as the node's address on that link (the route's preferred source).
    reply = request_tcp(tb.pods[0], CLIENT4, 8080)
    assert reply.reply is not None and reply.reply.peer == UPLINK_NODE4, reply
    assert 'lace_proxy_egress_syncs_total{result="ok"} 1.0' in metrics
    assert http_get(tb.client, tb.node.ipv4, 10249, path="/metrics").startswith("error")


def test_a_proxy_that_cannot_read_its_folder_says_so_on_healthz_then_converges(
    make_testbed: Callable[..., Testbed], tmp_path: Path
) -> None:
    """Nothing is programmed before the source has delivered its state: /healthz names the
    source and why it has not (the wiring of `run`; tests/unit/test_proxier_startup.py has
    the log and the 503 after 2 x syncPeriod). Fixed, the proxy converges."""
    tb = make_testbed(pods=3)
    folder = tmp_path / "manifests"
    os.mkfifo(folder)  # exists, but no folder: every scan fails
    argv = run_argv(tb, folder, "nftables", tmp_path / "state.sock")
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    try:

        def waiting() -> list[str] | None:
            reply = http_get(tb.node, "127.0.0.1", 10256, path="/healthz")
            return json.loads(reply).get("waitingFor") if reply.startswith("{") else None

        # Listening before the folder's first scan, it says so; then why the scan failed.
        unread = [f"files source: {folder} (not read yet)"]
        failed = [f"files source: {folder} ([Errno 20] Not a directory: '{folder}')"]
        wait_for(lambda: waiting() is not None)
        assert waiting() in (unread, failed)
        wait_for(lambda: waiting() == failed)
        folder.unlink()
        folder.mkdir()
        write(folder, service("web", [VIP4]), endpoints("web", tb.pods))
        wait_for(lambda: answers(tb) == {"pod1", "pod2", "pod3"})
        body = json.loads(http_get(tb.node, "127.0.0.1", 10256, path="/healthz"))
        assert "waitingFor" not in body
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "cannot read manifests: [Errno 20] Not a directory" in err


#: Behind the client (on its loopback), which the node reaches through it as a gateway.
BEYOND = {4: "10.253.9.9", 6: "fd00:253:9::9"}
UPLINK_NODE = {4: UPLINK_NODE4, 6: UPLINK_NODE6}


@pytest.mark.parametrize("family", [4, 6])
def test_a_pod_keeps_its_source_to_a_cluster_ip_whose_endpoint_is_outside_the_cluster_cidr(
    make_testbed: Callable[..., Testbed], tmp_path: Path, family: int
) -> None:
    """Issue 31, 2, as operators run it: `lace-proxy run` from a KubeProxyConfiguration
    (dual-stack clusterCIDR, detectLocalMode ClusterCIDR, egress SNAT on by default). A pod's
    connection to a ClusterIP is service traffic, whose masquerade is kube-proxy's decision:
    kube-proxy's nftables mode keeps the pod's source towards an endpoint outside clusterCIDR
    (here the client on the uplink, and an address behind it), so the egress SNAT must leave
    it too; the same pod reaching those addresses directly is egress, translated."""
    tb = make_testbed(pods=1)
    ip = "-4" if family == 4 else "-6"
    tb.exec(tb.client, ["ip", ip, "addr", "add", BEYOND[family], "dev", "lo"])
    via = CLIENT4 if family == 4 else CLIENT6
    tb.exec(tb.node, ["ip", ip, "route", "add", BEYOND[family], "via", via])
    beyond = Host("client", BEYOND[4], BEYOND[6], tb.client.ns)
    folder = tmp_path / "manifests"
    folder.mkdir()
    (folder / "services.yaml").write_text(
        yaml.safe_dump_all(
            [
                service("near", [VIP4, VIP6]),
                endpoints("near", [tb.client]),
                endpoints("near", [tb.client], v6=True),
                service("beyond", ["10.96.0.20", "fd00:96::20"]),
                endpoints("beyond", [beyond]),
                endpoints("beyond", [beyond], v6=True),
            ]
        )
    )
    config = tmp_path / "proxy.yaml"
    config.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
        f"mode: nftables\nclusterCIDR: {POD_CIDR4},{POD_CIDR6}\n"
        "detectLocalMode: ClusterCIDR\nlace:\n  stateSocket: ''\n"
    )
    argv = ["--config", str(config), "--hostname-override", NODE, "--manifests", str(folder)]
    proxy = RunProcess(lace_proxy(tb, "run", *argv), tmp_path / "proxy.log")
    proxy.start()
    try:
        # Both tables in place: the services' (its first sync) and the egress SNAT's.
        wait_for(
            lambda: (
                "first sync programmed" in proxy.output()
                and "lace-proxy-egress" in tb.exec(tb.node, ["nft", "list", "tables"]).stdout
            )
        )
        pod = tb.pods[0]
        own = pod.ipv4 if family == 4 else pod.ipv6
        cluster_ips = {"near": (VIP4, VIP6), "beyond": ("10.96.0.20", "fd00:96::20")}
        for name, address in (("near", via), ("beyond", BEYOND[family])):
            result = request_tcp(pod, cluster_ips[name][family == 6], 80)
            assert result.reply is not None and result.reply.name == "client", (name, result)
            assert result.reply.peer == own, (name, result)  # as kube-proxy: not masqueraded
            direct = request_tcp(pod, address, 8080)
            assert direct.reply is not None, (name, direct)
            assert direct.reply.peer == UPLINK_NODE[family], (name, direct)  # egress
    finally:
        proxy.stop()


def inventory(tb: Testbed, what: str, *args: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "lace_proxy", what, "-o", "json", *args]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    doc: dict[str, Any] = json.loads(out)
    return doc


def test_services_and_endpoints_ask_the_running_proxy(running: tuple[Testbed, Path, str]) -> None:
    tb, folder, _ = running
    sock = str(folder.parent / "state.sock")
    ready, not_ready = tb.pods[:2], tb.pods[2:]
    write(
        folder,
        service("web", [VIP4]),
        endpoints("web", ready, name="web-a"),
        endpoints("web", not_ready, name="web-b", ready=False),
    )
    wait_for(lambda: answers(tb) == {"pod1", "pod2"})
    assert Path(sock).stat().st_mode & 0o777 == 0o600  # root only
    served = inventory(tb, "services", "--state-socket", sock)
    assert served["node"] == NODE and served["ready"] is True
    # The running proxy's view is the one `services` computes from the same folder.
    computed = inventory(tb, "services", "--manifests", str(folder), "--hostname-override", NODE)
    assert served["services"] == computed["services"]
    [web] = served["services"]
    assert sorted(b["endpoint"] for b in web["frontends"][0]["backends"]) == sorted(
        f"{p.ipv4}:8080" for p in ready
    )
    eps = inventory(tb, "endpoints", "--state-socket", sock, "default/web")["endpoints"]
    assert {(e["endpoint"], e["excluded"]) for e in eps} == {
        *((f"{p.ipv4}:8080", None) for p in ready),
        (f"{not_ready[0].ipv4}:8080", "not ready"),
    }
    # It follows the proxy's changes: the third pod becomes ready.
    write(folder, service("web", [VIP4]), endpoints("web", tb.pods, name="web-a"))
    wait_for(
        lambda: all(
            e["usedBy"] == ["cluster"]
            for e in inventory(tb, "endpoints", "--state-socket", sock)["endpoints"]
        )
    )
    # Only GET, only these documents.
    for request, status in ((b"POST /services", b" 405 "), (b"GET /secrets", b" 404 ")):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(sock)
            s.sendall(request + b" HTTP/1.0\r\n\r\n")
            assert status in s.recv(4096).split(b"\r\n")[0]


def test_sandbox_demo_shows_different_pods(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_demo(EXAMPLES, keep=False, requests=12) == 0
    out = capsys.readouterr().out
    for frontend in ("http://10.96.0.10:80/", "http://10.250.0.1:30080/"):
        pods = {line.split("->")[1].split()[0] for line in out.splitlines() if frontend in line}
        assert len(pods) >= 2, out  # 12 random picks of 3 pods all alike: 3 * (1/3)^12
