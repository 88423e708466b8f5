"""The two-node cluster testbed: routing between nodes, clients outside, the fabric's sink."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable

import pytest

from lace_proxy.demo.testbed import (
    ESCAPE_ICMP4,
    Icmp,
    Result,
    list_netns,
    remove_stale_namespaces,
    request_tcp,
    request_udp,
)
from testkit.cluster_testbed import (
    A1_4,
    A2_4,
    ABLUE4,
    B1_4,
    BBLUE4,
    FABRIC4,
    FAR4,
    NEAR4,
    NODE_A4,
    NODE_B4,
    ClusterTestbed,
)

pytestmark = pytest.mark.netns

Request = Callable[..., Result]
PROTOCOLS = pytest.mark.parametrize("request_fn", [request_tcp, request_udp], ids=["tcp", "udp"])
VIP = "10.96.0.10"
ROLES = ["F", "Xf", "Xn", "Na", "Nb", "Pa1", "Pa2", "Pab", "Pb1", "Pbb"]


def assert_reply(result: Result, name: str, ip: str, port: int, peer: str) -> None:
    assert result.outcome == "reply", result
    assert result.reply is not None
    assert (result.reply.name, result.reply.ip, result.reply.port, result.reply.peer) == (
        name,
        ip,
        port,
        peer,
    )


def assert_escaped(result: Result) -> None:
    """Rejected by the fabric's sink, at once."""
    assert result.outcome == "escaped", result
    assert result.icmp == Icmp(*ESCAPE_ICMP4, FABRIC4)
    assert result.elapsed < 0.5


def test_addresses_and_names(cluster: ClusterTestbed) -> None:
    assert {name: host.ipv4 for name, host in cluster.nodes.items()} == {
        "node-a": NODE_A4,
        "node-b": NODE_B4,
    }
    assert {name: host.ipv4 for name, host in cluster.pods.items()} == {
        "a1": A1_4,
        "a2": A2_4,
        "ablue": ABLUE4,
        "b1": B1_4,
        "bblue": BBLUE4,
    }
    assert (cluster.far.ipv4, cluster.near.ipv4, cluster.fabric.ipv4) == (FAR4, NEAR4, FABRIC4)
    assert cluster.pod_cidrs == {
        "node-a": ("10.251.1.0/24", "10.254.1.0/24"),
        "node-b": ("10.251.2.0/24", "10.254.2.0/24"),
    }


@PROTOCOLS
def test_pods_reach_pods_across_nodes_unmasqueraded(
    cluster: ClusterTestbed, request_fn: Request
) -> None:
    pods = cluster.pods
    for source, target in [("a1", "b1"), ("b1", "a2"), ("bblue", "ablue"), ("ablue", "b1")]:
        src, dst = pods[source], pods[target]
        assert_reply(request_fn(src, dst.ipv4, 8080), target, dst.ipv4, 8080, src.ipv4)


def test_pod_cidrs_are_routed_via_their_node(cluster: ClusterTestbed) -> None:
    """Across nodes straight over the bridge (not through the fabric); the fabric via the owner."""
    for node, cidrs in cluster.pod_cidrs.items():
        owner = cluster.nodes[node].ipv4
        others = [host for name, host in cluster.nodes.items() if name != node]
        for cidr in cidrs:
            some_address = cidr.replace(".0/24", ".99")
            for router in (cluster.fabric, *others):
                route = cluster.exec(router, ["ip", "-o", "route", "get", some_address]).stdout
                assert f" via {owner} " in route, (router.name, route)


@PROTOCOLS
def test_node_reaches_the_other_nodes_pods_from_its_underlay_address(
    cluster: ClusterTestbed, request_fn: Request
) -> None:
    for pod in ("b1", "bblue"):
        ip = cluster.pods[pod].ipv4
        assert_reply(request_fn(cluster.nodes["node-a"], ip, 80), pod, ip, 80, NODE_A4)
    ip = cluster.pods["ablue"].ipv4
    assert_reply(request_fn(cluster.nodes["node-b"], ip, 80), "ablue", ip, 80, NODE_B4)


