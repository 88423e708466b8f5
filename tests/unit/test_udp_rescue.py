"""Moved UDP flows: conntrack's listing read back into flows, and the rescue batch made of
them (what the kernel does with it: tests/netns/test_udp_move.py)."""

from __future__ import annotations

import pytest

from lace_proxy.dataplane import rescue
from lace_proxy.dataplane.conntrack import UdpFlow, parse_flows

#: `conntrack -L -p udp` (conntrack-tools 1.4.7) as printed for a DNATed flow of each
#: family (the first a stream: ASSURED), an unanswered one, and the summary line (stderr,
#: here mixed in).
LISTING = """\
udp      17 29 src=127.0.0.1 dst=10.9.9.9 sport=40001 dport=53 src=127.0.0.1 dst=127.0.0.1 \
sport=5300 dport=40001 [ASSURED] mark=0 use=1
udp      17 29 src=::1 dst=fd00::9 sport=40002 dport=53 src=::1 dst=::1 sport=5300 \
dport=40002 mark=0 use=1
udp      17 29 src=10.0.0.7 dst=10.9.9.9 sport=40003 dport=53 [UNREPLIED] src=10.244.0.2 \
dst=10.250.0.1 sport=5300 dport=61000 mark=0 use=1
conntrack v1.4.7 (conntrack-tools): 3 flow entries have been shown.
"""


def test_the_listing_reads_back_as_flows() -> None:
    assert parse_flows(LISTING) == [
        UdpFlow(4, "127.0.0.1", 40001, "10.9.9.9", 53, "127.0.0.1", 5300, "127.0.0.1", 40001, True),
        UdpFlow(6, "::1", 40002, "fd00::9", 53, "::1", 5300, "::1", 40002),
        UdpFlow(4, "10.0.0.7", 40003, "10.9.9.9", 53, "10.244.0.2", 5300, "10.250.0.1", 61000),
    ]


def test_a_line_that_is_not_an_address_is_refused() -> None:
    line = (
        "udp 17 29 src=x;1 dst=10.9.9.9 sport=1 dport=53 src=10.0.0.1 dst=10.0.0.2 sport=2 dport=1"
    )
    with pytest.raises(ValueError):
        parse_flows(line)


def test_a_masqueraded_flow_is_translated_back_in_four_steps() -> None:
    [flow] = parse_flows(LISTING.splitlines()[2])
    tx = rescue.transaction("lace-proxy", [flow, flow])  # listed twice: one element each
    prefix = "add element inet lace-proxy rescue-"
    assert tx.lines() == [
        prefix + "daddr-v4 { 10.244.0.2 . 5300 . 10.250.0.1 . 61000 : 10.0.0.7 }",
        prefix + "dport-v4 { 10.244.0.2 . 5300 . 10.0.0.7 . 61000 : 40003 }",
        prefix + "sport-v4 { 10.244.0.2 . 5300 . 10.0.0.7 . 40003 : 53 }",
        prefix + "saddr-v4 { 10.244.0.2 . 53 . 10.0.0.7 . 40003 : 10.9.9.9 }",
    ]


def test_no_flows_no_batch_and_a_bounded_one() -> None:
    assert not rescue.transaction("lace-proxy", [])
    flows = [
        UdpFlow(6, "fd00::7", port, "fd00:96::53", 53, "fd00:251::11", 5300, "fd00::7", port)
        for port in range(40000, 40010)
    ]
    tx = rescue.transaction("t", flows, limit=4)
    assert [c.count(" : ") for c in tx.lines()] == [4, 4, 4, 4]
    assert all("-v6 {" in c for c in tx.lines())
