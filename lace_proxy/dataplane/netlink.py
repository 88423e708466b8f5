"""Netlink requests encoded beforehand, sent many to a `send` and back to back.

pyroute2 talks to the kernel one request at a time, each awaited. Where a sync has many
requests at once, or several that must reach the kernel with nothing in between, they are
encoded first (conntrack.py encodes conntrack deletions; the IPVS codec, through
ipvs/netlink.py, virtual and real servers), then sent here. The kernel handles a netlink
request inside the `send` that carries it, so once `send_together` returns, every request has
been carried out and its answer (an error, or an acknowledgement if asked for) waits on the
socket.
"""

from __future__ import annotations

import abc
import contextlib
import ctypes
import errno
import logging
import os
import socket
import struct
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import NamedTuple, Self

from lace_proxy.dataplane.netns import enter_netns

log = logging.getLogger(__name__)

NETLINK_NETFILTER = 12
NETLINK_GENERIC = 16
SOL_NETLINK = 270
#: Errors come back without a copy of the request they answer.
NETLINK_CAP_ACK = 10
#: Errors say which attribute of the request was refused (an offset into it).
NETLINK_EXT_ACK = 11
#: Dump requests are checked strictly, and their filters (an interface's index) applied.
NETLINK_GET_STRICT_CHK = 12
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3
#: Bytes to receive at once: a dump's part is at most 32 KiB (the kernel's netlink_dump).
RECEIVE = 1 << 16
NLM_F_ACK_TLVS = 0x200
NLMSGERR_ATTR_MSG = 1
NLMSGERR_ATTR_OFFS = 2
SO_SNDBUFFORCE = 32  # asm-generic/socket.h; Python's socket module names neither
SO_RCVBUFFORCE = 33
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
_ATTR = struct.Struct("=HH")  # nlattr: length, type
#: Bytes per `send`: well under the default socket send buffer (the kernel refuses a message
#: larger than the buffer), so no capability is needed to raise it.
CHUNK = 64 * 1024

#: libc's send through ctypes.PyDLL, which keeps the GIL across the call: from the first
#: send of `send_together` to its last, no other thread of the process runs Python.
_send = ctypes.PyDLL(None, use_errno=True).send
_send.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int)
_send.restype = ctypes.c_ssize_t


#: What one answer (an error or acknowledgement) takes of a socket's receive buffer: the
#: kernel counts each as an skb of about 800 bytes, so the default buffer holds some 250.
ANSWER_BYTES = 1024