@PROTOCOLS
def test_clients_reach_node_addresses_and_are_seen_as_themselves(
    cluster: ClusterTestbed, request_fn: Request
) -> None:
    """The node answers from the address asked, and sees the client's own address."""
    for client in (cluster.far, cluster.near):
        for name, node in cluster.nodes.items():
            result = request_fn(client, node.ipv4, 30080)
            assert_reply(result, name, node.ipv4, 30080, client.ipv4)


@PROTOCOLS
def test_clients_reach_pods_through_the_fabric(
    cluster: ClusterTestbed, request_fn: Request
) -> None:
    for client, pod in [(cluster.far, "ablue"), (cluster.near, "b1"), (cluster.far, "a2")]:
        ip = cluster.pods[pod].ipv4
        assert_reply(request_fn(client, ip, 80), pod, ip, 80, client.ipv4)


@PROTOCOLS
def test_service_packets_from_nodes_and_pods_escape_at_the_fabric(
    cluster: ClusterTestbed, request_fn: Request
) -> None:
    for source in (cluster.nodes["node-a"], cluster.nodes["node-b"], cluster.pods["a1"]):
        assert_escaped(request_fn(source, VIP, 80))


@PROTOCOLS
def test_service_packets_from_outside_escape_at_the_fabric(
    cluster: ClusterTestbed, request_fn: Request
) -> None:
    """Also from the fabric's own address, though far and near reach it over other links."""
    for client in (cluster.far, cluster.near):
        assert_escaped(request_fn(client, VIP, 80))
        assert_escaped(request_fn(client, "192.0.2.1", 80))  # routed nowhere


def test_unassigned_pod_address_fails_at_its_node(cluster: ClusterTestbed) -> None:
    """Not a loop between node and fabric: host unreachable from the owning node, at once."""
    far = request_tcp(cluster.far, "10.251.1.99", 80)
    assert (far.outcome, far.icmp) == ("refused", Icmp(3, 1, NODE_A4)), far
    pod = request_udp(cluster.pods["a1"], "10.254.2.99", 80)
    assert (pod.outcome, pod.icmp) == ("refused", Icmp(3, 1, NODE_B4)), pod
    assert max(far.elapsed, pod.elapsed) < 0.5


def test_fabric_runs_no_server(cluster: ClusterTestbed) -> None:
    result = request_tcp(cluster.far, FABRIC4, 80)
    assert (result.outcome, result.errno, result.icmp) == ("refused", "ECONNREFUSED", None)


def test_teardown_leaves_no_namespaces_or_servers() -> None:
    with ClusterTestbed(ports=(80,)) as tb:
        names = tb.namespace_names
        assert len(names) == 10 and all(len(name) <= 15 for name in names)
        assert set(names) <= set(list_netns())
        pids = tb.server_pids
        assert len(pids) == 9  # two nodes, five pods, far and near
        assert tb.setup_seconds < 2
    assert not set(names) & set(list_netns())
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_failed_setup_cleans_up() -> None:
    tb = ClusterTestbed(ports=[70000])  # the servers cannot bind
    with pytest.raises(RuntimeError, match="not ready"):
        tb.start()
    assert tb.namespace_names == []
    assert not {f"{tb.prefix}{role}" for role in ROLES} & set(list_netns())


def test_stale_cluster_namespaces_are_removed(cluster: ClusterTestbed) -> None:
    """Every role the cluster uses is recognised once its process is gone; a live one stays."""
    finished = subprocess.Popen(["true"])
    finished.wait()
    roles = [name.removeprefix(cluster.prefix) for name in cluster.namespace_names]
    assert roles == ROLES
    stale = [f"lp{finished.pid:x}.0{role}" for role in roles]
    unknown = f"lp{finished.pid:x}.0Pc1"  # no such role: never ours to delete
    for name in [*stale, unknown]:
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        removed = remove_stale_namespaces()
        assert set(stale) <= set(removed) and unknown not in removed
        names = set(list_netns())
        assert not set(stale) & names
        assert unknown in names
        assert set(cluster.namespace_names) <= names
    finally:
        subprocess.run(["ip", "netns", "del", unknown], check=False)
