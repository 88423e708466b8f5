"""A restarted proxy adopts the kernel's table by diff: nothing flushed, only what differs.

Each test programs the node with one proxy pipeline, then builds a second one (a new
process's state: empty table, no memory of what was programmed) on the same namespace and
looks at what its first full sync sends to the kernel, and at the traffic.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lace_proxy.dataplane.nftables.backend import NftablesBackend
from lace_proxy.demo.testbed import CLIENT4, Testbed, request_tcp

from .proxykit import (
    EXT4,
    LB4,
    VIP4,
    VIP6,
    Harness,
    RecordingNft,
    endpoints,
    names,
    service,
    udp_exchange,
)

pytestmark = pytest.mark.netns


@pytest.fixture
def tb(make_testbed: Callable[..., Testbed]) -> Testbed:
    return make_testbed(pods=3)


#: The table whole, and its biggest containers split in four (parts.py), as at scale.
PARTS = pytest.mark.parametrize("parts", [0, 4], ids=["whole", "split"])


def proxy(
    tb: Testbed, folder: Path, verify_every: int = 1, parts: int = 0
) -> tuple[Harness, RecordingNft]:
    """A proxy pipeline as a freshly started process has it, recording its transactions."""
    harness = Harness(tb, folder, verify_every=verify_every, parts=parts)
    recorder = RecordingNft(tb.node.ns.name)
    harness.nft.nft = recorder
    return harness, recorder


def every_kind(tb: Testbed) -> list[tuple[str, list[dict[str, Any]]]]:
    """Services of every layout the renderer has: data-map frontends, NodePorts, ExternalIPs,
    load balancers with source ranges, Local policies, IPv4 and IPv6 affinity, UDP, none."""
    pods = tb.pods
    affinity = {"sessionAffinity": "ClientIP"}
    return [
        (
            "web",
            [service("web", [VIP4, VIP6]), endpoints("web", pods), endpoints("web", pods, v6=True)],
        ),
        (
            "edge",
            [
                service(
                    "edge",
                    ["10.96.0.11"],
                    type="LoadBalancer",
                    node_port=30081,
                    externalIPs=[EXT4],
                    loadBalancerSourceRanges=[f"{CLIENT4}/32", "10.0.0.0/8"],
                    status={"loadBalancer": {"ingress": [{"ip": LB4}]}},
                ),
                endpoints("edge", pods[:2]),
            ],
        ),
        (
            "local",
            [
                service(
                    "local",
                    ["10.96.0.12"],
                    type="NodePort",
                    node_port=30082,
                    externalTrafficPolicy="Local",
                ),
                endpoints("local", pods[1:]),
            ],
        ),
        (
            "sticky",
            [
                service(
                    "sticky",
                    ["10.96.0.13", "fd00:96::13"],
                    type="NodePort",
                    node_port=30083,
                    **affinity,
                ),
                endpoints("sticky", pods),
                endpoints("sticky", pods, v6=True),
            ],
        ),
        (
            "dns",
            [
                service("dns", ["10.96.0.14"], port=53, protocol="UDP"),
                endpoints("dns", pods[:1], protocol="UDP"),
            ],
        ),
        ("empty", [service("empty", ["10.96.0.15"])]),
    ]


def program(harness: Harness, objects: list[tuple[str, list[dict[str, Any]]]]) -> None:
    for name, objs in objects:
        harness.write(name, *objs)
    harness.sync()


def kernel(backend: NftablesBackend) -> Any:
    state = backend.read_back()
    assert state is not None
    return state


@PARTS
def test_a_restart_with_nothing_changed_sends_nothing(
    tb: Testbed, tmp_path: Path, parts: int
) -> None:
    first, _ = proxy(tb, tmp_path / "m", parts=parts)
    program(first, every_kind(tb))
    before = kernel(first.nft)
    second, recorder = proxy(tb, tmp_path / "m", parts=parts)
    second.sync()
    assert recorder.applied == [], recorder.applied[0].lines()[:20]
    assert kernel(second.nft) == before
    # And the periodic full sync after it is a no-op too.
    second.sync(full=True)
    assert recorder.applied == []


@PARTS
def test_a_restart_after_changes_programs_only_the_difference(
    tb: Testbed, tmp_path: Path, parts: int
) -> None:
    first, _ = proxy(tb, tmp_path / "m", parts=parts)
    objects = every_kind(tb)
    program(first, objects)
    # While "down": web loses an endpoint, sticky's IPv6 side loses one, empty is deleted,
    # a new service appears.
    pods = tb.pods
    first.write(
        "web",
        service("web", [VIP4, VIP6]),
        endpoints("web", pods[:2]),
        endpoints("web", pods, v6=True),
    )
    first.write("sticky", *objects[3][1][:2], endpoints("sticky", pods[:2], v6=True))
    first.remove("empty")
    first.write("new", service("new", ["10.96.0.16"]), endpoints("new", pods[2:]))
    second, recorder = proxy(tb, tmp_path / "m", parts=parts)
    second.sync()
    (tx,) = recorder.applied
    text = tx.text()
    assert "flush map" not in text and "delete map" not in text, text
    # The one set deleted is the removed IPv6 endpoint's affinity set.
    deleted_sets = [c for c in tx.lines() if c.startswith("delete set")]
    assert len(deleted_sets) == 1 and " aff-" in deleted_sets[0], text
    flushed = [c for c in tx.lines() if c.startswith("flush chain")]
    # Only the IPv6 affinity service's own chains, whose endpoints changed.
    assert flushed and all(c.split()[-1].startswith(("svc-", "ep-")) for c in flushed), flushed
    assert len(tx) < 20, text
    # The adopted table is exactly what a proxy starting on an empty kernel programs.
    adopted = kernel(second.nft)
    second.nft.cleanup()
    third, _ = proxy(tb, tmp_path / "m", parts=parts)
    third.sync()
    assert kernel(third.nft) == adopted
    assert set(names([request_tcp(tb.client, VIP4, 80) for _ in range(30)])) == {"pod1", "pod2"}
    assert set(names([request_tcp(tb.client, "10.96.0.16", 80) for _ in range(5)])) == {"pod3"}


def test_drift_is_repaired_element_by_element(tb: Testbed, tmp_path: Path) -> None:
    harness, recorder = proxy(tb, tmp_path / "m")
    program(harness, every_kind(tb))
    recorder.applied.clear()
    t = ["nft"]
    tb.exec(
        tb.node,
        [
            *t,
            "delete",
            "element",
            "inet",
            "lace-proxy",
            "endpoints-1-v4",
            f"{{ {VIP4} . tcp . 80 }}",
        ],
    )
    tb.exec(tb.node, [*t, "flush", "chain", "inet", "lace-proxy", "ext-v4"])
    tb.exec(tb.node, [*t, "add", "chain", "inet", "lace-proxy", "intruder"])
    harness.sync(full=True)
    (tx,) = recorder.applied
    assert sorted(tx.lines()) == sorted(
        [
            f"add element inet lace-proxy endpoints-1-v4 {{ {VIP4} . tcp . 80 : "
            f"{tb.pods[1].ipv4} . 8080 }}",
            "flush chain inet lace-proxy ext-v4",
            *(c for c in tx.lines() if c.startswith("add rule inet lace-proxy ext-v4 ")),
            "flush chain inet lace-proxy intruder",
            "delete chain inet lace-proxy intruder",
        ]
    ), tx.lines()
    assert len([c for c in tx.lines() if c.startswith("add rule")]) == 2
    assert set(names([request_tcp(tb.client, VIP4, 80) for _ in range(30)])) == {
        "pod1",
        "pod2",
        "pod3",
    }


def test_a_plain_full_sync_reads_no_element_but_notices_a_changed_structure(
    tb: Testbed, tmp_path: Path
) -> None:
    harness, recorder = proxy(tb, tmp_path / "m", verify_every=10)
    program(harness, every_kind(tb))
    recorder.applied.clear()
    recorder.listings = 0
    element = f"{{ {VIP4} . tcp . 80 }}"
    tb.exec(tb.node, ["nft", "delete", "element", "inet", "lace-proxy", "endpoints-1-v4", element])
    # Listing a million elements takes nft tens of seconds: a periodic full sync does not.
    harness.sync(full=True)
    assert (recorder.listings, recorder.applied) == (0, [])
    # A changed structure is seen (chains and rules are read in milliseconds), and then
    # every element is verified: the deleted one comes back too.
    tb.exec(tb.node, ["nft", "flush", "chain", "inet", "lace-proxy", "ext-v4"])
    harness.sync(full=True)
    assert recorder.listings == 1
    (tx,) = recorder.applied
    assert any(c.startswith("add element inet lace-proxy endpoints-1-v4") for c in tx.lines())
    assert "flush chain inet lace-proxy ext-v4" in tx.lines()


def test_clients_keep_their_affinity_across_a_restart(tb: Testbed, tmp_path: Path) -> None:
    first, _ = proxy(tb, tmp_path / "m")
    program(first, every_kind(tb))
    pinned = {
        r.reply.name
        for r in [request_tcp(tb.client, "10.96.0.13", 80) for _ in range(8)]
        if r.reply
    }
    assert len(pinned) == 1
    second, recorder = proxy(tb, tmp_path / "m")
    second.sync()
    assert recorder.applied == []
    again = {
        r.reply.name
        for r in [request_tcp(tb.client, "10.96.0.13", 80) for _ in range(8)]
        if r.reply
    }
    assert again == pinned


def test_a_client_pinned_to_an_endpoint_gone_while_down_is_moved(
    tb: Testbed, tmp_path: Path
) -> None:
    """The restarted proxy replaces the service port's affinity id, so the client's
    remembered choice of the endpoint that left is orphaned (it was kept: the new process
    drew its predecessor's first id again)."""
    sticky = service("sticky", ["10.96.0.13"], sessionAffinity="ClientIP")
    first, _ = proxy(tb, tmp_path / "m")
    first.write("sticky", sticky, endpoints("sticky", tb.pods))
    first.sync()
    (pinned,) = {
        r.reply.name
        for r in [request_tcp(tb.client, "10.96.0.13", 80) for _ in range(8)]
        if r.reply
    }
    first.write("sticky", sticky, endpoints("sticky", [p for p in tb.pods if p.name != pinned]))
    second, _ = proxy(tb, tmp_path / "m")
    second.sync()
    answered = names([request_tcp(tb.client, "10.96.0.13", 80) for _ in range(8)])
    assert pinned not in answered and len(answered) == 1, answered


def test_another_skeleton_is_rewritten_in_one_batch(tb: Testbed, tmp_path: Path) -> None:
    first, _ = proxy(tb, tmp_path / "m")
    program(first, every_kind(tb))
    # An older version's table (or another configuration): no marker of this skeleton.
    marker = next(c for c in kernel(first.nft).chains if c.startswith("skeleton-"))
    tb.exec(tb.node, ["nft", "delete", "chain", "inet", "lace-proxy", marker])
    second, recorder = proxy(tb, tmp_path / "m")
    second.sync()
    (tx,) = recorder.applied
    assert any(c.startswith("flush chain inet lace-proxy services") for c in tx.lines())
    assert marker in kernel(second.nft).chains
    assert set(names([request_tcp(tb.client, VIP4, 80) for _ in range(30)])) == {
        "pod1",
        "pod2",
        "pod3",
    }


def udp_flows(tb: Testbed, address: str) -> int:
    """How many UDP conntrack entries the node holds towards `address`."""
    out = tb.exec(tb.node, ["conntrack", "-L", "-p", "udp", "--orig-dst", address], check=False)
    return sum(1 for line in out.stdout.splitlines() if line.startswith("udp"))


def test_udp_flows_survive_a_restart_and_follow_endpoints_changed_meanwhile(
    tb: Testbed, tmp_path: Path
) -> None:
    dns = service("dns", ["10.96.0.14"], port=53, protocol="UDP")
    first, _ = proxy(tb, tmp_path / "m")
    first.write("dns", dns, endpoints("dns", tb.pods[:1], protocol="UDP"))
    first.sync()
    sock = tb.client.ns.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.settimeout(1.0)
    with sock:
        assert udp_exchange(sock, "10.96.0.14", 53) == "pod1"
        # A restart with nothing changed leaves the flow alone (a proxy that cleaned every
        # "new" UDP service would delete it).
        second, _ = proxy(tb, tmp_path / "m")
        second.sync()
        assert udp_flows(tb, "10.96.0.14") == 1
        assert udp_exchange(sock, "10.96.0.14", 53) == "pod1"
        # pod1 leaves while the proxy is down: the restarted one moves the flow to pod2.
        second.write("dns", dns, endpoints("dns", tb.pods[1:2], protocol="UDP"))
        third, _ = proxy(tb, tmp_path / "m")
        third.sync()
        assert udp_flows(tb, "10.96.0.14") == 0
        assert udp_exchange(sock, "10.96.0.14", 53) == "pod2"
