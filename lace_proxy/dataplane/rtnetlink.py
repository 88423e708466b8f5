"""The node's links, addresses and routes read over rtnetlink, the kernel filtering each dump
(NETLINK_GET_STRICT_CHK): routes by table, addresses by interface.

IPVS mode puts every service address on its dummy interface, 10k and more, each with a route
in the local table (or, with lace.ipvs.serviceAddresses localRoutes, only that route).
pyroute2 reads a dump whole and filters it in Python: with 10k such addresses, one address
dump took 0.85 s on the CI machine and a dump of one table's routes 0.6-0.7 s (the local
table's 10k routes parsed to be thrown away). The policy routes paid that at every periodic
sync, the egress SNAT at every burst of route events (each address the dummy gains is one).
Here the kernel leaves out what is not asked for, an address is parsed by its fixed layout
(10k in 0.04 s) and the few routes left are decoded by pyroute2's own message class; the
local routes of service addresses, which are many, are read by their fixed layout too
(`local_routes`). pyroute2 makes every change but the service addresses' (ipvs/addresses.py
packs those, addresses and routes, in batches).
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
from collections.abc import Iterator
from typing import NamedTuple

from pyroute2.netlink.rtnl.rtmsg import rtmsg

from lace_proxy.dataplane.netlink import (
    NLM_F_DUMP,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NLMSG_ERROR,
    RECEIVE,
    Answer,
    Channel,
    attributes,
    header,
    messages,
    reason,
)

RTM_GETLINK = 18
RTM_GETADDR = 22
RTM_GETROUTE = 26
IFA_ADDRESS = 1
IFA_LOCAL = 2
IFLA_IFNAME = 3
IFLA_MTU = 4
RTA_DST = 1
RTA_TABLE = 15
RT_TABLE_LOCAL = 255
RTN_LOCAL = 2
#: Dump ends that mean "nothing": the interface filtered by is gone (addresses), the table
#: filtered by does not exist (routes).
EMPTY = {RTM_GETADDR: errno.ENODEV, RTM_GETROUTE: errno.ENOENT}
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefix length, flags, scope, interface index
_IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change mask
_RTMSG = struct.Struct("=BBBBBBBBI")  # family, lengths, tos, table, protocol, scope, type, flags
_ATTR = struct.Struct("=HH")
_U32 = struct.Struct("=I")
WHAT = {RTM_GETLINK: "interfaces", RTM_GETADDR: "addresses", RTM_GETROUTE: "routes"}


class Link(NamedTuple):
    """An interface: its index, name and MTU."""

    ifindex: int
    name: str
    mtu: int


class InterfaceAddress(NamedTuple):
    """An address of an interface as ifaddrmsg carries it (flags: IFA_F_*)."""

    address: str
    prefixlen: int
    flags: int
    scope: int


def _address(payload: bytes) -> str | None:
    """The address of one RTM_NEWADDR: IFA_LOCAL, the node's own end of a point-to-point
    link, else IFA_ADDRESS (IPv6 sends only that)."""
    local = address = None
    for kind, value in attributes(payload, _IFADDRMSG.size):
        if kind == IFA_LOCAL:
            local = value
        elif kind == IFA_ADDRESS:
            address = value
    raw = local or address
    return None if raw is None else _text(raw)


def _text(raw: bytes) -> str:
    """An address's text as `ipaddress` writes it, from its 4 or 16 bytes."""
    if len(raw) == 4:  # inet_ntop's form of IPv4 is ipaddress's, at a fraction of its cost
        return socket.inet_ntop(socket.AF_INET, raw)
    return str(ipaddress.ip_address(raw))


