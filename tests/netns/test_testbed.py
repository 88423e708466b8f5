"""The testbed itself: addressing, servers, outcome classification and teardown."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable

import pytest

from lace_proxy.demo.testbed import (
    CLIENT4,
    CLIENT6,
    GW4,
    GW6,
    POD_GATEWAY4,
    POD_GATEWAY6,
    UPLINK_NODE4,
    UPLINK_NODE6,
    Host,
    Icmp,
    Result,
    Testbed,
    list_netns,
    remove_stale_namespaces,
    request_tcp,
    request_udp,
)

pytestmark = pytest.mark.netns

Request = Callable[..., Result]
PROTOCOLS = pytest.mark.parametrize("request_fn", [request_tcp, request_udp], ids=["tcp", "udp"])
FAMILIES = pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
UNUSED_PORT = 5999
VIP4, VIP6 = "10.96.0.10", "fd00:96::a"


def ip_of(host: Host, v6: bool) -> str:
    return host.ipv6 if v6 else host.ipv4


def assert_reply(result: Result, name: str, ip: str, port: int, peer: str) -> None:
    assert result.outcome == "reply", result
    assert result.reply is not None
    assert (result.reply.name, result.reply.ip, result.reply.port, result.reply.peer) == (
        name,
        ip,
        port,
        peer,
    )


@PROTOCOLS
@FAMILIES
def test_client_reaches_each_pod_directly(
    session_testbed: Testbed, request_fn: Request, v6: bool
) -> None:
    tb = session_testbed
    for pod in tb.pods:
        result = request_fn(tb.client, ip_of(pod, v6), 8080)
        assert_reply(result, pod.name, ip_of(pod, v6), 8080, ip_of(tb.client, v6))


@PROTOCOLS
@FAMILIES
def test_servers_answer_on_node_and_client_addresses(
    session_testbed: Testbed, request_fn: Request, v6: bool
) -> None:
    tb = session_testbed
    pod1, pod2 = tb.pods
    node_ip, gateway = (UPLINK_NODE6, POD_GATEWAY6) if v6 else (UPLINK_NODE4, POD_GATEWAY4)
    client_ip = CLIENT6 if v6 else CLIENT4
    assert_reply(request_fn(tb.client, node_ip, 80), "node", node_ip, 80, client_ip)
    assert_reply(request_fn(pod1, gateway, 80), "node", gateway, 80, ip_of(pod1, v6))
    assert_reply(request_fn(pod1, client_ip, 30080), "client", client_ip, 30080, ip_of(pod1, v6))
    assert_reply(
        request_fn(pod1, ip_of(pod2, v6), 80), "pod2", ip_of(pod2, v6), 80, ip_of(pod1, v6)
    )
    assert_reply(request_fn(tb.node, ip_of(pod2, v6), 80), "pod2", ip_of(pod2, v6), 80, gateway)


@FAMILIES
def test_unused_port_is_refused_quickly(session_testbed: Testbed, v6: bool) -> None:
    tb = session_testbed
    pod = tb.pods[0]
    tcp = request_tcp(tb.client, ip_of(pod, v6), UNUSED_PORT)
    assert (tcp.outcome, tcp.errno, tcp.icmp) == ("refused", "ECONNREFUSED", None), tcp  # RST
    udp = request_udp(tb.client, ip_of(pod, v6), UNUSED_PORT)
    port_unreachable = Icmp(1, 4, pod.ipv6) if v6 else Icmp(3, 3, pod.ipv4)
    assert (udp.outcome, udp.errno, udp.icmp) == ("refused", "ECONNREFUSED", port_unreachable)
    assert max(tcp.elapsed, udp.elapsed) < 0.5


@PROTOCOLS
@FAMILIES
def test_untranslated_vip_escapes(session_testbed: Testbed, request_fn: Request, v6: bool) -> None:
    """Without a proxy a VIP is answered by gw's sink, never as a reply, REJECT or DROP."""
    tb = session_testbed
    vip, gw = (VIP6, GW6) if v6 else (VIP4, GW4)
    for source in (tb.client, tb.pods[0], tb.node):
        result = request_fn(source, vip, 80)
        assert result.outcome == "escaped", (source.name, result)
        assert result.icmp is not None and result.icmp.sender == gw
        assert result.elapsed < 0.5


