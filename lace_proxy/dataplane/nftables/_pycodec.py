"""nf_tables set elements as netlink messages, and back: the pure-Python twin.

The compiled twin (`ext/nftcodec.pyx`, `_ccodec`) has the same API and encodes the same
bytes (a test holds them equal); `codec.py` picks one as the service table's twin is picked.

Elements are the renderer's text (`10.96.0.1 . tcp . 80 . 0 : 10.128.0.5 . 8080`), read
against a layout: the key's fields, the data's fields (none for a set, VERDICT for a
verdict map) and whether the set holds intervals. Each field of a concatenation takes a
multiple of 4 bytes (the kernel's registers); a lone field only its own size. Addresses and
ports are in network order, marks and numgen buckets in the host's, as nft stores them.

- `Batch` builds one nfnetlink batch (one atomic transaction): elements added or deleted,
  split into messages whose element lists stay under netlink's 16-bit attribute length.
  It remembers where each element lies, so that a refusal names the element.
- `DumpParser` reads a NFT_MSG_GETSETELEM dump back into the renderer's text. Intervals
  come back as the kernel holds them (a one-field interval set as start and end elements,
  a concatenated one as a key and a key end) and are written as an address, a prefix or a
  range.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from collections.abc import Sequence

ADDR4, ADDR6, PROTO, PORT, MARK, VERDICT = range(6)
IMPLEMENTATION = "pure"

NFNL_SUBSYS_NFTABLES = 10
NFNL_MSG_BATCH_BEGIN = 0x10
NFNL_MSG_BATCH_END = 0x11
NFT_MSG_NEWSETELEM = 12
NFT_MSG_GETSETELEM = 13
NFT_MSG_DELSETELEM = 14
NFPROTO_INET = 1
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
NLM_F_CREATE = 0x400
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLA_F_NESTED = 0x8000
NLA_TYPE_MASK = 0x3FFF
NFT_SET_ELEM_INTERVAL_END = 1
NFTA_SET_ELEM_KEY_END = 10
#: A message's element list stays under this (nla_len is 16 bits; as google/nftables).
ELEMENTS_LIMIT = 0xFFFF - 1024

_PROTOCOLS = {"tcp": 6, "udp": 17, "sctp": 132}
_PROTOCOL_NAMES = {v: k for k, v in _PROTOCOLS.items()}
_VERDICTS = {"drop": 0, "accept": 1, "continue": -1, "return": -5}
_VERDICT_NAMES = {v: k for k, v in _VERDICTS.items()}
_JUMPS = {"jump": -3, "goto": -4}
_JUMP_NAMES = {v: k for k, v in _JUMPS.items()}
_SIZES = {ADDR4: 4, ADDR6: 16, PROTO: 1, PORT: 2, MARK: 4}
_NLMSG = struct.Struct("=IHHII")
_NFGEN = struct.Struct("=BBH")
_NLA = struct.Struct("=HH")
_U32 = struct.Struct("=I")
_BE32 = struct.Struct(">I")


class CodecError(ValueError):
    """An element the layout cannot hold, or a message the parser cannot read."""


def _attr(kind: int, payload: bytes) -> bytes:
    pad = -len(payload) % 4
    return _NLA.pack(4 + len(payload), kind) + payload + b"\0" * pad


def _nested(kind: int, payload: bytes) -> bytes:
    return _NLA.pack(4 + len(payload), kind | NLA_F_NESTED) + payload


def _string(kind: int, text: str) -> bytes:
    return _attr(kind, text.encode() + b"\0")


def _field(code: int, token: str, end: bool) -> bytes:
    """One field's bytes; `end` takes the last address of a prefix or range."""
    if code in (ADDR4, ADDR6):
        first, sep, last = token.partition("-")
        try:
            if sep:
                text = last if end else first
                value = ipaddress.ip_address(text)
            elif "/" in token:
                net = ipaddress.ip_network(token, strict=False)
                value = net.broadcast_address if end else net.network_address
            else:
                value = ipaddress.ip_address(token)
        except ValueError as error:  # ipaddress's: not the layout's CodecError
            raise CodecError(str(error)) from None
        if value.version != (4 if code == ADDR4 else 6):
            raise CodecError(f"{token!r} is not an IPv{4 if code == ADDR4 else 6} address")
        return value.packed
    if code == PROTO:
        number = _PROTOCOLS.get(token)
        if number is None:
            number = _integer(token, 0xFF)
        return bytes((number,))
    if code == PORT:
        return _integer(token, 0xFFFF).to_bytes(2, "big")
    if code == MARK:
        return _U32.pack(_integer(token, 0xFFFFFFFF))
    raise CodecError(f"unknown field code {code}")


