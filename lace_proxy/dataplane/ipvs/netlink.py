"""IPVS over generic netlink, in-process: virtual and real servers programmed in batches and
read back with dumps, through the codec (compiled, or its pure twin).

A `Batch` is encoded whole, then sent as few `send`s as the socket's send buffer allows
(`CHUNK` bytes each); a virtual service's new real servers go in one codec call
(`add_servers`). The kernel carries out every request of a `send` inside that call and
answers only the last one, which asks for an acknowledgement, and any it refused: once the
barrier's answer is read, so is every refusal. Each refusal is mapped back, by its sequence
number, to what the request did (`Change`), so that the log names the virtual or real server
the kernel refused. pyroute2 stays for the rare configuration calls (timeouts).
"""

from __future__ import annotations

import errno as errnos
import os
import struct
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from lace_proxy.dataplane.ipvs.codec import (
    IPVS_CMD_DEL_DEST,
    IPVS_CMD_DEL_SERVICE,
    IPVS_CMD_NEW_DEST,
    IPVS_CMD_NEW_SERVICE,
    IPVS_CMD_SET_DEST,
    IPVS_CMD_SET_SERVICE,
    Requests,
    ServerDump,
    ServiceDump,
    servers_request,
    services_request,
)
from lace_proxy.dataplane.ipvs.model import PROTOCOLS, Target, VirtualServer, address_family
from lace_proxy.dataplane.netlink import (
    CHUNK,
    NETLINK_GENERIC,
    NLM_F_REQUEST,
    NLMSG_ERROR,
    RECEIVE,
    Answer,
    Channel,
    header,
    messages,
    reason,
    refused,
    send_batch,
)

#: Answers one `send` may leave waiting: a refusal per request at most (a CHUNK holds some
#: 780 of the shortest, a real server's deletion), and the acknowledgement.
ANSWERS = 1024
GENL_ID_CTRL = 0x10
CTRL_CMD_GETFAMILY = 3
CTRL_ATTR_FAMILY_ID = 1
CTRL_ATTR_FAMILY_NAME = 2
_SEQUENCE = struct.Struct("=8xI")  # the sequence number of a buffer's first message
_VERBS = {
    IPVS_CMD_NEW_SERVICE: "add",
    IPVS_CMD_SET_SERVICE: "change",
    IPVS_CMD_DEL_SERVICE: "delete",
    IPVS_CMD_NEW_DEST: "add",
    IPVS_CMD_SET_DEST: "change",
    IPVS_CMD_DEL_DEST: "delete",
}


class Change(NamedTuple):
    """What one request asked for: a virtual server, or one of its real servers (`server`)
    with its weight, added, changed or deleted."""

    command: int
    vs: VirtualServer
    server: tuple[str, int] | None = None
    weight: int = 0

    def __str__(self) -> str:
        where = f"{self.vs.protocol} {_host_port(self.vs.address, self.vs.port)}"
        verb = _VERBS.get(self.command, str(self.command))
        if self.server is None:
            return f"{verb} virtual server {where}"
        weight = "" if self.command == IPVS_CMD_DEL_DEST else f" (weight {self.weight})"
        return f"{verb} real server {_host_port(*self.server)}{weight} of {where}"


class Refusal(NamedTuple):
    """A request the kernel refused (`errno`), or whose answer was lost (errno 0)."""

    sequence: int
    change: Change
    errno: int
    message: str | None = None

    def __str__(self) -> str:
        return f"IPVS {self.change} refused: {reason(Answer(self.errno, None, self.message))}"


