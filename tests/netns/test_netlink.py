"""Netlink lace-proxy encodes itself, against a real kernel: conntrack deletions (IPVS mode's
UDP flow moves), many to a `send`, each answered only if it fails; the links and addresses
IPVS mode reads."""

from __future__ import annotations

import errno
import ipaddress
import json
import socket

import pytest
from pyroute2 import Conntrack
from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

from lace_proxy.dataplane import netlink
from lace_proxy.dataplane.conntrack import UdpFlow, delete_requests
from lace_proxy.dataplane.ipvs.addresses import AddressChannel
from lace_proxy.demo.testbed import Testbed

pytestmark = pytest.mark.netns

FAMILIES = (socket.AF_INET, socket.AF_INET6)
FRONTENDS = {4: ("10.96.0.10", "10.250.0.9"), 6: ("fd00:96::10", "fd00:250::9")}


def _flows(count: int) -> list[UdpFlow]:
    """UDP flows of both families, each a different client port."""
    out = []
    for i in range(count):
        family = 4 if i % 2 else 6
        frontend, client = FRONTENDS[family]
        out.append(UdpFlow(family, client, 10_000 + i, frontend, 53, "", 0, "", 0))
    return out


def _origin(flow: UdpFlow) -> NFCTAttrTuple:
    return NFCTAttrTuple(
        family=socket.AF_INET6 if flow.family == 6 else socket.AF_INET,
        saddr=flow.client,
        daddr=flow.frontend,
        proto=socket.IPPROTO_UDP,
        sport=flow.client_port,
        dport=flow.frontend_port,
    )


def _add(flows: list[UdpFlow]) -> None:
    for family in FAMILIES:
        with Conntrack(nfgen_family=family) as ct:
            for f in flows:
                o = _origin(f)
                if o.family == family:
                    ct.entry("add", timeout=120, tuple_orig=o, tuple_reply=o.reverse())


def _held(flows: list[UdpFlow]) -> set[UdpFlow]:
    """Which of these flows conntrack holds."""
    wanted = {(f.client, f.client_port): f for f in flows}
    held = set()
    for family in FAMILIES:
        with Conntrack(nfgen_family=family) as ct:
            for entry in ct.dump_entries():
                key = (entry.tuple_orig.saddr, entry.tuple_orig.sport)
                if key in wanted and entry.tuple_orig.proto == socket.IPPROTO_UDP:
                    held.add(wanted[key])
    return held


def _delete(flows: list[UdpFlow], first: int) -> dict[int, int]:
    with netlink.NetlinkSocket(netlink.NETLINK_NETFILTER, answers=len(flows)) as ct:
        buffers = delete_requests(flows, first)
        netlink.send_together([(ct, b) for b in buffers])
        return ct.answers()


def test_deletions_sent_together_delete_exactly_their_entries(testbed: Testbed) -> None:
    flows = _flows(2_400)  # some 200 kB of requests
    ns = testbed.node.ns
    ns.call(_add, flows)
    assert ns.call(_held, flows) == set(flows)
    going, staying = flows[::3], [f for i, f in enumerate(flows) if i % 3]
    assert len(delete_requests(going, 1)) > 1  # more than one send

    answers = ns.call(_delete, going, 1)
    assert answers == {}  # a deletion that succeeds is not answered
    assert ns.call(_held, flows) == set(staying)

    # Deleted again: each answered ENOENT, by its own sequence number; nothing else changes.
    answers = ns.call(_delete, going, 5_000)
    assert answers == {5_000 + i: errno.ENOENT for i in range(len(going))}
    assert ns.call(_held, flows) == set(staying)


def _read_links_and_addresses() -> tuple[
    dict[str, int], dict[int, set[tuple[int, str]]], set[tuple[int, str]]
]:
    """AddressChannel's view: the links, each one's addresses by its own dump, every address."""
    with AddressChannel() as channel:
        links = {link.name: link.ifindex for link in channel.links()}
        each = {i: set(channel.addresses(i)) for i in links.values()}  # filtered by the kernel
        gone = max(links.values()) + 1000
        assert channel.addresses(gone) == []  # a link that is not there has none
        return links, each, set(channel.addresses())


def test_links_and_each_links_addresses_read_as_ip_shows_them(testbed: Testbed) -> None:
    """The node's links by name and index, and each one's addresses read by a dump the kernel
    filters to that link (a periodic sync in IPVS mode reads the node's addresses so, not
    the dummy interface's thousands), as `ip` shows them."""
    node = testbed.node
    shown = json.loads(testbed.exec(node, ["ip", "-j", "addr", "show"]).stdout)
    links, each, every = node.ns.call(_read_links_and_addresses)
    assert links == {link["ifname"]: link["ifindex"] for link in shown}
    expected = {
        link["ifindex"]: {
            (link["ifindex"], str(ipaddress.ip_address(a["local"]))) for a in link["addr_info"]
        }
        for link in shown
    }
    assert each == expected
    assert sum(map(len, expected.values())) > 4  # both families, more than one link
    assert every == set().union(*expected.values())