def _integer(token: str, limit: int) -> int:
    try:
        value = int(token, 0)
    except ValueError:
        raise CodecError(f"{token!r} is not a number") from None
    if not 0 <= value <= limit:
        raise CodecError(f"{token!r} is out of range")
    return value


def _value(fields: Sequence[int], text: str, end: bool = False) -> bytes:
    """A key's or data's NFTA_DATA_VALUE payload."""
    tokens = text.split(" . ")
    if len(tokens) != len(fields):
        raise CodecError(f"{text!r} has {len(tokens)} fields, not {len(fields)}")
    if len(fields) == 1:
        return _field(fields[0], tokens[0], end)
    out = b""
    for code, token in zip(fields, tokens, strict=True):
        raw = _field(code, token, end)
        out += raw + b"\0" * (-len(raw) % 4)
    return out


def _verdict(text: str) -> bytes:
    verb, _, chain = text.partition(" ")
    if verb in _JUMPS and chain:
        body = _attr(1, _BE32.pack(_JUMPS[verb] & 0xFFFFFFFF)) + _string(2, chain)
    elif verb in _VERDICTS and not chain:
        body = _attr(1, _BE32.pack(_VERDICTS[verb] & 0xFFFFFFFF))
    else:
        raise CodecError(f"{text!r} is not a verdict")
    return _nested(2, body)


def _increment(raw: bytes) -> bytes | None:
    """The address after `raw`, or None after the last one."""
    value = int.from_bytes(raw, "big") + 1
    if value >> (8 * len(raw)):
        return None
    return value.to_bytes(len(raw), "big")


def _flags(value: int) -> bytes:
    return _attr(3, _BE32.pack(value))


def _element_attrs(
    key: Sequence[int], data: Sequence[int], interval: bool, element: str, delete: bool
) -> list[bytes]:
    """The NFTA_LIST_ELEM payloads of one element: one, or for a one-field interval a start
    and (unless it runs to the last address) an end."""
    key_text, sep, data_text = element.partition(" : ")
    if data and not delete and not sep:
        raise CodecError(f"{element!r} has no data")
    if data and not delete:
        payload = _verdict(data_text) if data[0] == VERDICT else _attr(1, _value(data, data_text))
        data_attr = _nested(2, payload)
    else:
        data_attr = b""
    start = _value(key, key_text)
    if not interval:
        return [_nested(1, _attr(1, start)) + data_attr]
    if len(key) > 1:
        end = _value(key, key_text, end=True)
        return [
            _nested(1, _attr(1, start)) + _nested(NFTA_SET_ELEM_KEY_END, _attr(1, end)) + data_attr
        ]
    out = [_nested(1, _attr(1, start)) + data_attr]
    after = _increment(_value(key, key_text, end=True))
    if after is not None:
        out.append(_nested(1, _attr(1, after)) + _flags(NFT_SET_ELEM_INTERVAL_END))
    return out


