"""`kill -9` the running proxy under live traffic and start it again: nothing is lost.

Clients hold long TCP connections through a ClusterIP while others open new ones in a loop;
the proxy is killed, a service is added while it is down, and it is started again. Every
held connection still talks to the same pod, every new connection from the first reported
sync on was answered by a pod, and the new process converged by diff: every rule the old
one made is still there under its handle.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lace_proxy.demo.testbed import Result, Testbed, request_tcp

from ..conftest import MODES
from .proxykit import endpoints, service, talk
from .runkit import RunProcess, run_argv, wait_for, write

pytestmark = pytest.mark.netns

WEB, ECHO, LATE = "10.96.0.10", "10.96.0.20", "10.96.0.30"
ECHO_PORT = 9000


def services(tb: Testbed) -> list[dict[str, Any]]:
    """web (answers once) and echo (holds connections), over every pod."""
    return [
        service("web", [WEB]),
        endpoints("web", tb.pods),
        service("echo", [ECHO], port=ECHO_PORT, target=ECHO_PORT),
        endpoints("echo", tb.pods, port=ECHO_PORT, name="echo"),
    ]


@pytest.fixture(params=MODES)
def running(
    request: pytest.FixtureRequest, make_testbed: Callable[..., Testbed], tmp_path: Path
) -> Iterator[tuple[Testbed, Path, RunProcess]]:
    tb = make_testbed(pods=3)
    for pod in tb.pods:
        tb.serve(pod, (), echo_ports=(ECHO_PORT,))
    folder = tmp_path / "manifests"
    folder.mkdir()
    write(folder, *services(tb))
    proxy = RunProcess(
        run_argv(tb, folder, request.param, tmp_path / "state.sock"), tmp_path / "proxy.log"
    )
    proxy.start()
    try:
        yield tb, folder, proxy
    finally:
        proxy.stop()  # the testbed's namespaces go with what the proxy programmed


def rule_handles(tb: Testbed) -> dict[str, set[int]]:
    """Each chain's rule handles: a flushed or rewritten chain gets new ones."""
    out = tb.exec(tb.node, ["nft", "-a", "-j", "list", "table", "inet", "lace-proxy"]).stdout
    handles: dict[str, set[int]] = {}
    for item in json.loads(out)["nftables"]:
        if "rule" in item:
            handles.setdefault(item["rule"]["chain"], set()).add(item["rule"]["handle"])
    return handles


def test_kill_9_and_restart_loses_no_connection(running: tuple[Testbed, Path, RunProcess]) -> None:
    tb, folder, proxy = running
    # Every new connection from the first sync on counts, and is answered by a pod.
    results: list[Result] = []
    done = threading.Event()

    def new_connections() -> None:
        while not done.is_set():
            results.append(request_tcp(tb.client, WEB, 80, timeout=2.0))
            time.sleep(0.02)

    loop = threading.Thread(target=new_connections)
    loop.start()
    held = []
    try:
        for _ in range(6):
            sock = tb.client.ns.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.settimeout(3)
            sock.connect((ECHO, ECHO_PORT))
            held.append((sock, talk(sock, "hello")))
        assert len({pod for _, pod in held}) > 1  # spread over the pods
        time.sleep(0.5)
        before = rule_handles(tb)
        kill_at = len(results)
        proxy.kill()
        # While it is down: the kernel keeps serving, and a service is added.
        write(folder, *services(tb), service("late", [LATE]), endpoints("late", tb.pods[:1]))
        time.sleep(1.0)
        proxy.start()
        wait_for(lambda: request_tcp(tb.client, LATE, 80, timeout=0.5).outcome == "reply")
        time.sleep(0.5)
    finally:
        done.set()
        loop.join()
    pods = {pod.name for pod in tb.pods}
    failed = [(i, r) for i, r in enumerate(results) if r.reply is None or r.reply.name not in pods]
    if failed:
        print(proxy.log.read_text())
    assert len(results) > 30 and not failed, (
        failed[:10],
        len(results),
        kill_at,
        proxy.log.read_text()[-3000:],
    )
    for sock, pod in held:
        with sock:
            assert talk(sock, "still there?") == pod
    # Converged by diff: no rule of the old process was flushed or replaced.
    after = rule_handles(tb)
    for chain, handles in before.items():
        assert handles <= after.get(chain, set()), chain
    assert "Traceback" not in proxy.log.read_text()
