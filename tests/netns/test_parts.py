"""The table's biggest containers split into parts by the frontend's address (parts.py), on
real traffic: every part serves its frontends, the kernel holds each frontend in the part
its address says, and a table that outgrows its parts is rewritten whole without dropping
a held connection.

The traffic suite of test_nftables_proxy runs split too (its "split" proxy); these tests
spread frontends over every part and change the number of parts under a live connection.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from lace_proxy.dataplane.nftables import parts
from lace_proxy.demo.testbed import Testbed, request_tcp

from .proxykit import Harness, RecordingNft, endpoints, names, service, talk

pytestmark = pytest.mark.netns

ECHO_PORT = 9000


def addresses(v6: bool, count: int) -> list[str]:
    """ClusterIPs whose low bits run through every part."""
    return [f"fd00:96::{0x20 + k:x}" if v6 else f"10.96.0.{0x20 + k}" for k in range(count)]


def holding(harness: Harness, container: str) -> dict[str, set[str]]:
    """The kernel's parts of `container` with their elements."""
    state = harness.nft.read_back()
    assert state is not None
    return {n: state.elements[n] for n in parts.holders(container, state.elements)}


@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
def test_every_part_serves_the_frontends_its_address_selects(
    make_testbed: Callable[..., Testbed], tmp_path: Path, v6: bool
) -> None:
    tb = make_testbed(pods=3)
    harness = Harness(tb, tmp_path / "m", parts=4)
    try:
        ips = addresses(v6, 9)
        for k, ip in enumerate(ips[:8]):
            pod = tb.pods[k % 3]
            harness.write(f"s{k}", service(f"s{k}", [ip]), endpoints(f"s{k}", [pod], v6=v6))
        harness.write("empty", service("empty", [ips[8]]))
        harness.sync(full=True)
        fam = 6 if v6 else 4
        # Each ClusterIP is in the part of its last byte's low two bits, and only there.
        held = holding(harness, f"cluster-ips-v{fam}")
        assert held == {
            f"cluster-ips-v{fam}-p{k}": {
                ip for ip in ips if ipaddress.ip_address(ip).packed[-1] & 3 == k
            }
            for k in range(4)
        }
        maps = holding(harness, f"endpoints-0-v{fam}")
        assert sorted(maps) == [f"endpoints-0-v{fam}-p{k}" for k in range(4)]
        assert all(len(elements) == 2 for elements in maps.values()), maps
        # Every frontend is translated to its own endpoint, whichever part holds it.
        for k, ip in enumerate(ips[:8]):
            assert names([request_tcp(tb.client, ip, 80) for _ in range(3)]) == {
                tb.pods[k % 3].name: 3
            }, ip
            # Another port of a ClusterIP is refused (cluster-ips-check), in every part.
            assert request_tcp(tb.client, ip, 81).outcome == "refused", ip
        assert request_tcp(tb.client, ips[8], 80).outcome == "refused"
    finally:
        harness.close()


def test_a_table_that_outgrows_its_parts_is_rewritten_keeping_connections(
    make_testbed: Callable[..., Testbed], tmp_path: Path
) -> None:
    tb = make_testbed(pods=3)
    for pod in tb.pods:
        tb.serve(pod, (), echo_ports=(ECHO_PORT,))
    # Two service ports a part: two ports fit one part, six need four.
    harness = Harness(tb, tmp_path / "m", part_size=2)
    try:
        echo = "10.96.0.9"
        harness.write(
            "echo",
            service("echo", [echo], port=ECHO_PORT, target=ECHO_PORT),
            endpoints("echo", tb.pods, port=ECHO_PORT),
        )
        ips = addresses(False, 5)
        harness.write("s0", service("s0", [ips[0]]), endpoints("s0", tb.pods[:1]))
        harness.sync(full=True)
        assert list(holding(harness, "cluster-ips-v4")) == ["cluster-ips-v4"]
        held = []
        for _ in range(6):
            sock = tb.client.ns.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.settimeout(3)
            sock.connect((echo, ECHO_PORT))
            held.append((sock, talk(sock, "hello")))
        assert len({pod for _, pod in held}) > 1
        for k, ip in enumerate(ips[1:], 1):
            harness.write(f"s{k}", service(f"s{k}", [ip]), endpoints(f"s{k}", tb.pods[1:]))
        harness.sync()  # a change keeps the parts; the full sync splits
        assert list(holding(harness, "cluster-ips-v4")) == ["cluster-ips-v4"]
        harness.sync(full=True)
        assert sorted(holding(harness, "cluster-ips-v4")) == [
            f"cluster-ips-v4-p{k}" for k in range(4)
        ]
        for sock, pod in held:
            assert talk(sock, "still there?") == pod
        assert set(names([request_tcp(tb.client, ips[0], 80) for _ in range(5)])) == {"pod1"}
        for ip in ips[1:]:
            assert set(names([request_tcp(tb.client, ip, 80) for _ in range(20)])) == {
                "pod2",
                "pod3",
            }
        # The rewritten table is what a new process adopts as it is.
        recorder = RecordingNft(tb.node.ns.name)
        again = Harness(tb, tmp_path / "m", part_size=2)
        again.nft.nft = recorder
        again.sync()
        assert recorder.applied == [], recorder.applied[0].lines()[:20]
        # Fewer ports: still split while a part would hold a quarter of its size or more.
        for k in range(1, 5):
            harness.remove(f"s{k}")
        harness.sync(full=True)  # two ports: still four parts
        assert len(holding(harness, "cluster-ips-v4")) == 4
        harness.remove("s0")
        harness.sync(full=True)  # one port: two parts
        assert sorted(holding(harness, "cluster-ips-v4")) == [
            "cluster-ips-v4-p0",
            "cluster-ips-v4-p1",
        ]
        for sock, pod in held:
            with sock:
                assert talk(sock, "and now?") == pod
        assert request_tcp(tb.client, ips[0], 80).outcome == "escaped"  # no such service
    finally:
        harness.close()