class Batch:
    """One nfnetlink batch: set elements added and deleted, applied all or nothing."""

    def __init__(self, table: str, sequence: int) -> None:
        self._table = table
        self._first = sequence
        self._sequence = sequence + 1  # the batch's begin takes `sequence`
        self._messages: list[bytes] = []
        # sequence -> the offsets of its NFTA_LIST_ELEMs in the message, and the elements.
        self._where: dict[int, tuple[list[int], list[str]]] = {}
        self.last_request = 0

    def elements(
        self,
        delete: bool,
        container: str,
        key: Sequence[int],
        data: Sequence[int],
        interval: bool,
        elements: Sequence[str],
    ) -> None:
        """Add (or delete) these elements of map or set `container` (its layout given)."""
        head = _string(1, self._table) + _string(2, container)
        kind = NFT_MSG_DELSETELEM if delete else NFT_MSG_NEWSETELEM
        flags = NLM_F_REQUEST | (0 if delete else NLM_F_CREATE)
        prefix = _NLMSG.size + _NFGEN.size + len(head) + 4  # where the element list starts
        items: list[bytes] = []
        offsets: list[int] = []
        owners: list[str] = []
        size = 0
        for element in elements:
            for payload in _element_attrs(key, data, interval, element, delete):
                item = _nested(1, payload)
                if items and size + len(item) > ELEMENTS_LIMIT:
                    self._message(kind, flags, head, items, offsets, owners)
                    items, offsets, owners, size = [], [], [], 0
                offsets.append(prefix + size)
                owners.append(element)
                items.append(item)
                size += len(item)
        if items:
            self._message(kind, flags, head, items, offsets, owners)

    def _message(
        self,
        kind: int,
        flags: int,
        head: bytes,
        items: list[bytes],
        offsets: list[int],
        owners: list[str],
    ) -> None:
        body = _nested(3, b"".join(items))
        length = _NLMSG.size + _NFGEN.size + len(head) + len(body)
        sequence = self._sequence
        self._sequence += 1
        self._messages.append(
            _NLMSG.pack(length, (NFNL_SUBSYS_NFTABLES << 8) | kind, flags, sequence, 0)
            + _NFGEN.pack(NFPROTO_INET, 0, 0)
            + head
            + body
        )
        self._where[sequence] = (offsets, owners)

    def __len__(self) -> int:
        """The number of messages (besides the batch's begin and end)."""
        return len(self._messages)

    def finish(self) -> bytearray:
        """The batch, the last message asking for an acknowledgement (the barrier: once it
        is read, every answer of the batch has been); the last call on the batch. A
        bytearray, as the compiled twin's (its buffer, sent as it is)."""
        if not self._messages:
            return bytearray()
        last = bytearray(self._messages[-1])
        flags = _NLMSG.unpack_from(last)[2] | NLM_F_ACK
        struct.pack_into("=H", last, 6, flags)
        self.last_request = _NLMSG.unpack_from(last)[3]
        res = socket.htons(NFNL_SUBSYS_NFTABLES)
        begin = _NLMSG.pack(20, NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, self._first, 0)
        end = _NLMSG.pack(20, NFNL_MSG_BATCH_END, NLM_F_REQUEST, self._sequence, 0)
        return bytearray().join(
            (
                begin,
                _NFGEN.pack(0, 0, res),
                *self._messages[:-1],
                bytes(last),
                end,
                _NFGEN.pack(0, 0, res),
            )
        )

    def element_at(self, sequence: int, offset: int) -> str | None:
        """The element at this offset of this message (an extended ack's), if any."""
        found = self._where.get(sequence)
        if found is None:
            return None
        offsets, owners = found
        for index in range(len(offsets) - 1, -1, -1):
            if offsets[index] <= offset:
                return owners[index]
        return None

    def elements_of(self, sequence: int) -> list[str]:
        """The elements of one message (when the kernel does not say which it refused)."""
        found = self._where.get(sequence)
        return [] if found is None else list(dict.fromkeys(found[1]))


def dump_request(table: str, container: str, sequence: int) -> bytes:
    """A NFT_MSG_GETSETELEM dump request for every element of `container`."""
    body = _string(1, table) + _string(2, container)
    kind = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETSETELEM
    header = _NLMSG.pack(
        _NLMSG.size + _NFGEN.size + len(body), kind, NLM_F_REQUEST | NLM_F_DUMP, sequence, 0
    )
    return header + _NFGEN.pack(NFPROTO_INET, 0, 0) + body


def _attrs(data: bytes, start: int, end: int) -> dict[int, tuple[int, int]]:
    """Attribute type -> (payload start, payload end) of the attributes in data[start:end]."""
    out: dict[int, tuple[int, int]] = {}
    while start + 4 <= end:
        length, kind = _NLA.unpack_from(data, start)
        if length < 4:
            break
        out[kind & NLA_TYPE_MASK] = (start + 4, start + length)
        start += (length + 3) & ~3
    return out


def _format_field(code: int, raw: bytes) -> str:
    if code in (ADDR4, ADDR6):
        return str(ipaddress.ip_address(raw))
    if code == PROTO:
        return _PROTOCOL_NAMES.get(raw[0], str(raw[0]))
    if code == PORT:
        return str(int.from_bytes(raw[:2], "big"))
    if code == MARK:
        return f"{_U32.unpack_from(raw)[0]:#010x}"
    raise CodecError(f"unknown field code {code}")


def _format_range(code: int, first: bytes, last: bytes) -> str:
    """An address, a prefix, or a range: as the renderer writes them."""
    if first == last or code not in (ADDR4, ADDR6):
        return _format_field(code, first)
    low, high = int.from_bytes(first, "big"), int.from_bytes(last, "big")
    span = high - low + 1
    bits = 8 * len(first)
    if span & (span - 1) == 0 and low % span == 0:
        return f"{ipaddress.ip_address(first)}/{bits - span.bit_length() + 1}"
    return f"{ipaddress.ip_address(first)}-{ipaddress.ip_address(last)}"


def _split(fields: Sequence[int], raw: bytes) -> list[bytes]:
    if len(fields) == 1:
        return [raw[: _SIZES[fields[0]]]]
    out = []
    at = 0
    for code in fields:
        size = _SIZES[code]
        out.append(raw[at : at + size])
        at += (size + 3) & ~3
    return out


