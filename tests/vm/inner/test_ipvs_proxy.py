"""Inside the VM: the proxy in IPVS mode on real traffic, witnessed by ``ipvsadm -Ln``.

The single-node testbed (lace_proxy/demo/testbed.py) runs inside the VM's kernel; the
proxy's own pipeline programs its node namespace (tests/netns/proxykit.py's Harness with
mode "ipvs"): IPVS balances, nftables filters and masquerades. Service addresses are made
local as this run's setting says (IPVS_ADDRESSES: tests/vm/test_vm.py runs the module with
each); a test that handles them behind the proxy's back does it that way.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from lace_proxy.dataplane.ipvs import IpvsSettings, VirtualServer, Wanted
from lace_proxy.demo.testbed import (
    CLIENT4,
    UPLINK_NODE4,
    UPLINK_NODE6,
    Testbed,
    remove_stale_namespaces,
    request_tcp,
)
from tests.conftest import IPVS_ADDRESSES
from tests.netns.proxykit import LB4, Harness, endpoints, ipvs_settings, many, names, service

pytestmark = pytest.mark.ipvs

VIP4, VIP6 = "10.96.0.10", "fd00:96::10"
LOCAL_ROUTES = IPVS_ADDRESSES == "localRoutes"
DUMMY = "lace-ipvs0"
#: Where the node holds a service address: lo for a local route of the proxy's protocol (145)
#: in the local table, else the dummy interface.
HOLDER = "lo" if LOCAL_ROUTES else DUMMY


def local(command: str, address: str) -> list[str]:
    """`ip` adding or deleting (`command`) a service address the way this run's proxy does."""
    if LOCAL_ROUTES:
        where = ["dev", "lo", "table", "local", "proto", "145"]
        return ["ip", "route", command, "local", f"{address}/32", *where]
    return ["ip", "addr", command, f"{address}/32", "dev", DUMMY]


@pytest.fixture(scope="module")
def tb() -> Iterator[Testbed]:
    remove_stale_namespaces()
    with Testbed(pods=3) as testbed:
        yield testbed


@pytest.fixture
def proxy(tb: Testbed, tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tb, tmp_path / "manifests", mode="ipvs")
    try:
        yield harness
    finally:
        harness.close()


