"""Service addresses made the node's own over rtnetlink, in batches: as addresses of the dummy
interface (lace.ipvs.serviceAddresses `interface`, as kube-proxy) or as `local` routes in the
local routing table (`localRoutes`).

IPVS mode makes every service address local: 10k and more. One pyroute2 request each, each
awaited, took 124 s of a 10k cold sync in the test VM (TCG), and pyroute2's encoding alone is
the cost, not the kernel's work: 10k additions encoded by `IPBatch` took 68 s there, by its
`ifaddrmsg` class 11 s, and a dump of them parsed by `get_addr` 11 s; the kernel carried out
all 10k in 2.8 s. An address request is a fixed layout (`ifaddrmsg` and its address, as
pyroute2 encodes it: tests/unit/test_ipvs_addresses.py compares them byte for byte), so it is
packed here (0.2 s for the 10k in the VM); they are read back as rtnetlink.RtnlChannel reads
them (0.6 s). pyroute2 stays for the interface itself.

The kernel's own cost is an interface's addresses: each added or deleted walks the list of
the interface's addresses (`__inet_insert_ifa`), so N of them cost N² (2.4 s of sys for 10k
in the VM, 9.3 s for 20k). A `local` route, which is what such an address amounts to for
routing, goes into the routing table's trie instead, at a cost that does not grow with the
others. Those routes are lace-proxy's by their protocol number (model.ROUTE_PROTOCOL): read back
by it (`RtnlChannel.local_routes`, the kernel filtering), and deleted by it, so that no other
route for the same address (the kernel's own for an address of the dummy interface, while a
node switches from one way to the other) is ever touched.

A periodic sync needs only the node's own addresses: `links` and `addresses(index)` read
them link by link (the kernel filters a dump by interface), leaving the dummy's thousands
unread.

Requests go `PER_SEND` to a `send` (netlink.send_batch), the last of each asking for the
acknowledgement that is its barrier; the kernel answers the others only if it refuses them,
and each refusal is mapped back by its sequence number to the address it was about.
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Callable, Iterable
from typing import NamedTuple

from lace_proxy.dataplane.netlink import NLM_F_REQUEST, Answer, header, reason, send_batch
from lace_proxy.dataplane.rtnetlink import (
    IFA_ADDRESS,
    IFA_LOCAL,
    RT_TABLE_LOCAL,
    RTA_DST,
    RTA_TABLE,
    RTN_LOCAL,
    RtnlChannel,
)

RTM_NEWADDR = 20
RTM_DELADDR = 21
RTM_NEWROUTE = 24
RTM_DELROUTE = 25
NLM_F_ACK = 0x4
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
RTA_OIF = 4
RT_TABLE_MAIN = 254
RT_SCOPE_HOST = 254
#: The loopback interface's index, the same in every network namespace (LOOPBACK_IFINDEX):
#: the device of every local route (a local route's device must exist and, for IPv6, be up).
LOOPBACK = 1
#: Requests per `send`: as many answers may wait at once (every one refused), within the
#: room the socket is made with; 1,000 IPv6 requests (64 bytes each, address or route) are
#: under netlink.CHUNK.
PER_SEND = 1000
ANSWERS = PER_SEND + 24
#: Refusals that say the address already is as asked: there when added, gone when deleted.
ALREADY = {
    RTM_NEWADDR: {errno.EEXIST},
    RTM_DELADDR: {errno.EADDRNOTAVAIL, errno.ENOENT},
    RTM_NEWROUTE: {errno.EEXIST},
    RTM_DELROUTE: {errno.ESRCH},
}
WHAT = {
    RTM_NEWADDR: "adding {} to the dummy interface",
    RTM_DELADDR: "deleting {} from the dummy interface",
    RTM_NEWROUTE: "adding the local route of {}",
    RTM_DELROUTE: "deleting the local route of {}",
}
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefix length, flags, scope, interface index
_RTMSG = struct.Struct("=BBBBBBBBI")  # family, lengths, tos, table, protocol, scope, type, flags
_ATTR = struct.Struct("=HH")
_U32 = struct.Struct("=I")


class AddressRefusal(NamedTuple):
    """An address the kernel would not add or delete (`errno`; 0: its answer was lost)."""

    command: int  # RTM_NEWADDR, RTM_DELADDR, RTM_NEWROUTE or RTM_DELROUTE
    address: str
    errno: int
    message: str | None = None

    def __str__(self) -> str:
        why = reason(Answer(self.errno, None, self.message))
        return f"{WHAT[self.command].format(self.address)} refused: {why}"


def _family(address: str) -> tuple[int, int, bytes]:
    """An address's family, full prefix length (/32, /128) and bytes."""
    if ":" in address:
        return socket.AF_INET6, 128, socket.inet_pton(socket.AF_INET6, address)
    return socket.AF_INET, 32, socket.inet_pton(socket.AF_INET, address)