class DumpParser:
    """Reads a GETSETELEM dump's answers into elements in the renderer's text."""

    def __init__(self, key: Sequence[int], data: Sequence[int], interval: bool) -> None:
        self._key = tuple(key)
        self._data = tuple(data)
        self._interval = interval
        self._out: list[str] = []
        self._bounds: list[tuple[bytes, bool, str]] = []  # (key, is end, data): one field
        self.done = False

    def feed(self, data: bytes) -> bool:
        """Parse one `recv`'s messages; True once the dump is complete. A dump the kernel
        refused raises OSError with its errno."""
        offset = 0
        while offset + _NLMSG.size <= len(data):
            length, kind, _, _, _ = _NLMSG.unpack_from(data, offset)
            if length < _NLMSG.size:
                raise CodecError("truncated netlink message")
            if kind == NLMSG_DONE:
                self.done = True
            elif kind == NLMSG_ERROR:
                code = -struct.unpack_from("=i", data, offset + _NLMSG.size)[0]
                if code:
                    raise OSError(code, f"set element dump refused: {os.strerror(code)}")
            elif kind & 0xFF == NFT_MSG_NEWSETELEM:
                self._message(data, offset + _NLMSG.size + _NFGEN.size, offset + length)
            offset += (length + 3) & ~3
        return self.done

    def _message(self, data: bytes, start: int, end: int) -> None:
        top = _attrs(data, start, end)
        if 3 not in top:
            return
        first, last = top[3]
        while first + 4 <= last:
            length, _ = _NLA.unpack_from(data, first)
            if length < 4:
                break
            self._element(data, first + 4, first + length)
            first += (length + 3) & ~3

    def _element(self, data: bytes, start: int, end: int) -> None:
        attrs = _attrs(data, start, end)
        flags = 0
        if 3 in attrs:
            flags = _BE32.unpack_from(data, attrs[3][0])[0]
        key = self._value(data, attrs.get(1))
        value = self._data_text(data, attrs.get(2)) if self._data else ""
        if self._interval and len(self._key) == 1:
            self._bounds.append((key, bool(flags & NFT_SET_ELEM_INTERVAL_END), value))
            return
        if self._interval:
            last = (
                self._value(data, attrs.get(NFTA_SET_ELEM_KEY_END))
                if NFTA_SET_ELEM_KEY_END in attrs
                else key
            )
            text = " . ".join(
                _format_range(code, a, b)
                for code, a, b in zip(
                    self._key, _split(self._key, key), _split(self._key, last), strict=True
                )
            )
        else:
            text = " . ".join(
                _format_field(code, raw)
                for code, raw in zip(self._key, _split(self._key, key), strict=True)
            )
        self._out.append(f"{text} : {value}" if self._data else text)

    @staticmethod
    def _value(data: bytes, where: tuple[int, int] | None) -> bytes:
        if where is None:
            raise CodecError("element without a key")
        inner = _attrs(data, *where)
        if 1 not in inner:
            raise CodecError("key without a value")
        return data[inner[1][0] : inner[1][1]]

    def _data_text(self, data: bytes, where: tuple[int, int] | None) -> str:
        if where is None:
            return ""
        inner = _attrs(data, *where)
        if self._data[0] != VERDICT:
            raw = data[inner[1][0] : inner[1][1]] if 1 in inner else b""
            return " . ".join(
                _format_field(code, part)
                for code, part in zip(self._data, _split(self._data, raw), strict=True)
            )
        if 2 not in inner:
            return ""
        verdict = _attrs(data, *inner[2])
        code = struct.unpack_from(">i", data, verdict[1][0])[0]
        if code in _JUMP_NAMES and 2 in verdict:
            first, last = verdict[2]
            chain = data[first:last].rstrip(b"\0").decode()
            return f"{_JUMP_NAMES[code]} {chain}"
        return _VERDICT_NAMES.get(code, str(code))

    def result(self) -> list[str]:
        """The elements parsed (a one-field interval set's start and end paired)."""
        if not self._bounds:
            return self._out
        bits = 8 * _SIZES[self._key[0]]
        top = (1 << bits) - 1
        # An end at K and a start at K: the end closes the interval before.
        ordered = sorted(self._bounds, key=lambda b: (b[0], not b[1]))
        out = list(self._out)
        opened: tuple[bytes, str] | None = None
        for key, is_end, value in ordered:
            if is_end:
                if opened is not None:
                    last = (int.from_bytes(key, "big") - 1).to_bytes(len(key), "big")
                    out.append(self._interval_text(opened[0], last, opened[1]))
                opened = None
            else:
                if opened is not None:  # a start with no end: runs to the next start
                    last = (int.from_bytes(key, "big") - 1).to_bytes(len(key), "big")
                    out.append(self._interval_text(opened[0], last, opened[1]))
                opened = (key, value)
        if opened is not None:
            out.append(self._interval_text(opened[0], top.to_bytes(bits // 8, "big"), opened[1]))
        return out

    def _interval_text(self, first: bytes, last: bytes, value: str) -> str:
        text = _format_range(self._key[0], first, last)
        return f"{text} : {value}" if self._data else text
