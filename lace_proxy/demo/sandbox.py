"""`lace-proxy sandbox`: the proxy serving a manifest folder in a namespace sandbox.

Builds a node with three pods (HTTP servers that say who they are and whom they saw), a
client and a router, runs `lace-proxy run --manifests DIR` inside the node, and sends HTTP
requests from the client to the services' ClusterIPs and NodePorts, printing which pod
answered each. With --keep it stays up for experiments (edit the folder, curl from the
client) until Ctrl-C; everything is removed on exit.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from contextlib import AbstractContextManager
from importlib.resources import as_file, files
from pathlib import Path

from lace_proxy.demo.testbed import POD_CIDR4, POD_CIDR6, Host, Testbed
from lace_proxy.model import load_manifests
from lace_proxy.table import NODE_PORT, ServiceTable

HTTP_PORT = 8000  # the pods' HTTP servers (the example manifests target it)
NODE_NAME = "sandbox-node"  # the example folder's Node and endpoints use this name


def example_manifests() -> AbstractContextManager[Path]:
    """The example folder, package data (so an installed package has it), as a folder on disk:
    the proxy subprocess and the sandbox's hints name it by path."""
    return as_file(files("lace_proxy.demo") / "manifests")


def http_get(client: Host, ip: str, port: int, timeout: float = 2.0, path: str = "/") -> str:
    """One HTTP/1.0 GET from a host's namespace; the body, or what went wrong."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    sock = client.ns.socket(family, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect((ip, port))
        host = f"[{ip}]" if ":" in ip else ip
        sock.sendall(f"GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    except OSError as exc:
        return f"error: {exc.strerror or exc}"
    finally:
        sock.close()
    head, _, body = data.decode(errors="replace").partition("\r\n\r\n")
    status = head.split("\r\n", 1)[0]
    return body.strip() if " 200 " in status else f"error: {status or 'empty reply'}"


def _targets(manifests: Path, node_ips: tuple[str, str]) -> list[tuple[str, str, int]]:
    """(label, address, port) for each ClusterIP and NodePort the folder defines."""
    result = load_manifests(manifests)
    table = ServiceTable(NODE_NAME)
    for svc in result.services.values():
        table.upsert_service(svc)
    table.build()
    table.commit()
    targets = []
    for plan in sorted(table.plans(), key=lambda p: p.id):
        for f in plan.frontends():
            address = f.address or node_ips[0 if f.family == 4 else 1]
            label = f"{plan.service} {f.kind}"
            if f.kind == NODE_PORT or f.address == plan.cluster_ip:
                targets.append((label, address, f.port))
    return targets


def run_demo(manifests: Path, keep: bool, requests: int = 4) -> int:
    """Build the sandbox, run the proxy in it, show the traffic; 0 when every request worked."""
    print(f"sandbox: building namespaces (node, client, router, 3 pods) for {manifests}")
    with Testbed(pods=3) as tb:
        for pod in tb.pods:
            tb.serve(pod, [], http_ports=[HTTP_PORT])
        argv = [
            *("ip", "netns", "exec", tb.node.ns.name, sys.executable, "-m", "lace_proxy"),
            *("run", "--manifests", str(manifests), "--hostname-override", NODE_NAME),
            *("--cluster-cidr", f"{POD_CIDR4},{POD_CIDR6}", "--min-sync-period", "100ms"),
            *("--metrics-bind-address", "127.0.0.1:10249"),
        ]
        proxy = subprocess.Popen(argv, start_new_session=True)
        try:
            return _show(tb, manifests, proxy, keep, requests)
        finally:
            proxy.send_signal(signal.SIGTERM)
            try:
                proxy.wait(10)
            except subprocess.TimeoutExpired:
                proxy.kill()
                proxy.wait()
            print("sandbox: removed")


def _show(
    tb: Testbed, manifests: Path, proxy: subprocess.Popen[bytes], keep: bool, requests: int
) -> int:
    targets = _targets(manifests, (tb.node.ipv4, tb.node.ipv6))
    if not targets:
        print("sandbox: the folder defines no proxied service", file=sys.stderr)
        return 1
    # Wait until the proxy has programmed the first service.
    _, address, port = targets[0]
    deadline = time.monotonic() + 20
    while http_get(tb.client, address, port, 0.5).startswith("error"):
        if proxy.poll() is not None or time.monotonic() > deadline:
            print("sandbox: the proxy did not program the node in time", file=sys.stderr)
            return 1
        time.sleep(0.1)
    failures = 0
    print("\nrequests from the client (answer: POD ADDRESS:PORT SOURCE-THE-POD-SAW)")
    for label, address, port in targets:
        host = f"[{address}]" if ":" in address else address
        for _ in range(requests):
            body = http_get(tb.client, address, port)
            failures += body.startswith("error")
            print(f"  {label:<28} GET http://{host}:{port}/  ->  {body}")
    if keep:
        print(
            f"\nsandbox is up. Try:\n"
            f"  ip netns exec {tb.client.ns.name} curl -s http://{targets[0][1]}:{targets[0][2]}/\n"
            f"  ip netns exec {tb.node.ns.name} nft list table inet lace-proxy\n"
            f"  edit {manifests} and watch the proxy follow.\nCtrl-C to stop."
        )
        try:
            while proxy.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            print()
    return 1 if failures else 0