def ipvsadm(tb: Testbed) -> dict[str, tuple[str, set[tuple[str, int]]]]:
    """``ipvsadm -Ln`` in the node: {"TCP 10.96.0.10:80": (scheduler, {(server, weight)})}."""
    out = subprocess.run(
        ["ip", "netns", "exec", tb.node.ns.name, "ipvsadm", "-Ln"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    services: dict[str, tuple[str, set[tuple[str, int]]]] = {}
    current: set[tuple[str, int]] = set()
    for line in out.splitlines():
        words = line.split()
        if words and words[0] in ("TCP", "UDP", "SCTP"):
            current = set()
            services[f"{words[0]} {words[1]}"] = (words[2], current)
        elif words[:1] == ["->"] and words[1] != "RemoteAddress:Port":
            current.add((words[1], int(words[3])))
    return services


def _show(vs: VirtualServer) -> str:
    address = f"[{vs.address}]" if ":" in vs.address else vs.address
    return f"{vs.protocol} {address}:{vs.port}"


def web(tb: Testbed, **spec: object) -> list[dict[str, object]]:
    svc = service("web", [VIP4, VIP6], type="LoadBalancer", node_port=30080, **spec)
    svc["status"] = {"loadBalancer": {"ingress": [{"ip": LB4}]}}
    return [svc, endpoints("web", tb.pods), endpoints("web", tb.pods, v6=True)]


def drop_the_third_endpoint(proxy: Harness, tb: Testbed) -> None:
    """All three pods answer `web`; then pod3 leaves its endpoints (a real server to drain)."""
    assert set(names(many(tb.client, VIP4, 80, n=12))) == {"pod1", "pod2", "pod3"}
    objs = web(tb)
    objs[1] = endpoints("web", tb.pods[:2])
    proxy.write("web", *objs)
    proxy.sync()


def test_every_frontend_kind_is_balanced_by_ipvs(proxy: Harness, tb: Testbed) -> None:
    proxy.write("web", *web(tb))
    proxy.sync()
    pods = {"pod1", "pod2", "pod3"}
    for address, port in ((VIP4, 80), (VIP6, 80), (LB4, 80), (UPLINK_NODE4, 30080)):
        assert set(names(many(tb.client, address, port, n=12))) == pods, address
    # ipvsadm, a client no one here wrote, shows what the table says.
    shown = ipvsadm(tb)
    expected = {}
    wanted = Wanted([UPLINK_NODE4, UPLINK_NODE6], "rr")
    for plan in proxy.table.plans():
        wanted.add(plan)
    for vs, target in wanted.desired().items():
        servers = {(f"[{ip}]:{p}" if ":" in ip else f"{ip}:{p}", 1) for ip, p in target.servers}
        expected[_show(vs)] = (target.scheduler, servers)
    assert {k: v for k, v in shown.items() if k in expected} == expected
    # NodePorts are answered on the node's address, masqueraded (policy Cluster).
    reply = request_tcp(tb.client, UPLINK_NODE4, 30080)
    assert reply.reply is not None and reply.reply.peer != CLIENT4


def test_no_endpoints_is_refused_and_other_ports_never_reach_the_node(
    proxy: Harness, tb: Testbed
) -> None:
    svc = service("empty", ["10.96.0.11"])
    proxy.write("empty", svc)
    proxy.write("web", *web(tb))
    proxy.sync()
    assert request_tcp(tb.client, "10.96.0.11", 80).outcome == "refused"
    # The node's own server listens on 8080 everywhere: a ClusterIP must not expose it.
    refused = request_tcp(tb.client, VIP4, 8080)
    assert refused.outcome == "refused" and refused.reply is None, refused


def test_client_ip_affinity_is_ipvs_persistence(proxy: Harness, tb: Testbed) -> None:
    proxy.write("web", *web(tb, sessionAffinity="ClientIP"))
    proxy.sync()
    assert len(set(names(many(tb.client, VIP4, 80, n=10)))) == 1
    pinned6 = names(many(tb.client, VIP6, 80, n=10))
    assert len(pinned6) == 1 and "timeout" not in pinned6, pinned6
    assert (
        "persistent"
        in subprocess.run(
            ["ip", "netns", "exec", tb.node.ns.name, "ipvsadm", "-Ln"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )


def test_per_service_scheduler_from_the_annotation(proxy: Harness, tb: Testbed) -> None:
    objs = web(tb)
    objs[0]["metadata"]["annotations"] = {  # type: ignore[index]
        "lace-proxy.lace-cni.io/ipvs-scheduler": "mh"
    }
    proxy.write("web", *objs)
    proxy.sync()
    assert ipvsadm(tb)[f"TCP {VIP4}:80"][0] == "mh"
    assert set(names(many(tb.pods[0], VIP4, 80, n=6))) <= {"pod1", "pod2", "pod3"}


def test_removed_endpoint_drains_and_a_restart_adopts_without_flush(
    proxy: Harness, tb: Testbed, tmp_path: Path
) -> None:
    key = f"TCP {VIP4}:80"
    proxy.write("web", *web(tb))
    proxy.sync()
    assert len(ipvsadm(tb)[key][1]) == 3
    # Connections to every pod: IPVS remembers them (TIME_WAIT) for two minutes.
    assert set(names(many(tb.client, VIP4, 80, n=12))) == {"pod1", "pod2", "pod3"}
    # pod3 leaves: no new connections to it, but it stays at weight 0 while IPVS still
    # tracks its connections (deleted when they are gone, or after the grace period). Where
    # it had none (the LB IP had no traffic), it is deleted at once.
    objs = web(tb)
    objs[1] = endpoints("web", tb.pods[:2])
    proxy.write("web", *objs)
    proxy.sync()
    weights = dict(ipvsadm(tb)[key][1])
    assert weights.get("10.251.0.13:8080") == 0, weights
    idle = dict(ipvsadm(tb)[f"TCP {LB4}:80"][1])
    assert idle == {"10.251.0.11:8080": 1, "10.251.0.12:8080": 1}
    assert set(names(many(tb.client, VIP4, 80, n=12))) == {"pod1", "pod2"}
    # A new process adopts what IPVS holds: nothing to add, change or flush.
    again = Harness(tb, tmp_path / "again", mode="ipvs")
    again.write("web", *objs)
    again.sync(full=True)
    assert again.backend.last_changes == 0  # type: ignore[union-attr]
    serving = {server for server, weight in ipvsadm(tb)[key][1] if weight > 0}
    assert serving == {"10.251.0.11:8080", "10.251.0.12:8080"}
    assert set(names(many(tb.client, VIP4, 80, n=12))) == {"pod1", "pod2"}


def test_after_the_grace_period_a_removed_endpoint_is_gone(tb: Testbed, tmp_path: Path) -> None:
    proxy = Harness(tb, tmp_path / "manifests", mode="ipvs", ipvs=ipvs_settings(grace_period=0))
    try:
        proxy.write("web", *web(tb))
        proxy.sync()
        drop_the_third_endpoint(proxy, tb)
        servers = {server for server, _ in ipvsadm(tb)[f"TCP {VIP4}:80"][1]}
        assert servers == {"10.251.0.11:8080", "10.251.0.12:8080"}
    finally:
        proxy.close()


def test_a_restart_removes_what_was_deleted_while_down_and_keeps_persistence(
    tb: Testbed, tmp_path: Path
) -> None:
    first = Harness(tb, tmp_path / "first", mode="ipvs")
    first.write("web", *web(tb, sessionAffinity="ClientIP"))
    first.write("gone", service("gone", ["10.96.0.12"]), endpoints("gone", tb.pods[:1]))
    first.sync()
    assert "TCP 10.96.0.12:80" in ipvsadm(tb)
    # The proxy stops (its kernel state stays); `gone` is deleted meanwhile.
    again = Harness(tb, tmp_path / "again", mode="ipvs")
    try:
        again.write("web", *web(tb, sessionAffinity="ClientIP"))
        again.sync(full=True)
        assert "TCP 10.96.0.12:80" not in ipvsadm(tb)
        again.sync(full=True)  # converged: persistence is read back as programmed
        assert again.backend.last_changes == 0  # type: ignore[union-attr]
    finally:
        again.close()


def test_a_refused_real_server_stops_no_other_service(proxy: Harness, tb: Testbed) -> None:
    """IPVS refuses a broadcast real server: that sync fails (counted, retried), but every
    other virtual service is programmed; a link-local IPv6 one is skipped up front."""
    bad = endpoints("bad", tb.pods[:1], name="bad-v4")
    bad["endpoints"][0]["addresses"] = ["10.250.0.255"]  # the uplink's broadcast address
    proxy.write("bad", service("bad", ["10.96.0.13"]), bad)
    proxy.write("web", *web(tb))
    proxy.source._signature = None
    proxy.source.poll()
    assert not asyncio.run(proxy.proxier.sync())
    assert "IPVS operations failed" in (proxy.proxier.stats.last_error or "")
    assert set(names(many(tb.client, VIP4, 80, n=9))) == {"pod1", "pod2", "pod3"}
    linklocal = endpoints("bad", tb.pods[:1], v6=True, name="bad-v6")
    linklocal["endpoints"][0]["addresses"] = ["fe80::1"]
    proxy.write("bad", service("bad", ["fd00:96::13"]), linklocal)
    proxy.sync()  # fixed input converges
    assert "TCP [fd00:96::13]:80" in ipvsadm(tb)


def test_an_address_goes_on_only_once_its_virtual_service_has_every_real_server(
    proxy: Harness, tb: Testbed
) -> None:
    """A service address makes its frontends the node's own. Put on first, a new connection
    reached the node's own server, then a virtual service without real servers (IPVS refused
    it). Here the kernel refuses the IPv6 addresses (IPv6 disabled on lace-ipvs0, or on lo,
    the device of the local routes): that sync fails right there, and IPVS holds every real
    server already, in a full sync and in an incremental one; the address that is not on
    yet is refused, not the node's."""
    ipv6 = f"net.ipv6.conf.{HOLDER}.disable_ipv6"
    refused = "adding the local route of {} refused" if LOCAL_ROUTES else "adding {} to the dummy"
    if not LOCAL_ROUTES:
        tb.exec(tb.node, ["ip", "link", "add", DUMMY, "type", "dummy"])
    pods6 = {(f"[fd00:251::{n}]:8080", 1) for n in (11, 12, 13)}
    late = [service("late", ["fd00:96::16"]), endpoints("late", tb.pods, v6=True)]
    # The first sync is a full one; `late` comes in an incremental one.
    for name, vip6, objs in (("web", VIP6, web(tb)), ("late", "fd00:96::16", late)):
        tb.exec(tb.node, ["sysctl", "-qw", f"{ipv6}=1"])  # its IPv6 addresses, routes go too
        proxy.write(name, *objs)
        proxy.source._signature = None
        proxy.source.poll()
        assert not asyncio.run(proxy.proxier.sync())
        error = proxy.proxier.stats.last_error or ""
        assert refused.format(vip6) in error and "EACCES" in error, name
        assert ipvsadm(tb)[f"TCP [{vip6}]:80"] == ("rr", pods6), name
        assert request_tcp(tb.client, vip6, 80).outcome == "refused", name
        assert set(names(many(tb.client, VIP4, 80, n=9))) == {"pod1", "pod2", "pod3"}, name
        tb.exec(tb.node, ["sysctl", "-qw", f"{ipv6}=0"])
        proxy.sync()  # a full sync after the failure: the addresses go on
        assert set(names(many(tb.client, vip6, 80, n=9))) == {"pod1", "pod2", "pod3"}, name


def test_other_ports_of_external_addresses_never_reach_the_node(
    proxy: Harness, tb: Testbed
) -> None:
    proxy.write("web", *web(tb))
    proxy.sync()
    for address in (LB4, VIP6):
        refused = request_tcp(tb.client, address, 8080)  # the node's own server's port
        assert refused.outcome == "refused" and refused.reply is None, (address, refused)


def test_a_service_deleted_while_a_server_drains_and_node_ports_out_of_range(
    proxy: Harness, tb: Testbed
) -> None:
    key = f"TCP {VIP4}:80"
    proxy.write("web", *web(tb))
    proxy.write(
        "odd",
        service("odd", ["10.96.0.14"], type="NodePort", node_port=20080),
        endpoints("odd", tb.pods[:1]),
    )
    proxy.sync()
    drop_the_third_endpoint(proxy, tb)
    assert dict(ipvsadm(tb)[key][1]).get("10.251.0.13:8080") == 0  # draining
    proxy.remove("web")
    proxy.sync()  # the draining server's service goes with it
    assert key not in ipvsadm(tb)
    proxy.sync(full=True)  # a NodePort outside 30000-32767 is still ours
    proxy.sync(full=True)
    assert request_tcp(tb.client, UPLINK_NODE4, 20080).reply.name == "pod1"  # type: ignore[union-attr]
    proxy.close()  # and made by this process: its cleanup removes it
    assert not [key for key in ipvsadm(tb) if key.endswith(":20080")]


def test_ipvs_cleared_while_a_server_drains_comes_back_whole(proxy: Harness, tb: Testbed) -> None:
    """IPVS is cleared behind the proxy's back (`ipvsadm -C`) while a real server drains:
    the next full sync reads IPVS back and adds each virtual service anew with every real
    server wanted, the one that was draining among them, instead of asking IPVS to reweight
    a real server it no longer holds (a refusal: that sync failed)."""
    key = f"TCP {VIP4}:80"
    proxy.write("web", *web(tb))
    proxy.sync()
    drop_the_third_endpoint(proxy, tb)
    assert dict(ipvsadm(tb)[key][1]).get("10.251.0.13:8080") == 0  # draining
    tb.exec(tb.node, ["ipvsadm", "-C"])
    proxy.write("web", *web(tb))  # pod3 is back
    proxy.sync(full=True)
    assert ipvsadm(tb)[key][1] == {(f"10.251.0.{n}:8080", 1) for n in (11, 12, 13)}
    assert set(names(many(tb.client, VIP4, 80, n=12))) == {"pod1", "pod2", "pod3"}


def test_an_external_ip_on_a_node_address_wins_over_a_node_port_and_hands_it_back(
    proxy: Harness, tb: Testbed
) -> None:
    """`web`'s NodePort 30080 and `other`'s ExternalIP = the node's address, port 30080: one
    virtual service. The ExternalIP holds it (as in nftables mode); when `other` goes, an
    incremental sync gives it back to the NodePort rather than deleting it."""
    key = f"TCP {UPLINK_NODE4}:30080"
    proxy.write("web", *web(tb))
    other = service("other", ["10.96.0.15"], port=30080, externalIPs=[UPLINK_NODE4])
    proxy.write("other", other, endpoints("other", tb.pods[:1]))
    proxy.sync()
    assert ipvsadm(tb)[key][1] == {("10.251.0.11:8080", 1)}
    assert set(names(many(tb.client, UPLINK_NODE4, 30080, n=6))) == {"pod1"}
    proxy.remove("other")
    proxy.sync()
    assert ipvsadm(tb)[key][1] == {(f"10.251.0.{n}:8080", 1) for n in (11, 12, 13)}
    assert set(names(many(tb.client, UPLINK_NODE4, 30080, n=12))) == {"pod1", "pod2", "pod3"}


def test_node_ports_follow_node_addresses_at_each_full_sync(proxy: Harness, tb: Testbed) -> None:
    """A NodePort virtual service on an address the node gains, and none left behind on one it
    loses (ours because this process made it, though no longer a node address)."""
    extra = "10.250.0.77"
    key = f"TCP {extra}:30080"
    proxy.write("web", *web(tb))
    proxy.sync()
    assert key not in ipvsadm(tb)
    tb.exec(tb.node, ["ip", "addr", "add", f"{extra}/32", "dev", "lo"])
    try:
        proxy.sync(full=True)
        assert key in ipvsadm(tb)
    finally:
        tb.exec(tb.node, ["ip", "addr", "del", f"{extra}/32", "dev", "lo"])
    proxy.sync(full=True)
    assert key not in ipvsadm(tb)


def test_a_periodic_sync_trusts_what_verifying_repairs_and_sees_a_cleared_ipvs(
    tb: Testbed, tmp_path: Path
) -> None:
    """Between verified full syncs (every third here), a full sync trusts IPVS and the
    service addresses, as nftables mode trusts its elements: an address deleted behind the
    proxy's back comes back at the third. IPVS cleared, the dummy interface deleted (with
    local routes: made) or a node address gained is seen by the periodic sync's check and
    repaired at once."""
    proxy = Harness(tb, tmp_path / "manifests", mode="ipvs", verify_every=3)
    key, extra = f"TCP {VIP4}:80", "10.250.0.77"
    every = {(f"10.251.0.{n}:8080", 1) for n in (11, 12, 13)}
    pods = {"pod1", "pod2", "pod3"}
    try:
        proxy.write("web", *web(tb))
        proxy.sync()  # the first: verified
        tb.exec(tb.node, local("del", VIP4))
        for _ in range(2):  # the two periodic syncs between verified ones
            proxy.sync(full=True)
            assert request_tcp(tb.client, VIP4, 80).outcome == "refused"
        proxy.sync(full=True)  # the third: everything read back
        assert set(names(many(tb.client, VIP4, 80, n=12))) == pods
        made = ["ip", "link", "add", DUMMY, "type", "dummy"]  # not there with local routes
        tampering = (
            ["ipvsadm", "-C"],
            made if LOCAL_ROUTES else ["ip", "link", "del", DUMMY],
            ["ip", "addr", "add", f"{extra}/32", "dev", "lo"],
        )
        for command in tampering:
            tb.exec(tb.node, command)
            proxy.sync(full=True)  # periodic: the check differs, so everything is read back
            assert ipvsadm(tb)[key] == ("rr", every), command
            assert set(names(many(tb.client, VIP4, 80, n=12))) == pods, command
        assert f"TCP {extra}:30080" in ipvsadm(tb)  # a NodePort on the new node address
        assert proxy.proxier.stats.failures == 0
    finally:
        tb.exec(tb.node, ["ip", "addr", "del", f"{extra}/32", "dev", "lo"], check=False)
        proxy.close()


def test_ipvs_timeouts_from_config_and_zero_keeps_the_kernels(tb: Testbed, tmp_path: Path) -> None:
    def shown() -> list[int]:
        out = tb.exec(tb.node, ["ipvsadm", "-L", "--timeout"]).stdout
        return [
            int(w) for w in out.split(":")[1].split()
        ]  # "Timeout (tcp tcpfin udp): 900 120 300"

    udp = shown()[2]
    settings = ipvs_settings(tcp_timeout=901, tcp_fin_timeout=61)
    proxy = Harness(tb, tmp_path / "manifests", mode="ipvs", ipvs=settings)
    try:
        proxy.write("web", *web(tb))
        proxy.sync(full=True)
        assert shown() == [901, 61, udp]
    finally:
        proxy.close()


def test_exclude_cidrs_keep_a_stale_virtual_service(tb: Testbed, tmp_path: Path) -> None:
    """Two stale virtual services on service addresses of the proxy's (ours by the ownership
    rule): a full sync removes the one outside ipvs.excludeCIDRs and leaves the one inside."""
    proxy = Harness(
        tb, tmp_path / "m", mode="ipvs", ipvs=ipvs_settings(exclude_cidrs=("10.96.9.0/24",))
    )
    try:
        proxy.write("web", *web(tb))
        proxy.sync()
        for address in ("10.96.8.1", "10.96.9.1"):
            tb.exec(tb.node, local("add", address))
            tb.exec(tb.node, ["ipvsadm", "-A", "-t", f"{address}:80", "-s", "rr"])
        proxy.sync(full=True)
        shown = ipvsadm(tb)
        assert "TCP 10.96.8.1:80" not in shown and "TCP 10.96.9.1:80" in shown
    finally:
        proxy.close()
        tb.exec(tb.node, ["ipvsadm", "-D", "-t", "10.96.9.1:80"], check=False)


def test_cleanup_removes_node_ports_with_primary_node_port_addresses(
    tb: Testbed, tmp_path: Path
) -> None:
    """`lace-proxy cleanup` knows no Node object: with nodePortAddresses "primary" it still
    finds the NodePort virtual services on the node's addresses."""
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "node-a"},
        "status": {"addresses": [{"type": "InternalIP", "address": UPLINK_NODE4}]},
    }
    proxy = Harness(tb, tmp_path / "m", mode="ipvs", node_port_primary=True)
    proxy.write("web", *web(tb))
    proxy.write("node", node)
    proxy.sync(full=True)
    assert f"TCP {UPLINK_NODE4}:30080" in ipvsadm(tb)
    fresh = Harness(tb, tmp_path / "fresh", mode="ipvs", node_port_primary=True)
    fresh.close()  # the cleanup path: no Node known
    assert not [key for key in ipvsadm(tb) if key.endswith(":30080")]


def held_locally(tb: Testbed) -> tuple[set[str], set[str]]:
    """The service addresses the node holds: on the dummy interface, and as local routes of
    the proxy's protocol (145)."""
    shown = tb.exec(tb.node, ["ip", "-j", "addr", "show", "dev", DUMMY], check=False).stdout
    on_dummy = {a["local"] for link in json.loads(shown or "[]") for a in link["addr_info"]}
    routed = set()
    for family in ("-4", "-6"):
        argv = ["ip", "-j", family, "route", "show", "table", "local", "proto", "145"]
        routed |= {r["dst"] for r in json.loads(tb.exec(tb.node, argv).stdout or "[]")}
    return on_dummy, routed


def test_switching_the_setting_between_restarts_leaves_nothing_of_the_other_way(
    tb: Testbed, tmp_path: Path
) -> None:
    """A restart with the other lace.ipvs.serviceAddresses adopts IPVS as it is (nothing
    flushed) and moves every service address over, the new way's first, so each stays
    local: lace-ipvs0 goes when the addresses become local routes, the routes go when they
    are the interface's again; cleanup leaves neither."""
    addresses = {VIP4, VIP6, LB4}
    pods = {"pod1", "pod2", "pod3"}

    def restart(name: str, local_routes: bool) -> Harness:
        settings = IpvsSettings(local_routes=local_routes)
        proxy = Harness(tb, tmp_path / name, mode="ipvs", ipvs=settings)
        proxy.write("web", *web(tb))
        proxy.sync(full=True)
        for address, port in ((VIP4, 80), (VIP6, 80), (LB4, 80), (UPLINK_NODE4, 30080)):
            assert set(names(many(tb.client, address, port, n=9))) == pods, (name, address)
        return proxy

    restart("interface", False)
    assert held_locally(tb) == (addresses, set())
    before = ipvsadm(tb)
    routed = restart("routes", True)
    assert held_locally(tb) == (set(), addresses)
    assert DUMMY not in tb.exec(tb.node, ["ip", "-o", "link"]).stdout
    assert ipvsadm(tb) == before  # adopted: no virtual or real server changed
    routed.sync(full=True)
    assert routed.backend.last_changes == 0  # type: ignore[union-attr]
    restart("interface-again", False)
    assert held_locally(tb) == (addresses, set())
    assert ipvsadm(tb) == before
    routed_again = restart("routes-again", True)  # its cleanup removes either way's
    assert held_locally(tb) == (set(), addresses)
    tb.exec(tb.node, ["ip", "link", "add", DUMMY, "type", "dummy"])
    tb.exec(tb.node, ["ip", "addr", "add", f"{VIP4}/32", "dev", DUMMY])
    routed_again.close()
    assert held_locally(tb) == (set(), set())
    assert DUMMY not in tb.exec(tb.node, ["ip", "-o", "link"]).stdout
    assert not [key for key in ipvsadm(tb) if VIP4 in key or UPLINK_NODE4 in key]
