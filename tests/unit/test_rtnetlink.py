"""RtnlChannel's dumps: what it asks the kernel to filter, and how it reads the answers.

Against a stand-in socket that answers each dump with messages pyroute2 encodes, as the
kernel would; the real kernel's answers are tests/netns/test_netlink.py's and
test_egress.py's.
"""

from __future__ import annotations

import errno
import socket
import struct

import pytest
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from lace_proxy.dataplane import rtnetlink
from lace_proxy.dataplane.netlink import Answer, header
from lace_proxy.dataplane.rtnetlink import InterfaceAddress, Link, RtnlChannel

NLMSG = struct.Struct("=IHHII")
NLMSG_DONE = 3


class DumpingKernel:
    """Answers a dump request with `answers(request)` (messages pyroute2 encoded), a
    stale answer of an earlier sequence number first, then NLMSG_DONE carrying `end`."""

    def __init__(self, answers: list[bytes], end: int = 0) -> None:
        self.answers = answers
        self.end = end
        self.requests: list[bytes] = []
        self._waiting: list[bytes] = []

    def replies(self) -> dict[int, Answer]:
        return {}

    def send(self, data: bytes) -> None:
        self.requests.append(data)
        sequence = NLMSG.unpack_from(data)[3]
        stale = [_sequenced(self.answers[0], sequence - 1)] if self.answers else []
        done = header(20, NLMSG_DONE, 2, sequence) + struct.pack("=i", -self.end)
        self._waiting = [*stale, *(_sequenced(a, sequence) for a in self.answers), done]

    def receive(self, size: int) -> bytes:
        out, self._waiting = b"".join(self._waiting[:2]), self._waiting[2:]
        return out


def _sequenced(message: bytes, sequence: int) -> bytes:
    return message[:8] + struct.pack("=I", sequence) + message[12:]


def _channel(kernel: DumpingKernel) -> RtnlChannel:
    channel = object.__new__(RtnlChannel)
    channel.sock = kernel  # type: ignore[assignment]
    channel._next = 5
    return channel


def _encoded(msg: ifaddrmsg | ifinfmsg | rtmsg, kind: int) -> bytes:
    msg["header"]["type"] = kind
    msg.encode()
    return bytes(msg.data)


def _address(family: int, index: int, attrs: list[tuple[str, str]], **fields: int) -> bytes:
    msg = ifaddrmsg()
    msg["family"], msg["index"] = family, index
    msg["prefixlen"] = fields.get("prefixlen", 24)
    msg["flags"], msg["scope"] = fields.get("flags", 0), fields.get("scope", 0)
    msg["attrs"] = [*attrs, ("IFA_LABEL", "eth0"), ("IFA_FLAGS", 0x80)]
    return _encoded(msg, 20)


ADDRESSES = [
    # A point-to-point link's IFA_ADDRESS is the peer's: the node's own is IFA_LOCAL.
    _address(socket.AF_INET, 3, [("IFA_ADDRESS", "10.0.0.2"), ("IFA_LOCAL", "10.0.0.1")]),
    _address(socket.AF_INET6, 9, [("IFA_ADDRESS", "fd00:0:0::0:1")], prefixlen=64, scope=253),
    _address(socket.AF_INET, 4, []),  # no address at all: left out
    _address(socket.AF_INET, 3, [("IFA_LOCAL", "10.0.0.9")], flags=1),  # secondary
]


def test_addresses_are_read_as_the_node_holds_them() -> None:
    kernel = DumpingKernel(ADDRESSES)
    assert _channel(kernel).addresses(3) == [(3, "10.0.0.1"), (9, "fd00::1"), (3, "10.0.0.9")]
    assert struct.unpack_from("=BBBBI", kernel.requests[0], 16) == (0, 0, 0, 0, 3)
    assert NLMSG.unpack_from(kernel.requests[0])[2] == 0x301  # a dump request
    assert _channel(kernel).interface_addresses(3) == [
        InterfaceAddress("10.0.0.1", 24, 0, 0),
        InterfaceAddress("fd00::1", 64, 0, 253),
        InterfaceAddress("10.0.0.9", 24, 1, 0),
    ]


