"""Netlink requests lace-proxy encodes itself, held byte for byte to pyroute2's encoding of the
same request (what the kernel does with them: tests/netns/test_netlink.py)."""

from __future__ import annotations

import ipaddress
import random
import socket

from pyroute2.netlink import NLM_F_REQUEST
from pyroute2.netlink.nfnetlink import NFNL_SUBSYS_CTNETLINK
from pyroute2.netlink.nfnetlink.nfctsocket import IPCTNL_MSG_CT_DELETE, NFCTAttrTuple, nfct_msg

from lace_proxy.dataplane import netlink
from lace_proxy.dataplane.conntrack import UdpFlow, delete_request, delete_requests


def _random_flow(rng: random.Random) -> UdpFlow:
    family = rng.choice((4, 6))
    kind = ipaddress.IPv4Address if family == 4 else ipaddress.IPv6Address

    def address() -> str:
        return str(kind(rng.getrandbits(32 if family == 4 else 128)))

    return UdpFlow(
        family,
        address(),
        rng.randrange(65536),
        address(),
        rng.randrange(65536),
        address(),
        rng.randrange(65536),
        address(),
        rng.randrange(65536),
    )


def _pyroute2(flow: UdpFlow, sequence: int) -> bytes:
    family = socket.AF_INET6 if flow.family == 6 else socket.AF_INET
    origin = NFCTAttrTuple(
        family=family,
        saddr=flow.client,
        daddr=flow.frontend,
        proto=socket.IPPROTO_UDP,
        sport=flow.client_port,
        dport=flow.frontend_port,
    )
    msg = nfct_msg.create_from(tuple_orig=origin)
    msg["header"]["type"] = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE
    msg["header"]["flags"] = NLM_F_REQUEST
    msg["header"]["sequence_number"] = sequence
    msg["nfgen_family"] = family
    msg.encode()
    return bytes(msg.data)


def test_a_conntrack_deletion_is_encoded_as_pyroute2_encodes_it() -> None:
    rng = random.Random(17)
    for _ in range(300):
        flow, sequence = _random_flow(rng), rng.randrange(1, 1 << 32)
        assert delete_request(flow, sequence) == _pyroute2(flow, sequence), flow


def test_deletions_are_numbered_in_order_and_joined_into_sendable_buffers() -> None:
    rng = random.Random(5)
    flows = [_random_flow(rng) for _ in range(3000)]
    buffers = delete_requests(flows, 41)
    assert len(buffers) > 1
    assert all(len(b) <= netlink.CHUNK for b in buffers)
    read = [m for b in buffers for m in netlink.messages(b)]
    assert [sequence for _, sequence, _ in read] == list(range(41, 41 + len(flows)))
    assert b"".join(buffers) == b"".join(delete_request(f, 41 + i) for i, f in enumerate(flows))


def test_chunks_keep_order_and_never_split_a_request() -> None:
    requests = [bytes([i]) * size for i, size in enumerate((10, 30, 25, 40, 1, 60))]
    out = netlink.chunks(requests, limit=60)
    assert out == [requests[0] + requests[1], requests[2], requests[3] + requests[4], requests[5]]
    assert netlink.chunks([], limit=60) == []
