"""Switching a node from the real kube-proxy v1.37.2 to lace-proxy under load loses nothing.

The README's procedure, played on the testbed's node against a real kube-apiserver: kube-proxy
(nftables mode, or iptables mode through Debian's iptables-nft) serves three services (TCP
web, TCP echo, UDP dns; ClusterIP, NodePort, ExternalIP and LB IP) while the client opens new
TCP connections at 250 a second, sends a fresh-port UDP query every 10 ms, holds TCP
connections and keeps a fixed-source-port UDP stream on every UDP frontend
(tests/netns/rollout.py's load). Then kube-proxy stops (its rules stay in the kernel),
`lace-proxy run --cleanup-kube-proxy` starts, serves, and removes kube-proxy's rules. No new
connection or query fails, no held connection breaks, and every stream stays on its pod.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from lace_proxy.demo.testbed import POD_CIDR4, UPLINK_NODE4, Testbed, request_tcp
from testkit.controlplane.cluster import ControlPlane
from testkit.controlplane.pytest_plugin import _binaries
from testkit.kubeproxy import ApiLink, KubeProxy, kube_proxy_config, node_object

from .proxykit import NODE
from .rollout import (
    DNS,
    ECHO_PORT,
    LB4,
    TARGET,
    WEB,
    Load,
    hold_on_each,
    judge_held,
    judge_probes,
    judge_streams,
    manifests,
    stream_on_each,
)

pytestmark = pytest.mark.netns

#: Seconds of load in each phase: kube-proxy alone, its rules alone, both, lace-proxy alone.
PHASE = 1.5


@pytest.fixture
def node(make_testbed: Callable[..., Testbed]) -> Iterator[tuple[Testbed, ApiLink]]:
    """Two pods serving who-am-I (TCP, UDP) and echo, and a link to the root namespace."""
    tb = make_testbed(pods=2, ports=(TARGET,))
    for pod in tb.pods:
        tb.serve(pod, (), echo_ports=(ECHO_PORT,))
    with ApiLink(tb.node.ns.name) as link:
        yield tb, link


@pytest.fixture
def plane(node: tuple[Testbed, ApiLink]) -> Iterator[ControlPlane]:
    """A control plane of its own, reachable from the node through the link."""
    _, link = node
    with ControlPlane(bins=_binaries(), bind_address="0.0.0.0", sans=[link.host_address]) as cp:
        yield cp


def create(api: client.ApiClient, tb: Testbed) -> None:
    """The Node (its InternalIP the uplink's, where kube-proxy puts NodePorts) and the
    services and slices of rollout.py, both pods ready; LB IPs through the status."""
    core = client.CoreV1Api(api)
    core.create_node(node_object(NODE, UPLINK_NODE4))
    objects = manifests({p.name: (p, "ready") for p in tb.pods})
    for obj in objects:
        body = {k: v for k, v in obj.items() if k != "status"}
        if obj["kind"] == "Service":
            body["spec"]["clusterIP"] = body["spec"]["clusterIPs"][0]  # the API wants both
            core.create_namespaced_service("default", body)
            if obj.get("status"):
                core.patch_namespaced_service_status(
                    obj["metadata"]["name"], "default", {"status": obj["status"]}
                )
        else:
            client.DiscoveryV1Api(api).create_namespaced_endpoint_slice("default", body)


def kube_proxy_tables(tb: Testbed) -> list[str]:
    """What of kube-proxy is in the node's kernel: its nftables tables, or (iptables-nft)
    the `nat` table's KUBE-SERVICES chain."""
    tables = tb.exec(tb.node, ["nft", "list", "tables"]).stdout.split("\n")
    found = [t for t in tables if t.endswith(" kube-proxy")]
    chains = tb.exec(tb.node, ["iptables-save", "-t", "nat"], check=False).stdout
    return found + (["iptables KUBE-SERVICES"] if ":KUBE-SERVICES" in chains else [])


def wait_for(check: Callable[[], Any], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(0.1)


@pytest.mark.parametrize("mode", ["nftables", "iptables"])
def test_switching_from_kube_proxy_loses_no_connection(
    node: tuple[Testbed, ApiLink], plane: ControlPlane, tmp_path: Path, mode: str
) -> None:
    tb, link = node
    kubeconfig = plane.write_admin_kubeconfig(tmp_path / "kubeconfig", link.url(plane.port))
    api = plane.admin_client()
    try:
        create(api, tb)
    finally:
        api.close()
    common = {"kubeconfig": kubeconfig, "node_name": NODE, "cluster_cidr": POD_CIDR4}
    config = tmp_path / "lace-proxy.yaml"
    lace_config = kube_proxy_config(
        **common,
        extra={"mode": "nftables", "minSyncPeriod": "100ms"},
        metrics_port=10349,
        healthz_port=10356,
    )
    config.write_text(yaml.safe_dump(lace_config))
    load = Load(tb.client)
    with KubeProxy(tb.node.ns.name, mode=mode, **common) as kube_proxy:
        wait_for(
            lambda: request_tcp(tb.client, WEB, 80, timeout=0.5).outcome == "reply", "kube-proxy"
        )
        kube_proxy.check_alive()
        load.start()
        lace: subprocess.Popen[str] | None = None
        try:
            held = hold_on_each(load, tb.pods)
            streams = stream_on_each(load, tb.pods)
            time.sleep(PHASE)
            kube_proxy.stop()  # the DaemonSet is deleted: its rules stay
            assert kube_proxy_tables(tb)
            time.sleep(PHASE)
            argv = ["ip", "netns", "exec", tb.node.ns.name, sys.executable, "-m", "lace_proxy"]
            argv += ["run", "--config", str(config), "--cleanup-kube-proxy"]
            lace = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
            wait_for(lambda: not kube_proxy_tables(tb), "kube-proxy's rules removed")
            taken_over = time.monotonic()
            time.sleep(PHASE)
        finally:
            load.stop()
            if lace is not None:
                lace.terminate()
                _, err = lace.communicate(timeout=60)
    assert lace.returncode == 0, err
    assert "Traceback" not in err, err
    assert "kube-proxy's leftovers: removed" in err, err
    names = [p.name for p in tb.pods]
    verdicts = judge_probes(load.probes, [], names)
    verdicts["held"] = judge_held(load.flows, [])
    verdicts["stream"] = judge_streams(load.flows, [], names, "gone")
    report = "; ".join(v.line() for v in verdicts.values())
    for verdict in verdicts.values():
        assert not verdict.failed, "\n".join([report, *verdict.failed[:10]])
    assert {f.first for f in held} == set(names), held
    assert {f.first for f in streams} == set(names), streams
    # lace-proxy alone served new connections and queries, on every frontend.
    after = [p for p in load.probes if p.sent > taken_over and p.outcome == "reply"]
    assert {(p.kind, p.frontend.split(":")[0]) for p in after} >= {
        ("tcp", WEB),
        ("tcp", LB4),
        ("udp", DNS),
        ("udp", UPLINK_NODE4),
    }, report
    print(f"{mode}: {report}")
