"""The dummy interface's addresses over rtnetlink, in batches.

IPVS mode puts every service address on the dummy interface: 10k and more. One pyroute2
request each, each awaited, took 124 s of a 10k cold sync in the test VM (TCG), and pyroute2's
encoding alone is the cost, not the kernel's work: 10k additions encoded by `IPBatch` took
68 s there, by its `ifaddrmsg` class 11 s, and a dump of them parsed by `get_addr` 11 s;
the kernel carried out all 10k in 2.8 s. An address request is a fixed layout (`ifaddrmsg`
and its address, as pyroute2 encodes it: tests/unit/test_ipvs_addresses.py compares them
byte for byte), so it is packed here (0.2 s for the 10k in the VM); they are read back as
rtnetlink.RtnlChannel reads them (0.6 s). pyroute2 stays for the interface itself.

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
from collections.abc import Iterable
from typing import NamedTuple

from lace_proxy.dataplane.netlink import NLM_F_REQUEST, Answer, header, reason, send_batch
from lace_proxy.dataplane.rtnetlink import IFA_ADDRESS, IFA_LOCAL, RtnlChannel

RTM_NEWADDR = 20
RTM_DELADDR = 21
NLM_F_ACK = 0x4
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
#: Requests per `send`: as many answers may wait at once (every one refused), within the
#: room the socket is made with; 1,000 IPv6 requests (64 bytes each) are under netlink.CHUNK.
PER_SEND = 1000
ANSWERS = PER_SEND + 24
#: Refusals that say the address already is as asked: there when added, gone when deleted.
ALREADY = {RTM_NEWADDR: {errno.EEXIST}, RTM_DELADDR: {errno.EADDRNOTAVAIL, errno.ENOENT}}
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefix length, flags, scope, interface index
_ATTR = struct.Struct("=HH")


class AddressRefusal(NamedTuple):
    """An address the kernel would not add or delete (`errno`; 0: its answer was lost)."""

    command: int  # RTM_NEWADDR or RTM_DELADDR
    address: str
    errno: int
    message: str | None = None

    def __str__(self) -> str:
        what = "adding {} to" if self.command == RTM_NEWADDR else "deleting {} from"
        why = reason(Answer(self.errno, None, self.message))
        return f"{what.format(self.address)} the dummy interface refused: {why}"


def request(command: int, flags: int, index: int, address: str, sequence: int) -> bytes:
    """An RTM_NEWADDR or RTM_DELADDR request for one address of full length (/32, /128),
    as pyroute2 encodes it: IPv4 with the address as IFA_ADDRESS and IFA_LOCAL, IPv6 with
    IFA_ADDRESS alone."""
    v6 = ":" in address
    raw = socket.inet_pton(socket.AF_INET6 if v6 else socket.AF_INET, address)
    family, length = (socket.AF_INET6, 128) if v6 else (socket.AF_INET, 32)
    attr = _ATTR.pack(4 + len(raw), IFA_ADDRESS) + raw
    if not v6:
        attr += _ATTR.pack(4 + len(raw), IFA_LOCAL) + raw
    body = _IFADDRMSG.pack(family, length, 0, 0, index) + attr
    return header(16 + len(body), command, flags, sequence) + body


class AddressChannel(RtnlChannel):
    """An rtnetlink socket in the calling thread's network namespace, for addresses: read
    back as RtnlChannel reads them, added and deleted in batches."""

    def __init__(self) -> None:
        super().__init__(ANSWERS)

    def add(self, index: int, addresses: Iterable[str]) -> tuple[int, list[AddressRefusal]]:
        """Add addresses to an interface: how many were added (one that is there already
        is not, and is no refusal), and what the kernel refused."""
        flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL
        return self._change(RTM_NEWADDR, flags, index, addresses)

    def delete(self, index: int, addresses: Iterable[str]) -> tuple[int, list[AddressRefusal]]:
        """Delete addresses from an interface: how many were deleted (one that is not there
        is not, and is no refusal), and what the kernel refused."""
        return self._change(RTM_DELADDR, NLM_F_REQUEST, index, addresses)

    def _change(
        self, command: int, flags: int, index: int, addresses: Iterable[str]
    ) -> tuple[int, list[AddressRefusal]]:
        ordered = sorted(addresses)
        first = self._sequence(len(ordered))
        buffers = []
        for start in range(0, len(ordered), PER_SEND):
            part = ordered[start : start + PER_SEND]
            sequences = range(first + start, first + start + len(part))
            last = sequences[-1]  # asks for the acknowledgement: the barrier
            data = b"".join(
                request(command, flags | (NLM_F_ACK if s == last else 0), index, address, s)
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