class RtnlChannel(Channel):
    """An rtnetlink socket of the calling thread's network namespace (or `netns`'s) whose
    dumps the kernel filters."""

    def __init__(self, answers: int = 0, *, netns: str | None = None) -> None:
        super().__init__(socket.NETLINK_ROUTE, answers, strict=True, netns=netns)

    def links(self) -> list[Link]:
        """Every interface of the namespace, from one dump."""
        out: list[Link] = []
        for payload in self._dump(RTM_GETLINK, _IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)):
            name, mtu = "", 0
            for kind, value in attributes(payload, _IFINFOMSG.size):
                if kind == IFLA_IFNAME:
                    name = value.rstrip(b"\0").decode()
                elif kind == IFLA_MTU:
                    mtu = _U32.unpack_from(value)[0]
            out.append(Link(_IFINFOMSG.unpack_from(payload)[2], name, mtu))
        return out

    def addresses(self, index: int = 0) -> list[tuple[int, str]]:
        """Every address of the namespace with its interface's index, from one dump; with
        `index`, that interface's alone (none if it is gone)."""
        return [(fields[4], address) for fields, address in self._addresses(index)]

    def interface_addresses(self, index: int) -> list[InterfaceAddress]:
        """One interface's addresses with their prefix lengths, flags and scopes (none if
        the interface is gone)."""
        return [InterfaceAddress(a, f[1], f[2], f[3]) for f, a in self._addresses(index)]

    def _addresses(self, index: int) -> Iterator[tuple[tuple[int, ...], str]]:
        """Each address of one dump (`index` 0: every interface's) with its ifaddrmsg's
        fields (family, prefix length, flags, scope, interface index)."""
        for payload in self._dump(RTM_GETADDR, _IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, index)):
            if (address := _address(payload)) is not None:
                yield _IFADDRMSG.unpack_from(payload), address

    def routes(self, family: int, table: int) -> list[rtmsg]:
        """The routes of one table and family (none if the table does not exist), decoded
        by pyroute2 as its own dumps are."""
        body = _RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0) + _ATTR.pack(8, RTA_TABLE)
        out = []
        for payload in self._dump(RTM_GETROUTE, body + _U32.pack(table)):
            if payload[0] != family:  # IPv6 off (ipv6.disable=1): IPv4 answers
                continue
            msg = rtmsg(header(16 + len(payload), RTM_GETROUTE - 2, 0, 0) + payload)
            msg.decode()
            out.append(msg)
        return out

    def local_routes(self, protocol: int) -> set[str]:
        """The destinations of the `local` routes of `protocol` in the local table, both
        families (the kernel filters the dumps by table, protocol and type): the service
        addresses IPVS mode made local so (ipvs/addresses.py), each a /32 or /128."""
        out: set[str] = set()
        for family in (socket.AF_INET, socket.AF_INET6):
            body = _RTMSG.pack(family, 0, 0, 0, RT_TABLE_LOCAL, protocol, 0, RTN_LOCAL, 0)
            for payload in self._dump(RTM_GETROUTE, body):
                if payload[0] != family:  # IPv6 off (ipv6.disable=1): IPv4 answers
                    continue
                dst = next((v for k, v in attributes(payload, _RTMSG.size) if k == RTA_DST), None)
                if dst is not None:
                    out.add(_text(dst))
        return out

    def _dump(self, command: int, body: bytes) -> list[bytes]:
        """The payloads a dump answers (RTM_NEW* to RTM_GET*)."""
        sequence = self._sequence()
        self.sock.replies()
        self.sock.send(header(16 + len(body), command, NLM_F_REQUEST | NLM_F_DUMP, sequence) + body)
        out: list[bytes] = []
        while True:
            for kind, answered, payload in messages(self.sock.receive(RECEIVE)):
                if answered != sequence:
                    continue
                if kind == command - 2:
                    out.append(payload)
                    continue
                if kind not in (NLMSG_DONE, NLMSG_ERROR):
                    continue
                code = -struct.unpack_from("=i", payload)[0] if len(payload) >= 4 else 0
                if code == 0:
                    return out
                if code == EMPTY.get(command):
                    return []
                raise OSError(code, f"dumping {WHAT[command]}: {reason(Answer(code))}")