def _host_port(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


class _Servers(NamedTuple):
    """What the requests of one `add_servers` asked for: a request per server, in order."""

    command: int
    vs: VirtualServer
    servers: tuple[tuple[str, int], ...]
    weight: int


#: What one request asked for (command, vs, server, weight), or a run of them (`_Servers`).
_Record = tuple[int, VirtualServer, tuple[str, int] | None, int] | _Servers


class Batch:
    """IPVS requests to send together, remembered (cheaply) for what they asked: a record
    per call, found by its first sequence number (a bulk call's one record stands for all
    its requests: no Python object per real server)."""

    def __init__(self, family: int, first: int) -> None:
        self.first = first
        self._requests = Requests(family, first)
        self._firsts: list[int] = []  # each record's first sequence number, ascending
        self._records: list[_Record] = []

    def add_service(self, vs: VirtualServer, target: Target) -> int:
        return self._service(IPVS_CMD_NEW_SERVICE, vs, target)

    def change_service(self, vs: VirtualServer, target: Target) -> int:
        return self._service(IPVS_CMD_SET_SERVICE, vs, target)

    def delete_service(self, vs: VirtualServer) -> int:
        return self._service(IPVS_CMD_DEL_SERVICE, vs, None)

    def _service(self, command: int, vs: VirtualServer, target: Target | None) -> int:
        scheduler, timeout = (target.scheduler, target.persistence) if target else ("", 0)
        protocol = PROTOCOLS[vs.protocol]
        sequence = self._requests.service(
            command, protocol, vs.address, vs.port, scheduler, timeout
        )
        self._firsts.append(sequence)
        self._records.append((command, vs, None, 0))
        return sequence

    def add_server(self, vs: VirtualServer, server: tuple[str, int], weight: int) -> int:
        return self._server(IPVS_CMD_NEW_DEST, vs, server, weight)

    def add_servers(
        self, vs: VirtualServer, servers: Iterable[tuple[str, int]], weight: int
    ) -> list[tuple[str, int]]:
        """`add_server` for each of `servers`, in one codec call (a cold sync adds 127k at
        10k services); those IPVS refuses as real servers (multicast, unspecified, IPv6
        link-local) are left out and returned, in order."""
        encoded = tuple(servers)
        first, left = self._requests.servers(
            IPVS_CMD_NEW_DEST, PROTOCOLS[vs.protocol], vs.address, vs.port, encoded, weight
        )
        if left:
            refused = set(left)  # a server's verdict is its address's: equal ones share it
            encoded = tuple(server for server in encoded if server not in refused)
        if encoded:
            self._firsts.append(first)
            self._records.append(_Servers(IPVS_CMD_NEW_DEST, vs, encoded, weight))
        return left

    def change_server(self, vs: VirtualServer, server: tuple[str, int], weight: int) -> int:
        return self._server(IPVS_CMD_SET_DEST, vs, server, weight)

    def delete_server(self, vs: VirtualServer, server: tuple[str, int]) -> int:
        return self._server(IPVS_CMD_DEL_DEST, vs, server, 0)

    def _server(self, command: int, vs: VirtualServer, server: tuple[str, int], weight: int) -> int:
        protocol = PROTOCOLS[vs.protocol]
        sequence = self._requests.server(
            command, protocol, vs.address, vs.port, server[0], server[1], weight
        )
        self._firsts.append(sequence)
        self._records.append((command, vs, server, weight))
        return sequence

    def __len__(self) -> int:
        return len(self._requests)

    def buffers(self, limit: int = CHUNK) -> list[tuple[bytes, range]]:
        """The requests in buffers of at most `limit` bytes, each with its sequence numbers
        (the last asks for an acknowledgement)."""
        out = []
        start = self.first
        for data, last in self._requests.chunks(limit):
            out.append((data, range(start, last + 1)))
            start = last + 1
        return out

    def change(self, sequence: int) -> Change:
        """What the request numbered `sequence` asked for (IndexError: none of this batch)."""
        if not self.first <= sequence < self.first + len(self):
            raise IndexError(f"request {sequence} is not in this batch")
        index = bisect_right(self._firsts, sequence) - 1
        record = self._records[index]
        if isinstance(record, _Servers):
            server = record.servers[sequence - self._firsts[index]]
            return Change(record.command, record.vs, server, record.weight)
        return Change(*record)

    def refusals(self, replies: dict[int, Answer], sequences: range) -> list[Refusal]:
        """The requests of one buffer the kernel refused, read from its answers; if the
        barrier's answer is missing (lost: the socket had no room), every request of the
        buffer without an answer counts as refused, its fate unknown."""
        return [
            Refusal(sequence, self.change(sequence), answer.errno, answer.message)
            for sequence, answer in refused(replies, sequences)
        ]


class IpvsChannel(Channel):
    """A generic netlink socket for IPVS in the calling thread's network namespace, with
    the IPVS family's id (resolved once, when it is made: OSError ENOENT if this kernel has
    no IPVS)."""

    def __init__(self) -> None:
        super().__init__(NETLINK_GENERIC, ANSWERS)
        try:
            self.family = self._family("IPVS")
        except BaseException:
            self.close()
            raise

    def _family(self, name: str) -> int:
        """A generic netlink family's id (CTRL_CMD_GETFAMILY)."""
        raw = name.encode() + b"\0"
        attr = struct.pack("=HH", 4 + len(raw), CTRL_ATTR_FAMILY_NAME) + raw
        attr += b"\0" * (-len(attr) % 4)
        sequence = self._sequence()
        self.sock.send(
            header(20 + len(attr), GENL_ID_CTRL, NLM_F_REQUEST, sequence)
            + struct.pack("=BBH", CTRL_CMD_GETFAMILY, 1, 0)
            + attr
        )
        for kind, answered, payload in messages(self.sock.receive(RECEIVE)):
            if answered != sequence:
                continue
            if kind == NLMSG_ERROR:
                code = -struct.unpack_from("=i", payload)[0]
                raise OSError(code, f"generic netlink family {name}: {os.strerror(code)}")
            at = 4
            while at + 4 <= len(payload):
                length, attr_type = struct.unpack_from("=HH", payload, at)
                if length < 4:
                    break
                if attr_type & 0x3FFF == CTRL_ATTR_FAMILY_ID:
                    return int(struct.unpack_from("=H", payload, at + 4)[0])
                at += (length + 3) & ~3
        raise OSError(errnos.EPROTO, f"generic netlink family {name}: no id in the answer")

    def batch(self) -> Batch:
        return Batch(self.family, self._sequence(0))

    def send(self, batch: Batch) -> list[Refusal]:
        """Send a batch, a buffer at a time; the requests the kernel refused. A buffer the
        socket refuses (OSError) counts as refused whole, and the rest is still sent."""
        self._sequence(len(batch))
        return [
            Refusal(sequence, batch.change(sequence), answer.errno, answer.message)
            for sequence, answer in send_batch(self.sock, batch.buffers())
        ]

    def whole(self, batch: Batch) -> tuple[bytes, range]:
        """A batch as one buffer, for a caller that sends it itself (`send_together`); the
        socket's send buffer made large enough and earlier answers read away. Its refusals:
        `batch.refusals(channel.sock.replies(), sequences)` once it is sent."""
        self._sequence(len(batch))
        buffers = batch.buffers(1 << 62)
        if not buffers:
            return b"", range(0)
        [(data, sequences)] = buffers
        self.sock.send_buffer(len(data))
        self.sock.replies()
        return data, sequences

    def services(self) -> list[tuple[int, str, int, int, str, int, int]]:
        """Every virtual service (protocol, address, port, fwmark, scheduler, flags,
        persistence timeout), from one dump."""
        parser = ServiceDump()
        sequence = self._sequence()
        self.sock.replies()
        self._dump(sequence, services_request(self.family, sequence), parser)
        return parser.result()

    def servers(self, vs: VirtualServer) -> list[tuple[str, int, int, int, int, int]]:
        """A virtual service's real servers (address, port, forwarding method, weight,
        active and inactive connections), from one dump; none if there is no such service."""
        return self.servers_of([vs])[0]

    def servers_of(
        self, services: Sequence[VirtualServer]
    ) -> list[list[tuple[str, int, int, int, int, int]]]:
        """`servers` of each of `services`, in order, one dump at a time: the kernel ends a
        dump only once its first answer buffer is read (the end comes in a buffer of its own)
        and refuses another on the socket until then (EBUSY), so asking for many in one
        `send` made a 10k resync's read-back 4x slower in the test VM."""
        self.sock.replies()  # answers left from before, read away once (and lost ones noted)
        out = []
        for vs in services:
            sequence = self._sequence()
            parser = ServerDump(address_family(vs.address))
            protocol = PROTOCOLS[vs.protocol]
            request = servers_request(self.family, sequence, protocol, vs.address, vs.port)
            self._dump(sequence, request, parser)
            out.append(parser.result())
        return out

    def _dump(self, sequence: int, request: bytes, parser: ServiceDump | ServerDump) -> None:
        """Send a dump request and feed its answers to `parser` until the dump ends. Answers
        to other requests are skipped by sequence number (each of the kernel's answer buffers
        holds one request's answers): reading them away before each of a read-back's dumps
        cost a `recv` per virtual service."""
        self.sock.send(request)
        while True:
            data = self.sock.receive(RECEIVE)
            if (
                len(data) >= _SEQUENCE.size
                and _SEQUENCE.unpack_from(data)[0] == sequence
                and parser.feed(data)
            ):
                return