@PROTOCOLS
@FAMILIES
def test_dropped_packet_times_out(session_testbed: Testbed, request_fn: Request, v6: bool) -> None:
    tb = session_testbed
    pod = tb.pods[0]
    match = f"ip6 daddr {pod.ipv6}" if v6 else f"ip daddr {pod.ipv4}"
    tb.exec(
        tb.node,
        ["nft", "-f", "-"],
        input=f"""
        table inet testbed_drop {{
            chain forward {{
                type filter hook forward priority 0; policy accept;
                {match} drop
            }}
        }}
        """,
    )
    try:
        assert request_fn(tb.client, ip_of(pod, v6), 8080, timeout=0.3).outcome == "timeout"
    finally:
        tb.exec(tb.node, ["nft", "delete", "table", "inet", "testbed_drop"])
    assert request_fn(tb.client, ip_of(pod, v6), 8080).outcome == "reply"


@PROTOCOLS
@FAMILIES
def test_dnat_and_masquerade_are_visible(
    session_testbed: Testbed, request_fn: Request, v6: bool
) -> None:
    """A hand-written stand-in for a proxy: the reply shows the endpoint and the source seen."""
    tb = session_testbed
    pod = tb.pods[1]
    ip, vip, masqueraded_vip = ("ip6", VIP6, "fd00:96::b") if v6 else ("ip", VIP4, "10.96.0.11")
    to = f"[{pod.ipv6}]:8080" if v6 else f"{pod.ipv4}:8080"
    port_80 = "meta l4proto { tcp, udp } th dport 80"
    tb.exec(
        tb.node,
        ["nft", "-f", "-"],
        input=f"""
        table inet testbed_nat {{
            chain prerouting {{
                type nat hook prerouting priority dstnat; policy accept;
                {ip} daddr {vip} {port_80} dnat {ip} to {to}
                {ip} daddr {masqueraded_vip} {port_80} meta mark set 1 dnat {ip} to {to}
            }}
            chain postrouting {{
                type nat hook postrouting priority srcnat; policy accept;
                meta mark 1 masquerade
            }}
        }}
        """,
    )
    try:
        plain = request_fn(tb.client, vip, 80)
        masqueraded = request_fn(tb.client, masqueraded_vip, 80)
    finally:
        tb.exec(tb.node, ["nft", "delete", "table", "inet", "testbed_nat"])
    pod_ip = ip_of(pod, v6)
    assert_reply(plain, pod.name, pod_ip, 8080, ip_of(tb.client, v6))
    assert_reply(masqueraded, pod.name, pod_ip, 8080, POD_GATEWAY6 if v6 else POD_GATEWAY4)


def test_client_without_pod_routes(make_testbed: Callable[..., Testbed]) -> None:
    """The client then reaches pods only through service or external addresses."""
    tb = make_testbed(pods=1, client_routes_pods=False)
    pod = tb.pods[0]
    for v6 in (False, True):
        direct = request_tcp(tb.client, ip_of(pod, v6), 8080)
        assert (direct.outcome, direct.errno) == ("error", "ENETUNREACH"), direct
        assert request_tcp(tb.client, VIP6 if v6 else VIP4, 80).outcome == "escaped"
        assert request_udp(tb.node, ip_of(pod, v6), 8080).outcome == "reply"


def test_extra_server(testbed: Testbed) -> None:
    pod = testbed.pods[1]
    testbed.serve(pod, [UNUSED_PORT], name="extra")
    assert_reply(
        request_udp(testbed.client, pod.ipv4, UNUSED_PORT), "extra", pod.ipv4, UNUSED_PORT, CLIENT4
    )


def test_teardown_leaves_no_namespaces() -> None:
    with Testbed(pods=3) as tb:
        names = tb.namespace_names
        assert len(names) == 6 and all(len(name) <= 15 for name in names)
        assert set(names) <= set(list_netns())
        pids = tb.server_pids
        assert len(pids) == 5  # node, client, three pods
    assert not set(names) & set(list_netns())
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_teardown_on_exception_and_ctrl_c(error: type[BaseException]) -> None:
    names: list[str] = []
    with pytest.raises(error), Testbed(pods=1) as tb:
        names = tb.namespace_names
        raise error
    assert names
    assert not set(names) & set(list_netns())


def test_failed_setup_cleans_up() -> None:
    tb = Testbed(pods=1, ports=[70000])  # the servers cannot bind
    with pytest.raises(RuntimeError, match="not ready"):
        tb.start()
    assert tb.namespace_names == []
    assert not {f"{tb.prefix}{role}" for role in ("N", "C", "G", "P1")} & set(list_netns())


def test_stale_namespaces_are_removed(testbed: Testbed) -> None:
    """Leftovers of a killed run go; a live testbed's namespaces stay."""
    finished = subprocess.Popen(["true"])
    finished.wait()
    stale = f"lp{finished.pid:x}.0N"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    assert stale in remove_stale_namespaces()
    names = set(list_netns())
    assert stale not in names
    assert set(testbed.namespace_names) <= names