class _Closing(abc.ABC):
    """Closed when the `with` block it opens is left."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @abc.abstractmethod
    def close(self) -> None:
        """Release the socket."""


class Channel(_Closing):
    """A netlink socket of its own with its own sequence numbers: what the IPVS and address
    channels share."""

    def __init__(
        self, protocol: int, answers: int, *, strict: bool = False, netns: str | None = None
    ) -> None:
        self.sock = socket_in(netns, protocol, answers, strict=strict)
        self._next = 1

    def close(self) -> None:
        self.sock.close()

    def _sequence(self, count: int = 1) -> int:
        """The first of `count` new sequence numbers (0 is never one)."""
        first = self._next
        self._next = (self._next + count) % 0x7FFFFFFF or 1
        return first


class NetlinkSocket(_Closing):
    """A netlink socket of one protocol, in the calling thread's network namespace, with
    room for `answers` answers waiting at once (SO_RCVBUFFORCE: CAP_NET_ADMIN, which
    programming IPVS or conntrack needs anyway; without it, the default buffer); `strict`:
    NETLINK_GET_STRICT_CHK; `groups`: the multicast groups whose notifications it gets."""

    def __init__(
        self,
        protocol: int,
        answers: int = 0,
        timeout: float = 0,
        *,
        strict: bool = False,
        groups: int = 0,
    ) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, protocol)
        if strict:
            self._sock.setsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK, 1)
        if timeout:  # how long `receive` waits; the socket stays blocking for sends
            seconds = int(timeout)
            micros = int((timeout - seconds) * 1e6)
            self._sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("@ll", seconds, micros)
            )
        self._sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)
        self._sock.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)
        if answers * ANSWER_BYTES > self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF):
            with contextlib.suppress(PermissionError):
                self._sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, answers * ANSWER_BYTES)
        self._sock.bind((0, groups))

    def close(self) -> None:
        self._sock.close()

    def fileno(self) -> int:
        return self._sock.fileno()

    def answers(self) -> dict[int, int]:
        """The kernel's answers waiting on the socket, read without blocking: the errno of
        each request that failed, 0 for each acknowledged, by sequence number. Answers the
        socket had no room for are lost (logged): only what is here is reported."""
        return {sequence: answer.errno for sequence, answer in self.replies().items()}

    def replies(self) -> dict[int, Answer]:
        """`answers`, each with what the kernel said of the refused attribute, if anything."""
        out: dict[int, Answer] = {}
        while True:
            try:
                data = self._sock.recv(1 << 16, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return out
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
                log.info("netlink: some answers were lost (the socket's buffer was full)")
                continue
            offset = 0
            while offset + _HEADER.size <= len(data):
                length, kind, flags, sequence, _ = _HEADER.unpack_from(data, offset)
                if length < _HEADER.size:
                    break
                if kind == NLMSG_ERROR:
                    out[sequence] = _answer(data[offset + _HEADER.size : offset + length], flags)
                offset += (length + 3) & ~3

    def discard(self) -> None:
        """Read away whatever waits, unread: notifications that only say something changed
        (those lost to a full buffer, ENOBUFS, said so too)."""
        while True:
            try:
                self._sock.recv(1 << 16, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise

    def send(self, data: bytes | bytearray) -> None:
        """Send one buffer (a request, or a batch of them)."""
        _send_all(self, data)

    def receive(self, size: int = 1 << 20) -> bytes:
        """The next buffer of answers, waiting at most the socket's `timeout`."""
        try:
            return self._sock.recv(size)
        except BlockingIOError:  # SO_RCVTIMEO ran out
            raise TimeoutError(errno.ETIMEDOUT, "netlink: no answer from the kernel") from None

    def send_buffer(self, size: int) -> None:
        """Make room for a `send` of `size` bytes (SO_SNDBUFFORCE with CAP_NET_ADMIN, else
        as far as net.core.wmem_max allows; a send larger than the buffer is refused)."""
        if size + 4096 <= self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) // 2:
            return
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, size + 4096)
        except PermissionError:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size + 4096)


class Answer(NamedTuple):
    """The kernel's answer to one request: 0 (acknowledged) or an errno, and where the
    request was refused (an offset into it) and why, when the kernel says."""

    errno: int
    offset: int | None = None
    message: str | None = None


def attributes(payload: bytes, start: int) -> Iterator[tuple[int, bytes]]:
    """(type, value) of each netlink attribute in `payload` from `start` on (not nested)."""
    at = start
    while at + 4 <= len(payload):
        length, kind = _ATTR.unpack_from(payload, at)
        if length < 4:
            return
        yield kind, payload[at + 4 : at + length]
        at += (length + 3) & ~3


def _answer(payload: bytes, flags: int) -> Answer:
    code = -struct.unpack_from("=i", payload)[0]
    if not code or not flags & NLM_F_ACK_TLVS:
        return Answer(code)
    # nlmsgerr: the error, the request's header (capped: NETLINK_CAP_ACK), then attributes.
    offset: int | None = None
    message: str | None = None
    for kind, value in attributes(payload, 4 + _HEADER.size):
        if kind == NLMSGERR_ATTR_OFFS and len(value) >= 4:
            offset = struct.unpack_from("=I", value)[0]
        elif kind == NLMSGERR_ATTR_MSG:
            message = value.rstrip(b"\0").decode(errors="replace")
    return Answer(code, offset, message)


