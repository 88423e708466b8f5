"""IPVS requests and dumps as generic netlink messages, and back: the pure-Python twin.

The compiled twin (`ext/ipvscodec.pyx`, `_ccodec`) has the same API and encodes the same
bytes (tests/unit/test_ipvscodec.py holds them equal); `codec.py` picks one as the nf_tables
codec's twin is picked. pyroute2 built one message at a time through its request filters and
generic attribute encoder: 97% of a cold IPVS sync's CPU.

- `Requests` encodes virtual-server and real-server commands (IPVS_CMD_NEW/SET/DEL_SERVICE,
  NEW/SET/DEL_DEST) one after another, numbered from a first sequence number, and cuts them
  into buffers for `send`s, the last request of each asking for an acknowledgement: the
  kernel handles every request of a `send` and answers only that one, or an error.
  `servers` encodes a virtual service's real servers in one call (its key encoded once), and
  leaves out those IPVS refuses as real servers (`_unicast`): a cold sync plans 127k of them
  at 10k services, which one call each made Python-bound.
- `services_request` and `servers_request` ask for the dumps; `ServiceDump` and `ServerDump`
  read their answers into tuples of plain values.

The attributes are those ipvsadm and pyroute2 send: a service's family, protocol, address and
port name it (a real server's commands carry that key); a new or changed one adds its
scheduler, flags (persistence) with a full mask, persistence timeout and netmask (IPv4: all
ones; IPv6: the prefix length 128, in host order, as the kernel reads it). A real server is
its address, port and family; a new or changed one adds NAT forwarding, weight and zero
connection thresholds. Nested attributes go without NLA_F_NESTED, as both send them.
"""

from __future__ import annotations

import ipaddress
import os
import struct
from collections.abc import Iterable
from typing import Any

IMPLEMENTATION = "pure"

GENL_VERSION = 1
IPVS_CMD_NEW_SERVICE = 1
IPVS_CMD_SET_SERVICE = 2
IPVS_CMD_DEL_SERVICE = 3
IPVS_CMD_GET_SERVICE = 4
IPVS_CMD_NEW_DEST = 5
IPVS_CMD_SET_DEST = 6
IPVS_CMD_DEL_DEST = 7
IPVS_CMD_GET_DEST = 8
IP_VS_SVC_F_PERSISTENT = 0x0001
IP_VS_CONN_F_MASQ = 0
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLMSG_MIN_TYPE = 0x10
AF_INET = 2
AF_INET6 = 10

_NLMSG = struct.Struct("=IHHII")
_GENL = struct.Struct("=BBH")
_NLA = struct.Struct("=HH")
_U16 = struct.Struct("=H")
_U32 = struct.Struct("=I")
_BE16 = struct.Struct(">H")
_FLAGS = struct.Struct("=II")
#: IPVS_CMD_ATTR_*, IPVS_SVC_ATTR_* and IPVS_DEST_ATTR_* numbers used here.
_CMD_SERVICE, _CMD_DEST = 1, 2
_SVC_AF, _SVC_PROTOCOL, _SVC_ADDR, _SVC_PORT, _SVC_FWMARK = 1, 2, 3, 4, 5
_SVC_SCHED, _SVC_FLAGS, _SVC_TIMEOUT, _SVC_NETMASK = 6, 7, 8, 9
_DEST_ADDR, _DEST_PORT, _DEST_FWD, _DEST_WEIGHT, _DEST_UTHRESH, _DEST_LTHRESH = 1, 2, 3, 4, 5, 6
_DEST_ACTIVE, _DEST_INACTIVE, _DEST_FAMILY = 7, 8, 11
_SERVICE_COMMANDS = (IPVS_CMD_NEW_SERVICE, IPVS_CMD_SET_SERVICE, IPVS_CMD_DEL_SERVICE)
_SERVER_COMMANDS = (IPVS_CMD_NEW_DEST, IPVS_CMD_SET_DEST, IPVS_CMD_DEL_DEST)


class CodecError(ValueError):
    """A request the codec cannot encode, or an answer it cannot read."""


def _attr(kind: int, payload: bytes) -> bytes:
    return _NLA.pack(4 + len(payload), kind) + payload + b"\0" * (-len(payload) % 4)


def _check(name: str, value: int, limit: int) -> int:
    if type(value) is not int or not 0 <= value <= limit:
        raise CodecError(f"{name} {value!r} is out of range")
    return value