def test_a_dump_filtered_by_a_gone_interface_or_table_is_empty_other_errors_raise() -> None:
    assert _channel(DumpingKernel(ADDRESSES, errno.ENODEV)).addresses(77) == []
    assert _channel(DumpingKernel([], errno.ENOENT)).routes(socket.AF_INET, 1000) == []
    with pytest.raises(OSError, match="dumping routes: EPERM"):
        _channel(DumpingKernel([], errno.EPERM)).routes(socket.AF_INET, 1000)
    with pytest.raises(OSError, match="dumping addresses: ENOENT"):
        _channel(DumpingKernel([], errno.ENOENT)).addresses(3)


def _link(index: int, name: str, mtu: int | None) -> bytes:
    msg = ifinfmsg()
    msg["index"] = index
    msg["attrs"] = [("IFLA_IFNAME", name), *([("IFLA_MTU", mtu)] if mtu is not None else [])]
    return _encoded(msg, 16)


def test_links_are_read_with_their_names_and_mtus() -> None:
    kernel = DumpingKernel(
        [_link(1, "lo", 65536), _link(7, "kube-ipvs0", 1500), _link(9, "x", None)]
    )
    assert _channel(kernel).links() == [
        Link(1, "lo", 65536),
        Link(7, "kube-ipvs0", 1500),
        Link(9, "x", 0),
    ]


def _route(family: int, table: int, dst: str, length: int, **attrs: object) -> bytes:
    msg = rtmsg()
    msg["family"], msg["dst_len"], msg["type"] = family, length, 1
    msg["table"] = table if table < 256 else 252
    msg["attrs"] = [("RTA_TABLE", table), ("RTA_DST", dst), *attrs.items()]
    return _encoded(msg, 24)


def test_routes_ask_the_kernel_for_one_table_and_come_back_as_pyroute2_reads_them() -> None:
    answers = [
        _route(socket.AF_INET6, 1000, "fd00:96::", 108, RTA_OIF=4, RTA_PREFSRC="fd00::1"),
        # With IPv6 off at boot, the kernel answers an IPv6 dump with IPv4 routes.
        _route(socket.AF_INET, 1000, "10.96.0.0", 12, RTA_OIF=4),
    ]
    kernel = DumpingKernel(answers)
    (route,) = _channel(kernel).routes(socket.AF_INET6, 1000)
    request = kernel.requests[0]
    assert struct.unpack_from("=BBBBBBBBI", request, 16) == (socket.AF_INET6, *[0] * 8)
    assert struct.unpack_from("=HHI", request, 28) == (8, rtnetlink.RTA_TABLE, 1000)
    assert (route.get("table"), route.get("dst"), route["dst_len"]) == (1000, "fd00:96::", 108)
    assert (route.get("oif"), route.get("prefsrc"), route["type"]) == (4, "fd00::1", 1)


def _local_route(family: int, dst: str | None, length: int) -> bytes:
    msg = rtmsg()
    msg["family"], msg["dst_len"], msg["table"] = family, length, 255
    msg["proto"], msg["scope"], msg["type"] = 145, 254, rtnetlink.RTN_LOCAL
    msg["attrs"] = [("RTA_TABLE", 255), *([("RTA_DST", dst)] if dst else []), ("RTA_OIF", 1)]
    return _encoded(msg, 24)


def test_local_routes_ask_for_one_protocols_local_routes_of_the_local_table() -> None:
    """Both families, the kernel filtering each dump by table, protocol and type (a strict
    dump's filters are the header's: scope and lengths must be 0); the destinations read by
    their fixed layout."""
    answers = [
        _local_route(socket.AF_INET, "10.96.0.1", 32),
        _local_route(socket.AF_INET6, "fd00:96:0::a", 128),
        _local_route(socket.AF_INET, None, 0),  # no destination: left out
    ]
    kernel = DumpingKernel(answers)
    assert _channel(kernel).local_routes(145) == {"10.96.0.1", "fd00:96::a"}
    families = [socket.AF_INET, socket.AF_INET6]
    for request, family in zip(kernel.requests, families, strict=True):
        assert struct.unpack_from("=BBBBBBBBI", request, 16) == (
            family,
            *(0, 0, 0),
            rtnetlink.RT_TABLE_LOCAL,
            145,
            0,
            rtnetlink.RTN_LOCAL,
            0,
        )
        assert len(request) == 28 and NLMSG.unpack_from(request)[1:3] == (26, 0x301)