def refused(replies: dict[int, Answer], sequences: range) -> list[tuple[int, Answer]]:
    """The requests of one `send` the kernel refused, by sequence number, read from its
    answers. Its last request asked for the acknowledgement that is the barrier: if that is
    missing (lost: the socket had no room), every request without an answer counts as
    refused with errno 0, its fate unknown."""
    barrier = sequences[-1] in replies
    out = []
    for sequence in sequences:
        answer = replies.get(sequence)
        if answer is None and not barrier:
            out.append((sequence, Answer(0)))
        elif answer is not None and answer.errno:
            out.append((sequence, answer))
    return out


def send_batch(
    sock: NetlinkSocket, buffers: Iterable[tuple[bytes, range]]
) -> list[tuple[int, Answer]]:
    """Send buffers of requests, each with its requests' sequence numbers (the last asking
    for an acknowledgement), one `send` each; the requests refused (`refused`). A buffer the
    socket refuses (OSError) counts as refused whole, and the rest is still sent."""
    out: list[tuple[int, Answer]] = []
    for data, sequences in buffers:
        sock.replies()  # nothing of an earlier send is taken for this one's
        try:
            sock.send(data)
        except OSError as exc:
            code = exc.errno or errno.EIO
            out += [(sequence, Answer(code)) for sequence in sequences]
            continue
        out += refused(sock.replies(), sequences)
    return out


def reason(answer: Answer) -> str:
    """Why a request was refused, for a log line: the error's name and text, and what the
    kernel said of it; errno 0 is an answer lost."""
    if not answer.errno:
        return "no answer (the socket's buffer was full)"
    name = errno.errorcode.get(answer.errno, str(answer.errno))
    extra = f": {answer.message}" if answer.message else ""
    return f"{name} ({os.strerror(answer.errno)}){extra}"


def messages(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(type, sequence number, payload) of each netlink message in `data`."""
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, kind, _, sequence, _ = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size:
            return
        yield kind, sequence, data[offset + _HEADER.size : offset + length]
        offset += (length + 3) & ~3


def header(length: int, kind: int, flags: int, sequence: int) -> bytes:
    """A netlink message header for a message of `length` bytes (header included)."""
    return _HEADER.pack(length, kind, flags, sequence, 0)


def chunks(requests: Iterable[bytes], limit: int = CHUNK) -> list[bytes]:
    """Requests joined into as few buffers of at most `limit` bytes as they fit in."""
    out: list[bytes] = []
    current: list[bytes] = []
    size = 0
    for request in requests:
        if current and size + len(request) > limit:
            out.append(b"".join(current))
            current, size = [], 0
        current.append(request)
        size += len(request)
    if current:
        out.append(b"".join(current))
    return out


def send_together(parts: Sequence[tuple[NetlinkSocket, bytes]]) -> None:
    """Send each buffer on its socket, in order, with no other Python thread running from
    the first to the last: the time between them is the kernel's and this loop's only."""
    for sock, data in parts:
        _send_all(sock, data)


def _send_all(sock: NetlinkSocket, data: bytes | bytearray) -> None:
    # A bytearray (a batch the codec built in place) is passed as it is, not copied.
    buffer = (ctypes.c_char * len(data)).from_buffer(data) if isinstance(data, bytearray) else data
    sent = _send(sock.fileno(), buffer, len(data), 0)
    if sent != len(data):
        code = ctypes.get_errno() if sent < 0 else errno.EMSGSIZE
        raise OSError(code, f"netlink send: {os.strerror(code)}")


def socket_in(
    netns: str | None, protocol: int, answers: int = 0, timeout: float = 0, *, strict: bool = False
) -> NetlinkSocket:
    """A netlink socket of the named network namespace (the caller's if None): made by a
    short-lived thread that enters it, since a socket stays in the namespace it was made in."""
    if netns is None:
        return NetlinkSocket(protocol, answers, timeout, strict=strict)
    with ThreadPoolExecutor(1, initializer=enter_netns, initargs=(netns,)) as pool:
        return pool.submit(NetlinkSocket, protocol, answers, timeout, strict=strict).result()
