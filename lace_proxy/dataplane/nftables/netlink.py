"""Set elements to and from the kernel over netlink, in-process: no nft runs for them.

A transaction of elements is encoded by the codec (compiled, or its pure twin) into one
nfnetlink batch and sent with one `send`: the kernel applies it whole or not at all, within
that call. The batch's last request asks for an acknowledgement; any error the kernel
reports names the request and, through the extended acknowledgement's offset, the element
it refused. Elements are read back with GETSETELEM dumps, parsed into the renderer's text.
"""

from __future__ import annotations

import errno
import functools
import itertools
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

from lace_proxy.dataplane.netlink import (
    NETLINK_NETFILTER,
    NLM_F_DUMP,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NLMSG_ERROR,
    NetlinkSocket,
    header,
    messages,
    socket_in,
)
from lace_proxy.dataplane.nftables.codec import Batch, CodecError, DumpParser, dump_request, layout
from lace_proxy.dataplane.nftables.transaction import Elements, NftError

#: The answers a batch may leave waiting: one acknowledgement, and an error per request the
#: kernel refused (it reports every one before aborting).
ANSWERS = 4096
NFNL_SUBSYS_NFTABLES = 10
NFT_MSG_GETTABLE, NFT_MSG_GETCHAIN, NFT_MSG_GETRULE, NFT_MSG_GETSET = 1, 4, 7, 10
NFTA_CHAIN_TABLE, NFTA_CHAIN_NAME, NFTA_CHAIN_USERDATA = 1, 3, 12
NFTA_RULE_TABLE, NFTA_RULE_CHAIN, NFTA_RULE_USERDATA = 1, 2, 7
NFTA_SET_TABLE, NFTA_SET_NAME, NFTA_SET_FLAGS = 1, 2, 3
NFT_SET_ANONYMOUS, NFT_SET_MAP = 0x1, 0x8
UDATA_COMMENT = 0  # NFTNL_UDATA_CHAIN_COMMENT and NFTNL_UDATA_RULE_COMMENT
_FAMILIES = {"ip": 2, "ip6": 10, "inet": 1}
#: Seconds a read waits for the kernel's next answer: a lost answer is an error, not a hang.
TIMEOUT = 30.0
#: Dumps of one container read before giving up (see ElementChannel.read).
DUMP_ATTEMPTS = 5

log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")


