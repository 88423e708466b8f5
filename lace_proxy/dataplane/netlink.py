"""Netlink requests encoded beforehand, sent many to a `send` and back to back.

pyroute2 talks to the kernel one request at a time, each awaited. Where a sync has many
requests at once, or several that must reach the kernel with nothing in between, they are
encoded first (conntrack.py encodes conntrack deletions; ipvs/kernel.py real-server changes, through
pyroute2's message classes), then sent here. The kernel handles a netlink request inside
the `send` that carries it, so once `send_together` returns, every request has been carried
out and its answer (an error, or an acknowledgement if asked for) waits on the socket.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import socket
import struct
from collections.abc import Iterable, Iterator, Sequence
from types import TracebackType

log = logging.getLogger(__name__)

NETLINK_NETFILTER = 12
NETLINK_GENERIC = 16
SOL_NETLINK = 270
#: Errors come back without a copy of the request they answer.
NETLINK_CAP_ACK = 10
NLMSG_ERROR = 2
SO_RCVBUFFORCE = 33  # asm-generic/socket.h; Python's socket module does not name it
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
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


class NetlinkSocket:
    """A netlink socket of one protocol, in the calling thread's network namespace, with
    room for `answers` answers waiting at once (SO_RCVBUFFORCE: CAP_NET_ADMIN, which
    programming IPVS or conntrack needs anyway; without it, the default buffer)."""

    def __init__(self, protocol: int, answers: int = 0) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, protocol)
        self._sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)
        if answers * ANSWER_BYTES > self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF):
            with contextlib.suppress(PermissionError):
                self._sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, answers * ANSWER_BYTES)
        self._sock.bind((0, 0))

    def __enter__(self) -> NetlinkSocket:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._sock.close()

    def fileno(self) -> int:
        return self._sock.fileno()

    def answers(self) -> dict[int, int]:
        """The kernel's answers waiting on the socket, read without blocking: the errno of
        each request that failed, 0 for each acknowledged, by sequence number. Answers the
        socket had no room for are lost (logged): only what is here is reported."""
        out: dict[int, int] = {}
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
            for kind, sequence, payload in messages(data):
                if kind == NLMSG_ERROR:
                    out[sequence] = -struct.unpack_from("=i", payload)[0]


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
        sent = _send(sock.fileno(), data, len(data), 0)
        if sent != len(data):
            code = ctypes.get_errno() if sent < 0 else errno.EMSGSIZE
            raise OSError(code, f"netlink send: {os.strerror(code)}")
