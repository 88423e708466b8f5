"""Inside the VM: the kernel has working IPVS, programmed through pyroute2, witnessed by
``ipvsadm -Ln`` and by traffic.

Topology (built once per module)::

    root namespace                                  namespace lvs-rs
    lvs-vips (dummy)  10.98.0.1/32  (the VIP)
    lvs-rs0           10.99.0.1/24 ──── veth ────── eth0  10.99.0.2/24, 10.99.0.3/24
                                                    (the real servers; default route 10.99.0.1)

IPVS refuses a real server it has no route to ("address not unicast"): the topology comes first.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
from pyroute2 import IPVS, IPVSDest, IPVSService

pytestmark = pytest.mark.ipvs

NS = "lvs-rs"
VIP = "10.98.0.1"
REAL_SERVERS = ("10.99.0.2", "10.99.0.3")
RS_PORT = 8080
MASQ = 0  # IP_VS_CONN_F_MASQ; pyroute2's IPVSDest defaults to 3, direct routing
SCHEDULERS = ("rr", "wrr", "lc", "sh", "mh")

# Answers every connection with the address it was reached on, i.e. which real server.
SERVER = """
import socket, sys
s = socket.create_server(("0.0.0.0", int(sys.argv[1])))
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(c.getsockname()[0].encode())
    c.close()
"""


def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def ipvsadm() -> dict[str, tuple[str, list[tuple[str, str, int]]]]:
    """``ipvsadm -Ln`` as {"TCP 10.98.0.1:80": (scheduler, [(real server, forward, weight)])}."""
    services: dict[str, tuple[str, list[tuple[str, str, int]]]] = {}
    current: list[tuple[str, str, int]] = []
    for line in sh("ipvsadm", "-Ln").splitlines():
        words = line.split()
        if words and words[0] in ("TCP", "UDP", "SCTP"):
            current = []
            services[f"{words[0]} {words[1]}"] = (words[2], current)
        elif words[:1] == ["FWM"]:  # a fwmark service: its real servers are left out
            current = []
        elif words[:1] == ["->"] and words[1] != "RemoteAddress:Port":
            current.append((words[1], words[2], int(words[3])))
    return services


@pytest.fixture(scope="module")
def topology() -> Iterator[None]:
    sh("ip", "netns", "add", NS)
    try:
        sh("ip", "link", "add", "lvs-vips", "type", "dummy")
        sh("ip", "addr", "add", f"{VIP}/32", "dev", "lvs-vips")
        sh("ip", "link", "set", "lvs-vips", "up")
        sh("ip", "link", "add", "lvs-rs0", "type", "veth", "peer", "name", "eth0", "netns", NS)
        sh("ip", "addr", "add", "10.99.0.1/24", "dev", "lvs-rs0")
        sh("ip", "link", "set", "lvs-rs0", "up")
        for addr in REAL_SERVERS:
            sh("ip", "-n", NS, "addr", "add", f"{addr}/24", "dev", "eth0")
        sh("ip", "-n", NS, "link", "set", "eth0", "up")
        sh("ip", "-n", NS, "link", "set", "lo", "up")
        sh("ip", "-n", NS, "route", "add", "default", "via", "10.99.0.1")
        yield
    finally:
        subprocess.run(["ip", "link", "del", "lvs-vips"], capture_output=True)
        subprocess.run(["ip", "link", "del", "lvs-rs0"], capture_output=True)
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)


@pytest.fixture
def ipvs(topology: None) -> Iterator[IPVS]:
    with IPVS() as ipvs:
        yield ipvs
    sh("ipvsadm", "-C")


def add_service(ipvs: IPVS, port: int, scheduler: str) -> IPVSService:
    service = IPVSService(addr=VIP, port=port, protocol=socket.IPPROTO_TCP, sched_name=scheduler)
    ipvs.service("add", service=service)
    for addr in REAL_SERVERS:
        dest = IPVSDest(addr=addr, port=RS_PORT, fwd_method=MASQ, weight=1)
        ipvs.dest("add", service=service, dest=dest)
    return service


def test_ip_vs_and_schedulers_loaded() -> None:
    with open("/proc/modules") as f:
        loaded = {line.split()[0] for line in f}
    assert {"ip_vs", *(f"ip_vs_{s}" for s in SCHEDULERS)} <= loaded
    assert "IP Virtual Server" in sh("ipvsadm", "-Ln")


@pytest.mark.parametrize("scheduler", ["rr", "mh"])
def test_nat_service_with_two_real_servers(ipvs: IPVS, scheduler: str) -> None:
    service = add_service(ipvs, 80, scheduler)
    expected = sorted((f"{addr}:{RS_PORT}", "Masq", 1) for addr in REAL_SERVERS)
    assert ipvsadm() == {f"TCP {VIP}:80": (scheduler, expected)}
    dumped = [IPVSService.from_message(m) for m in ipvs.service("dump")]
    assert [(s["addr"], s["port"], s["sched_name"]) for s in dumped] == [(VIP, 80, scheduler)]
    ipvs.service("del", service=service)
    assert ipvsadm() == {}


def test_round_robin_reaches_both_real_servers(ipvs: IPVS) -> None:
    add_service(ipvs, 80, "rr")
    server = subprocess.Popen(
        ["ip", "netns", "exec", NS, sys.executable, "-c", SERVER, str(RS_PORT)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline() == "ready\n"
        answers = []
        for _ in range(4):
            with socket.create_connection((VIP, 80), timeout=10) as c:
                answers.append(c.recv(64).decode())
        assert sorted(answers) == sorted(REAL_SERVERS * 2)
        assert answers[0] != answers[1]
    finally:
        server.kill()
        server.wait()


def test_dummy_interface() -> None:
    sh("ip", "link", "add", "lvs-dummy1", "type", "dummy")
    try:
        assert "dummy" in sh("ip", "-d", "link", "show", "lvs-dummy1")
    finally:
        sh("ip", "link", "del", "lvs-dummy1")


def test_the_read_back_agrees_with_ipvsadm(ipvs: IPVS) -> None:
    """The sync reads IPVS back with netlink dumps parsed by lace-proxy's codec
    (`kernel.read`): it must say what `ipvsadm -Ln` says, for IPv4 and IPv6, serving and
    draining servers, persistence, with a fwmark service (not ours) in between; and the
    sync's own, leaner read (`kernel.dump`) says what `read` says."""
    from lace_proxy.dataplane.ipvs import VirtualServer
    from lace_proxy.dataplane.ipvs.kernel import dump, read, target
    from lace_proxy.dataplane.ipvs.netlink import IpvsChannel

    sh("ip", "addr", "add", "fd99::1/64", "dev", "lvs-rs0", "nodad")
    try:
        add_service(ipvs, 80, "rr")
        sh(
            "ipvsadm",
            "-e",
            "-t",
            f"{VIP}:80",
            "-r",
            f"{REAL_SERVERS[1]}:{RS_PORT}",
            "-m",
            "-w",
            "0",
        )
        sh("ipvsadm", "-A", "-u", f"{VIP}:53", "-s", "mh", "-p", "600")
        sh("ipvsadm", "-a", "-u", f"{VIP}:53", "-r", f"{REAL_SERVERS[0]}:53", "-m")
        sh("ipvsadm", "-A", "-f", "7", "-s", "rr")
        sh("ipvsadm", "-a", "-f", "7", "-r", f"{REAL_SERVERS[0]}:0", "-m")
        sh("ipvsadm", "-A", "-t", "[fd98::1]:443", "-s", "wrr")
        sh("ipvsadm", "-a", "-t", "[fd98::1]:443", "-r", "[fd99::2]:8443", "-m", "-w", "3")
        with IpvsChannel() as channel:
            held = read(channel)
            dumped = dump(channel)
        assert dumped == {
            vs: (target(h), frozenset((r.address, r.port) for r in h[2] if r.weight == 0))
            for vs, h in held.items()
        }
        assert dumped[VirtualServer("TCP", VIP, 80)][1] == {(REAL_SERVERS[1], RS_PORT)}
        assert set(held) == {
            VirtualServer("TCP", VIP, 80),
            VirtualServer("UDP", VIP, 53),
            VirtualServer("TCP", "fd98::1", 443),
        }
        witness = ipvsadm()
        for vs, (scheduler, _, servers) in held.items():
            where = f"[{vs.address}]:{vs.port}" if ":" in vs.address else f"{vs.address}:{vs.port}"
            shown = [
                (f"[{r.address}]:{r.port}" if ":" in r.address else f"{r.address}:{r.port}")
                for r in servers
            ]
            rows = sorted((s, r.forward, r.weight) for s, r in zip(shown, servers, strict=True))
            shown_scheduler, shown_rows = witness[f"{vs.protocol} {where}"]
            assert (shown_scheduler, sorted(shown_rows)) == (scheduler, rows), vs
        assert held[VirtualServer("UDP", VIP, 53)][:2] == ("mh", 600)
        weights = {(r.address, r.weight) for r in held[VirtualServer("TCP", VIP, 80)][2]}
        assert weights == {(REAL_SERVERS[0], 1), (REAL_SERVERS[1], 0)}
        (v6,) = held[VirtualServer("TCP", "fd98::1", 443)][2]
        assert (v6.address, v6.port, v6.forward, v6.weight) == ("fd99::2", 8443, "Masq", 3)
    finally:
        sh("ip", "addr", "del", "fd99::1/64", "dev", "lvs-rs0")