def _serialized(
    method: Callable[Concatenate[ElementChannel, P], R],
) -> Callable[Concatenate[ElementChannel, P], R]:
    """One request and its answers at a time on the channel's socket: the dataplane thread
    syncs while another (a test, the state socket) may read the table back."""

    @functools.wraps(method)
    def locked(self: ElementChannel, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._lock:
            return method(self, *args, **kwargs)

    return locked


class ElementChannel:
    """A netlink socket for nf_tables elements, in a network namespace (None: ours)."""

    def __init__(self, netns: str | None = None) -> None:
        self._netns = netns
        self._socket: NetlinkSocket | None = None
        self._lock = threading.Lock()
        self._sequence = itertools.count(1)
        # Seconds spent in the calls the kernel does its work in (a batch is applied inside
        # its send, a dump produced inside the receives): the kernel's share of a sync.
        self.kernel_seconds = 0.0

    def _sock(self) -> NetlinkSocket:
        if self._socket is None:
            self._socket = socket_in(self._netns, NETLINK_NETFILTER, ANSWERS, TIMEOUT)
        return self._socket

    @staticmethod
    def writes(commands: Sequence[Elements]) -> bool:
        """Whether these commands are ours to send: one inet table, every container one
        the codec has a layout for."""
        tables = {(c.family, c.table) for c in commands}
        if len(tables) != 1 or next(iter(tables))[0] != "inet":
            return False
        return all(layout(c.container) is not None for c in commands)

    @_serialized
    def apply(self, commands: Sequence[Elements]) -> None:
        """Send the commands as one batch; raise NftError (nothing applied) if the kernel
        refuses any of them, naming the element it refused."""
        batch = Batch(commands[0].table, next(self._sequence))
        try:
            for command in commands:
                found = layout(command.container)
                assert found is not None, "writes() checks every container"
                batch.elements(
                    command.verb == "delete",
                    command.container,
                    found.key,
                    found.data,
                    found.interval,
                    command.elements,
                )
        except CodecError as exc:
            raise NftError("elements not encoded", str(exc)) from exc
        data = batch.finish()
        if not data:
            return
        self._sequence = itertools.count(batch.last_request + 2)  # the end took +1
        sock = self._sock()
        sock.replies()  # nothing of an earlier batch is taken for this one's
        sock.send_buffer(len(data))
        start = time.perf_counter()
        try:
            sock.send(data)
        except OSError as exc:
            raise NftError("element batch not sent", os.strerror(exc.errno or 0)) from exc
        finally:
            self.kernel_seconds += time.perf_counter() - start
        replies = sock.replies()
        refused = sorted((s, a) for s, a in replies.items() if a.errno)
        if refused:
            sequence, answer = refused[0]
            element = batch.element_at(sequence, answer.offset) if answer.offset else None
            where = (
                f"element {element!r}"
                if element is not None
                else f"one of {batch.elements_of(sequence)[:3]!r}"
            )
            why = os.strerror(answer.errno) + (f" ({answer.message})" if answer.message else "")
            raise NftError(f"the kernel refused {where}", why)
        if batch.last_request not in replies:
            raise NftError("element batch", "the kernel did not acknowledge it")

    @_serialized
    def read(self, family: str, table: str, container: str) -> list[str] | None:
        """The container's elements in the renderer's text; None if the kernel has no such
        map or set, or the codec has no layout for it.

        A dump comes in many parts, and the kernel walks a hash set from its start for each,
        skipping what it has sent: if the table was resized in between (the kernel grows it
        in the background after many additions), the walk's order changed and some elements
        come twice, as many others not at all. Such a dump is read again.
        """
        for _ in range(DUMP_ATTEMPTS):
            elements = self._dump(family, table, container)
            if elements is None or len(set(elements)) == len(elements):
                return elements
            log.info("nftables: the dump of %s was inconsistent; reading it again", container)
        raise NftError(f"elements of {container} not read", "every dump was inconsistent")

    def _dump(self, family: str, table: str, container: str) -> list[str] | None:
        found = layout(container)
        if found is None or family != "inet":
            return None
        sock = self._sock()
        sock.replies()
        sock.send(dump_request(table, container, next(self._sequence)))
        parser = DumpParser(found.key, found.data, found.interval)
        try:
            while True:
                start = time.perf_counter()
                data = sock.receive()
                self.kernel_seconds += time.perf_counter() - start
                if parser.feed(data):
                    break
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise NftError(f"elements of {container} not read", str(exc)) from exc
        return parser.result()

    @_serialized
    def table_objects(self, family: str, table: str) -> dict[str, Any] | None:
        """The table's chains (with their comments), rules (their comments, in order), maps
        and sets, in the shape of nft's JSON objects (KernelState.from_json reads them); None
        if the kernel has no such table. Read with dumps of the table alone: the elements,
        the bulk, are not among them."""
        fam = _FAMILIES[family]
        try:
            self._dump_objects(NFT_MSG_GETTABLE, fam, table, dump=False)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise NftError(f"table {family} {table} not read", str(exc)) from exc
        try:
            return {"nftables": self._objects(fam, family, table)}
        except OSError as exc:
            raise NftError(f"table {family} {table} not read", str(exc)) from exc

    def _objects(self, fam: int, family: str, table: str) -> list[dict[str, Any]]:
        where = {"family": family, "table": table}
        items: list[dict[str, Any]] = [{"table": {"family": family, "name": table}}]
        for attrs in self._dump_objects(NFT_MSG_GETCHAIN, fam, table):
            if _string(attrs.get(NFTA_CHAIN_TABLE)) == table:
                chain = {**where, "name": _string(attrs.get(NFTA_CHAIN_NAME))}
                comment = _comment(attrs.get(NFTA_CHAIN_USERDATA))
                items.append({"chain": chain | ({"comment": comment} if comment else {})})
        for attrs in self._dump_objects(NFT_MSG_GETRULE, fam, table):
            if _string(attrs.get(NFTA_RULE_TABLE)) == table:
                rule = {**where, "chain": _string(attrs.get(NFTA_RULE_CHAIN))}
                comment = _comment(attrs.get(NFTA_RULE_USERDATA))
                items.append({"rule": rule | ({"comment": comment} if comment else {})})
        for attrs in self._dump_objects(NFT_MSG_GETSET, fam, table):
            flags = struct.unpack(">I", attrs.get(NFTA_SET_FLAGS, bytes(4)))[0]
            if _string(attrs.get(NFTA_SET_TABLE)) == table and not flags & NFT_SET_ANONYMOUS:
                kind = "map" if flags & NFT_SET_MAP else "set"
                items.append({kind: {**where, "name": _string(attrs.get(NFTA_SET_NAME))}})
        return items

    def _dump_objects(
        self, kind: int, family: int, table: str, *, dump: bool = True
    ) -> list[dict[int, bytes]]:
        """The top-level attributes of each object a GET request (a dump of the table's,
        or the table itself) answers with; OSError with the kernel's errno if refused."""
        sock = self._sock()
        sock.replies()
        name = table.encode() + b"\0"
        body = struct.pack("=HH", 4 + len(name), 1) + name + b"\0" * (-len(name) % 4)
        flags = NLM_F_REQUEST | (NLM_F_DUMP if dump else 0)
        sequence = next(self._sequence)
        sock.send(
            header(20 + len(body), (NFNL_SUBSYS_NFTABLES << 8) | kind, flags, sequence)
            + struct.pack("=BBH", family, 0, 0)
            + body
        )
        out: list[dict[int, bytes]] = []
        while True:
            for message, _, payload in messages(sock.receive()):
                if message == NLMSG_ERROR:
                    code = -struct.unpack_from("=i", payload)[0]
                    if code:
                        raise OSError(code, os.strerror(code))
                    return out
                if message == NLMSG_DONE:
                    return out
                out.append(_attributes(payload[4:]))
                if not dump:
                    return out


def _attributes(data: bytes) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    at = 0
    while at + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, at)
        if length < 4:
            break
        out[kind & 0x3FFF] = data[at + 4 : at + length]
        at += (length + 3) & ~3
    return out


def _string(raw: bytes | None) -> str:
    return "" if raw is None else raw.split(b"\0", 1)[0].decode()


def _comment(userdata: bytes | None) -> str | None:
    """The comment in an object's user data (libnftnl's TLVs: type, length, value)."""
    at = 0
    while userdata is not None and at + 2 <= len(userdata):
        kind, length = userdata[at], userdata[at + 1]
        if kind == UDATA_COMMENT:
            return _string(userdata[at + 2 : at + 2 + length])
        at += 2 + length
    return None