def _packed(address: str) -> tuple[int, bytes]:
    """An address's family and bytes."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError as error:  # ipaddress's: not the codec's CodecError
        raise CodecError(str(error)) from None
    return (AF_INET if ip.version == 4 else AF_INET6), ip.packed


def _unicast(raw: bytes) -> bool:
    """Whether IPVS takes an address (its bytes) as a real server: not IPv4 multicast
    (224-239.x) or 0.0.0.0, not IPv6 multicast (ff00::/8), :: or link-local (fe80::/10)
    (tests/unit/test_ipvs_netlink.py holds it to ipaddress's verdict)."""
    if len(raw) == 4:
        return not (224 <= raw[0] <= 239 or raw == bytes(4))
    return not (raw[0] == 0xFF or raw == bytes(16) or (raw[0] == 0xFE and raw[1] & 0xC0 == 0x80))


def _pair(item: tuple[str, int]) -> tuple[str, int]:
    """A real server of `servers` as an (address, port) pair: how the compiled twin unpacks
    anything but a tuple of two, so that it raises CPython's errors, as this twin does."""
    server, port = item
    return server, port


def _settings(command: int, weight: int) -> bytes:
    """A real server's attributes after its address and port: NAT forwarding and `weight`
    (none for a deletion)."""
    if command == IPVS_CMD_DEL_DEST:
        return b""
    return (
        _attr(_DEST_FWD, _U32.pack(IP_VS_CONN_F_MASQ))
        + _attr(_DEST_WEIGHT, _U32.pack(_check("weight", weight, 0x7FFFFFFF)))
        + _attr(_DEST_UTHRESH, _U32.pack(0))
        + _attr(_DEST_LTHRESH, _U32.pack(0))
    )


def _dest(raw: bytes, family: int, port: int, settings: bytes) -> bytes:
    """A real server's nested attribute: its address (packed), port and `_settings`."""
    body = _attr(_DEST_ADDR, raw) + _attr(_DEST_PORT, _BE16.pack(port)) + settings
    return _attr(_CMD_DEST, body + _attr(_DEST_FAMILY, _U16.pack(family)))


def _key(protocol: int, address: str, port: int) -> tuple[int, bytes]:
    """A virtual service's family and identifying attributes."""
    family, raw = _packed(address)
    return family, (
        _attr(_SVC_AF, _U16.pack(family))
        + _attr(_SVC_PROTOCOL, _U16.pack(_check("protocol", protocol, 0xFFFF)))
        + _attr(_SVC_ADDR, raw)
        + _attr(_SVC_PORT, _BE16.pack(_check("port", port, 0xFFFF)))
    )


class Requests:
    """IPVS commands encoded one after another, numbered from `sequence` on."""

    def __init__(self, family: int, sequence: int) -> None:
        self._family = _check("family", family, 0xFFFF)
        self._next = _check("sequence", sequence, 0xFFFFFFFF)
        self._messages: list[bytes] = []

    def service(
        self, command: int, protocol: int, address: str, port: int, scheduler: str, timeout: int
    ) -> int:
        """A virtual service added, changed or deleted (its key alone); persistent when
        `timeout` is not 0. Returns the request's sequence number."""
        if command not in _SERVICE_COMMANDS:
            raise CodecError(f"{command!r} is not a virtual-service command")
        family, body = _key(protocol, address, port)
        if command != IPVS_CMD_DEL_SERVICE:
            if type(scheduler) is not str or "\0" in scheduler or not scheduler.isascii():
                raise CodecError(f"{scheduler!r} is not a scheduler name")
            persistent = IP_VS_SVC_F_PERSISTENT if _check("timeout", timeout, 0xFFFFFFFF) else 0
            body += (
                _attr(_SVC_SCHED, scheduler.encode("ascii") + b"\0")
                + _attr(_SVC_FLAGS, _FLAGS.pack(persistent, 0xFFFFFFFF))
                + _attr(_SVC_TIMEOUT, _U32.pack(timeout))
                + _attr(_SVC_NETMASK, _U32.pack(0xFFFFFFFF if family == AF_INET else 128))
            )
        return self._add(command, _attr(_CMD_SERVICE, body))

    def server(
        self,
        command: int,
        protocol: int,
        address: str,
        port: int,
        server: str,
        server_port: int,
        weight: int,
    ) -> int:
        """A real server of a virtual service added, changed (NAT, `weight`) or deleted.
        Returns the request's sequence number."""
        if command not in _SERVER_COMMANDS:
            raise CodecError(f"{command!r} is not a real-server command")
        _, key = _key(protocol, address, port)
        family, raw = _packed(server)
        number = _check("port", server_port, 0xFFFF)
        dest = _dest(raw, family, number, _settings(command, weight))
        return self._add(command, _attr(_CMD_SERVICE, key) + dest)

    def servers(
        self,
        command: int,
        protocol: int,
        address: str,
        port: int,
        servers: Iterable[tuple[str, int]],
        weight: int,
    ) -> tuple[int, list[tuple[str, int]]]:
        """`server` for each (address, port) of `servers`, the same requests numbered in turn,
        except those IPVS refuses as real servers (not `_unicast`): those are returned, in
        order, with the first request's sequence number (the next one's, if none is made).
        The command, key and weight are checked once, before any server; every server's
        address and port are checked, left out or not; on any error nothing is encoded."""
        if command not in _SERVER_COMMANDS:
            raise CodecError(f"{command!r} is not a real-server command")
        _, key = _key(protocol, address, port)
        head = _attr(_CMD_SERVICE, key)
        settings = _settings(command, weight)
        first, count = self._next, len(self._messages)
        left: list[tuple[str, int]] = []
        try:
            for item in servers:
                server, server_port = item
                family, raw = _packed(server)
                server_port = _check("port", server_port, 0xFFFF)
                if not _unicast(raw):
                    left.append(item)
                    continue
                self._add(command, head + _dest(raw, family, server_port, settings))
        except BaseException:
            del self._messages[count:]
            self._next = first
            raise
        return first, left

    def _add(self, command: int, body: bytes) -> int:
        sequence = self._next
        if sequence > 0xFFFFFFFF:
            raise CodecError("sequence numbers exhausted")
        length = _NLMSG.size + _GENL.size + len(body)
        self._messages.append(
            _NLMSG.pack(length, self._family, NLM_F_REQUEST, sequence, 0)
            + _GENL.pack(command, GENL_VERSION, 0)
            + body
        )
        self._next += 1
        return sequence

    def __len__(self) -> int:
        return len(self._messages)

    def chunks(self, limit: int) -> list[tuple[bytes, int]]:
        """The requests in order, joined into buffers of at most `limit` bytes (a request
        longer than that alone), each with the sequence number of its last request, the one
        that asks for an acknowledgement: once it is read, every answer to the buffer is."""
        _check("limit", limit, 1 << 62)
        out: list[tuple[bytes, int]] = []
        current: list[bytes] = []
        size = 0
        first = self._next - len(self._messages)
        for index, message in enumerate(self._messages):
            if current and size + len(message) > limit:
                out.append(_acknowledged(current, first + index - 1))
                current, size = [], 0
            current.append(message)
            size += len(message)
        if current:
            out.append(_acknowledged(current, self._next - 1))
        return out


def _acknowledged(messages: list[bytes], last: int) -> tuple[bytes, int]:
    tail = bytearray(messages[-1])
    _U16.pack_into(tail, 6, _U16.unpack_from(tail, 6)[0] | NLM_F_ACK)
    return b"".join([*messages[:-1], bytes(tail)]), last


def _dump(family: int, sequence: int, command: int, body: bytes) -> bytes:
    _check("family", family, 0xFFFF)
    _check("sequence", sequence, 0xFFFFFFFF)
    length = _NLMSG.size + _GENL.size + len(body)
    flags = NLM_F_REQUEST | NLM_F_DUMP
    return (
        _NLMSG.pack(length, family, flags, sequence, 0)
        + _GENL.pack(command, GENL_VERSION, 0)
        + body
    )


def services_request(family: int, sequence: int) -> bytes:
    """The dump request of every virtual service (IPVS_CMD_GET_SERVICE)."""
    return _dump(family, sequence, IPVS_CMD_GET_SERVICE, b"")


def servers_request(family: int, sequence: int, protocol: int, address: str, port: int) -> bytes:
    """The dump request of one virtual service's real servers (IPVS_CMD_GET_DEST)."""
    _, key = _key(protocol, address, port)
    return _dump(family, sequence, IPVS_CMD_GET_DEST, _attr(_CMD_SERVICE, key))


def _attrs(data: bytes, start: int, end: int) -> dict[int, tuple[int, int]]:
    """Attribute type -> (payload start, end) in data[start:end], the last of a type."""
    out: dict[int, tuple[int, int]] = {}
    while start + 4 <= end:
        length, kind = _NLA.unpack_from(data, start)
        if length < 4:
            break
        if start + length > end:
            raise CodecError("an attribute runs past its message")
        out[kind & 0x3FFF] = (start + 4, start + length)
        start += (length + 3) & ~3
    return out


def _number(data: bytes, where: tuple[int, int] | None, unpack: struct.Struct) -> int:
    """A number attribute's value; 0 if it is missing."""
    if where is None:
        return 0
    if where[1] - where[0] < unpack.size:
        raise CodecError("a number attribute is too short")
    return int(unpack.unpack_from(data, where[0])[0])


def _address(data: bytes, where: tuple[int, int] | None, family: int) -> str:
    if where is None:
        raise CodecError("an answer without an address")
    size = 4 if family == AF_INET else 16
    if family not in (AF_INET, AF_INET6):
        raise CodecError(f"address family {family} is neither IPv4 nor IPv6")
    if where[1] - where[0] < size:
        raise CodecError("an address attribute is too short")
    return str(ipaddress.ip_address(data[where[0] : where[0] + size]))


class _Dump:
    """One dump's answers, read message by message as they are received."""

    _command = 0
    _nest = 0

    def __init__(self) -> None:
        self._out: list[Any] = []
        self.done = False

    def feed(self, data: bytes) -> bool:
        """Parse one `recv`'s messages; True once the dump is complete. A dump the kernel
        refused raises OSError with its errno."""
        offset = 0
        while offset + _NLMSG.size <= len(data):
            length, kind, _, _, _ = _NLMSG.unpack_from(data, offset)
            if length < _NLMSG.size or offset + length > len(data):
                raise CodecError("truncated netlink message")
            if kind == NLMSG_DONE:
                self.done = True
            elif kind == NLMSG_ERROR:
                if length < _NLMSG.size + 4:
                    raise CodecError("truncated netlink message")
                code = -struct.unpack_from("=i", data, offset + _NLMSG.size)[0]
                if code:
                    raise OSError(code, f"IPVS dump refused: {os.strerror(code)}")
            elif (
                kind >= NLMSG_MIN_TYPE
                and length >= _NLMSG.size + _GENL.size
                and data[offset + _NLMSG.size] == self._command
            ):
                start = offset + _NLMSG.size + _GENL.size
                nest = _attrs(data, start, offset + length).get(self._nest)
                if nest is None:
                    raise CodecError("an answer without its nested attributes")
                self._out.append(self._entry(data, _attrs(data, *nest)))
            offset += (length + 3) & ~3
        return self.done

    def _entry(self, data: bytes, attrs: dict[int, tuple[int, int]]) -> tuple[Any, ...]:
        raise NotImplementedError


class ServiceDump(_Dump):
    """Reads an IPVS_CMD_GET_SERVICE dump: (protocol, address, port, fwmark, scheduler,
    flags, persistence timeout) per virtual service; a fwmark service has address "" and
    protocol and port 0."""

    _command = IPVS_CMD_NEW_SERVICE
    _nest = _CMD_SERVICE

    def _entry(self, data: bytes, attrs: dict[int, tuple[int, int]]) -> tuple[Any, ...]:
        if _SVC_AF not in attrs:
            raise CodecError("a virtual service without its address family")
        family = _number(data, attrs[_SVC_AF], _U16)
        address = _address(data, attrs[_SVC_ADDR], family) if _SVC_ADDR in attrs else ""
        scheduler = ""
        if _SVC_SCHED in attrs:
            first, last = attrs[_SVC_SCHED]
            scheduler = data[first:last].split(b"\0", 1)[0].decode("ascii", "replace")
        return (
            _number(data, attrs.get(_SVC_PROTOCOL), _U16),
            address,
            _number(data, attrs.get(_SVC_PORT), _BE16),
            _number(data, attrs.get(_SVC_FWMARK), _U32),
            scheduler,
            _number(data, attrs.get(_SVC_FLAGS), _U32),
            _number(data, attrs.get(_SVC_TIMEOUT), _U32),
        )

    def result(self) -> list[tuple[int, str, int, int, str, int, int]]:
        """The virtual services read, in the kernel's order."""
        return self._out


class ServerDump(_Dump):
    """Reads an IPVS_CMD_GET_DEST dump: (address, port, forwarding method, weight, active
    connections, inactive connections) per real server. `version` (4 or 6) is the virtual
    service's: a kernel that does not name a real server's family gives it the service's."""

    _command = IPVS_CMD_NEW_DEST
    _nest = _CMD_DEST

    def __init__(self, version: int) -> None:
        super().__init__()
        if version not in (4, 6):
            raise CodecError(f"IP version {version!r} is neither 4 nor 6")
        self._family = AF_INET if version == 4 else AF_INET6

    def _entry(self, data: bytes, attrs: dict[int, tuple[int, int]]) -> tuple[Any, ...]:
        family = self._family
        if _DEST_FAMILY in attrs:
            family = _number(data, attrs[_DEST_FAMILY], _U16)
        if _DEST_PORT not in attrs:
            raise CodecError("a real server without its port")
        return (
            _address(data, attrs.get(_DEST_ADDR), family),
            _number(data, attrs[_DEST_PORT], _BE16),
            _number(data, attrs.get(_DEST_FWD), _U32),
            _number(data, attrs.get(_DEST_WEIGHT), _U32),
            _number(data, attrs.get(_DEST_ACTIVE), _U32),
            _number(data, attrs.get(_DEST_INACTIVE), _U32),
        )

    def result(self) -> list[tuple[str, int, int, int, int, int]]:
        """The real servers read, in the kernel's order."""
        return self._out