def test_the_real_servers_of_many_virtual_services_read_back(ipvs: IPVS) -> None:
    """`servers_of` reads each virtual service's real servers with a dump of its own, in
    order: also one with more real servers than one answer buffer holds (its dump's end
    comes later), and one IPVS lacks (none)."""
    from lace_proxy.dataplane.ipvs import Target, VirtualServer
    from lace_proxy.dataplane.ipvs.netlink import IpvsChannel

    services = [VirtualServer("TCP", VIP, 1000 + i) for i in range(48)]
    many = [(f"10.99.0.{2 + n % 250}", 9000 + n // 250) for n in range(700)]
    wanted = {
        vs: many if i % 5 == 0 else [(f"10.99.0.{2 + j}", 80) for j in range(i % 4)]
        for i, vs in enumerate(services)
    }
    with IpvsChannel() as channel:
        batch = channel.batch()
        for vs, servers in wanted.items():
            batch.add_service(vs, Target("rr", 0, frozenset()))
            for server in servers:
                batch.add_server(vs, server, 1)
        assert channel.send(batch) == []
        asked = [*services, VirtualServer("TCP", VIP, 999)]  # the last: no such service
        read = channel.servers_of(asked)
    assert len(read) == len(asked)
    for vs, servers in zip(services, read, strict=False):
        assert sorted((a, p) for a, p, *_ in servers) == sorted(wanted[vs]), vs
        assert {(fwd, weight) for _, _, fwd, weight, _, _ in servers} <= {(0, 1)}, vs
    assert read[-1] == []