def request(command: int, flags: int, index: int, address: str, sequence: int) -> bytes:
    """An RTM_NEWADDR or RTM_DELADDR request for one address of full length (/32, /128),
    as pyroute2 encodes it: IPv4 with the address as IFA_ADDRESS and IFA_LOCAL, IPv6 with
    IFA_ADDRESS alone."""
    family, length, raw = _family(address)
    attr = _ATTR.pack(4 + len(raw), IFA_ADDRESS) + raw
    if family == socket.AF_INET:
        attr += _ATTR.pack(4 + len(raw), IFA_LOCAL) + raw
    body = _IFADDRMSG.pack(family, length, 0, 0, index) + attr
    return header(16 + len(body), command, flags, sequence) + body


def route_request(command: int, flags: int, protocol: int, address: str, sequence: int) -> bytes:
    """An RTM_NEWROUTE or RTM_DELROUTE request for the local route of one address (/32,
    /128): type local, scope host, on lo, of `protocol`, in the local table, as pyroute2
    encodes it (for a table of 255 or more it writes RT_TABLE_MAIN into the header and the
    table into RTA_TABLE, which the kernel reads instead)."""
    family, length, raw = _family(address)
    body = (
        _RTMSG.pack(family, length, 0, 0, RT_TABLE_MAIN, protocol, RT_SCOPE_HOST, RTN_LOCAL, 0)
        + _ATTR.pack(4 + len(raw), RTA_DST)
        + raw
        + _ATTR.pack(8, RTA_TABLE)
        + _U32.pack(RT_TABLE_LOCAL)
        + _ATTR.pack(8, RTA_OIF)
        + _U32.pack(LOOPBACK)
    )
    return header(16 + len(body), command, flags, sequence) + body


#: What encodes one request: (address, flags, sequence) to its bytes.
Encode = Callable[[str, int, int], bytes]


class AddressChannel(RtnlChannel):
    """An rtnetlink socket in the calling thread's network namespace, for service addresses:
    read back as RtnlChannel reads them, added and deleted in batches, as addresses of an
    interface or as local routes."""

    def __init__(self) -> None:
        super().__init__(ANSWERS)

    def add(self, index: int, addresses: Iterable[str]) -> tuple[int, list[AddressRefusal]]:
        """Add addresses to an interface: how many were added (one that is there already
        is not, and is no refusal), and what the kernel refused."""
        flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL
        return self._change(RTM_NEWADDR, addresses, _on(RTM_NEWADDR, flags, index))

    def delete(self, index: int, addresses: Iterable[str]) -> tuple[int, list[AddressRefusal]]:
        """Delete addresses from an interface: how many were deleted (one that is not there
        is not, and is no refusal), and what the kernel refused."""
        return self._change(RTM_DELADDR, addresses, _on(RTM_DELADDR, NLM_F_REQUEST, index))

    def add_routes(
        self, protocol: int, addresses: Iterable[str]
    ) -> tuple[int, list[AddressRefusal]]:
        """Add the local routes of addresses, of `protocol`: how many were added (one that is
        there already is not, and is no refusal), and what the kernel refused. Without
        NLM_F_EXCL: another route for the address (the kernel's, of an address of an
        interface) does not stop this one, which goes first."""
        flags = NLM_F_REQUEST | NLM_F_CREATE
        return self._change(RTM_NEWROUTE, addresses, _routed(RTM_NEWROUTE, flags, protocol))

    def delete_routes(
        self, protocol: int, addresses: Iterable[str]
    ) -> tuple[int, list[AddressRefusal]]:
        """Delete the local routes of addresses of `protocol`, no other route for them: how
        many were deleted (one that is not there is not, and is no refusal), and what the
        kernel refused."""
        return self._change(RTM_DELROUTE, addresses, _routed(RTM_DELROUTE, NLM_F_REQUEST, protocol))

    def _change(
        self, command: int, addresses: Iterable[str], encode: Encode
    ) -> tuple[int, list[AddressRefusal]]:
        ordered = sorted(addresses)
        first = self._sequence(len(ordered))
        buffers = []
        for start in range(0, len(ordered), PER_SEND):
            part = ordered[start : start + PER_SEND]
            sequences = range(first + start, first + start + len(part))
            last = sequences[-1]  # asks for the acknowledgement: the barrier
            data = b"".join(
                encode(address, NLM_F_ACK if s == last else 0, s)
                for s, address in zip(sequences, part, strict=True)
            )
            buffers.append((data, sequences))
        done = len(ordered)
        refusals = []
        for sequence, answer in send_batch(self.sock, buffers):
            done -= 1
            if answer.errno not in ALREADY[command]:
                address = ordered[sequence - first]
                refusals.append(AddressRefusal(command, address, answer.errno, answer.message))
        return done, refusals


def _on(command: int, flags: int, index: int) -> Encode:
    """The requests of one address change on interface `index`."""
    return lambda address, ack, sequence: request(command, flags | ack, index, address, sequence)


def _routed(command: int, flags: int, protocol: int) -> Encode:
    """The requests of one local route change of `protocol`."""
    return lambda address, ack, sequence: route_request(
        command, flags | ack, protocol, address, sequence
    )
