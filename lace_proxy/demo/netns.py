"""Network namespaces with a worker thread inside, and the requests made from them.

A request is one TCP connection or UDP datagram from a namespace to a testbed server, and its
`Result` says who answered or who refused it, from the ICMP error queued on the socket.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import os
import socket
import struct
import subprocess
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures.thread import BrokenThreadPool
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from lace_proxy.demo.addresses import SINK_ICMP

SOURCE_PORTS = range(20000, 30000)  # below the ephemeral range and the NodePort range

CLONE_NEWNET = 0x40000000
IP_RECVERR = 11  # not exported by Python 3.11's socket module
IPV6_RECVERR = 25
SO_EE_ORIGIN_ICMP, SO_EE_ORIGIN_ICMP6 = 2, 3
SOCK_EXTENDED_ERR = struct.Struct("=IBBBBII")  # errno, origin, type, code, pad, info, data

_LIBC = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")

Outcome = Literal["reply", "refused", "escaped", "timeout", "error"]


def _enter_netns(name: str) -> None:
    """Move the calling thread (only) into a named namespace, and prove it got there."""
    path = f"/run/netns/{name}"
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _LIBC.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)
    if os.stat("/proc/thread-self/ns/net").st_ino != os.stat(path).st_ino:
        raise RuntimeError(f"thread did not enter netns {name}")


class Netns:
    """A named network namespace plus one worker thread that lives inside it.

    Sockets belong to the namespace they were created in, so the worker only has to create
    them; the caller then uses them from its own thread. This keeps a request at a few hundred
    microseconds, with no process per request and no namespace switching in the test thread.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._ports = itertools.count()
        # An initializer that fails breaks the pool, so no job can ever run in the wrong netns.
        self._worker = ThreadPoolExecutor(
            1, thread_name_prefix=f"netns-{name}", initializer=_enter_netns, initargs=(name,)
        )
        try:
            self.call(int)  # start the worker now, so failing to enter the netns shows here
        except BrokenThreadPool as exc:
            self._worker.shutdown()
            raise RuntimeError(f"cannot enter netns {name} (see the log for why)") from exc

    def __repr__(self) -> str:
        return f"Netns({self.name!r})"

    def call(self, fn: Callable[..., T], /, *args: object) -> T:
        """Run fn in the namespace (its sockets, /proc/sys/net and child processes are there)."""
        return self._worker.submit(fn, *args).result()

    def socket(self, family: int, kind: int) -> socket.socket:
        """A socket in this namespace, bound to a source port not used before in this run.

        A reused 5-tuple would follow an existing conntrack entry's NAT decision. IP_RECVERR
        queues ICMP errors so callers can tell who rejected a packet and how.
        """
        sock = self.call(socket.socket, family, kind)
        try:
            if family == socket.AF_INET:
                sock.setsockopt(socket.SOL_IP, IP_RECVERR, 1)
            else:
                sock.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVERR, 1)
            wildcard = "::" if family == socket.AF_INET6 else "0.0.0.0"
            for _ in range(100):
                port = SOURCE_PORTS[next(self._ports) % len(SOURCE_PORTS)]
                try:
                    sock.bind((wildcard, port))
                    return sock
                except OSError as exc:
                    if exc.errno != errno.EADDRINUSE:
                        raise
            raise OSError(errno.EADDRINUSE, f"no free source port in {self.name}")
        except BaseException:
            sock.close()
            raise

    def close(self) -> None:
        """Stop the worker, dropping its reference to the namespace."""
        self._worker.shutdown(wait=True)


@dataclass(frozen=True)
class Host:
    """A namespace with its primary addresses: node, client, gw or a pod."""

    name: str
    ipv4: str
    ipv6: str
    ns: Netns


@dataclass(frozen=True)
class Reply:
    """A server's answer: who answered, on which address/port (after DNAT), to whom (after SNAT)."""

    name: str
    ip: str
    port: int
    peer: str


@dataclass(frozen=True)
class Icmp:
    """The ICMP error that ended a request, and the address that sent it."""

    type: int
    code: int
    sender: str


@dataclass(frozen=True)
class Result:
    """How one request ended.

    outcome: "reply"; "refused" (TCP RST, or an ICMP error from anyone but a sink; errno and
    icmp say which); "escaped" (a sink, gw or the cluster's fabric, rejected it: it left the
    node untranslated); "timeout"; "error" (anything else, e.g. no local route or a malformed
    reply; see detail).
    """

    outcome: Outcome
    reply: Reply | None = None
    errno: str | None = None
    icmp: Icmp | None = None
    elapsed: float = 0.0
    detail: str = ""


Where = Netns | Host


def namespace_of(where: Where) -> Netns:
    """The namespace a request from `where` (a host or a bare namespace) is made in."""
    return where.ns if isinstance(where, Host) else where


def _family(ip: str) -> int:
    return socket.AF_INET6 if ":" in ip else socket.AF_INET


def _queued_icmp(sock: socket.socket) -> Icmp | None:
    """The ICMP error queued on the socket by IP_RECVERR, if any (none means a TCP RST)."""
    sock.setblocking(False)  # with a timeout set, Python would wait for the queue to fill
    try:
        _, ancdata, _, _ = sock.recvmsg(1, 512, socket.MSG_ERRQUEUE)
    except BlockingIOError:
        return None
    for _, _, data in ancdata:
        _, origin, icmp_type, code, *_ = SOCK_EXTENDED_ERR.unpack_from(data)
        offender = data[SOCK_EXTENDED_ERR.size :]
        if origin == SO_EE_ORIGIN_ICMP:
            return Icmp(icmp_type, code, socket.inet_ntop(socket.AF_INET, offender[4:8]))
        if origin == SO_EE_ORIGIN_ICMP6:
            return Icmp(icmp_type, code, socket.inet_ntop(socket.AF_INET6, offender[8:24]))
    return None


def _failed(sock: socket.socket, exc: OSError, started: float) -> Result:
    name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    elapsed = time.monotonic() - started
    icmp = _queued_icmp(sock)
    if icmp is not None:
        escaped = SINK_ICMP.get(icmp.sender) == (icmp.type, icmp.code)
        return Result("escaped" if escaped else "refused", None, name, icmp, elapsed)
    if exc.errno == errno.ECONNREFUSED:
        return Result("refused", None, name, None, elapsed)
    return Result("error", None, name, None, elapsed, str(exc))


def _parsed(data: bytes, started: float) -> Result:
    elapsed = time.monotonic() - started
    try:
        name, local, peer = data.decode().split()
        ip, port = local.rsplit(":", 1)
        return Result("reply", Reply(name, ip.strip("[]"), int(port), peer), elapsed=elapsed)
    except ValueError:
        return Result("error", elapsed=elapsed, detail=f"unexpected reply {data!r}")


def request_tcp(where: Where, ip: str, port: int, timeout: float = 2.0) -> Result:
    """Connect from a namespace to ip:port and read the server's line."""
    started = time.monotonic()
    with namespace_of(where).socket(_family(ip), socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect((ip, port))
            chunks = []
            while chunk := sock.recv(4096):
                chunks.append(chunk)
                sock.settimeout(max(started + timeout - time.monotonic(), 0.001))
        except TimeoutError:
            return Result("timeout", elapsed=time.monotonic() - started)
        except OSError as exc:
            return _failed(sock, exc, started)
    return _parsed(b"".join(chunks), started)


def request_udp(where: Where, ip: str, port: int, timeout: float = 2.0) -> Result:
    """Send one datagram from a namespace to ip:port and wait for the server's line."""
    started = time.monotonic()
    with namespace_of(where).socket(_family(ip), socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect((ip, port))
            sock.send(b"?\n")
            data = sock.recv(4096)
        except TimeoutError:
            return Result("timeout", elapsed=time.monotonic() - started)
        except OSError as exc:
            return _failed(sock, exc, started)
    return _parsed(data, started)


def write_sysctls(values: dict[str, int]) -> None:
    """Runs in a namespace worker: /proc/sys/net shows the calling thread's namespace."""
    for key, value in values.items():
        Path("/proc/sys", key.replace(".", "/")).write_text(f"{value}\n")


def host_sysctls(router: bool) -> dict[str, int]:
    """Settings for every namespace. IPv4 ones are otherwise inherited from the host's."""
    forward = int(router)
    return {
        # ICMP errors must never be rate limited, or a REJECT burst looks like a DROP.
        "net.ipv4.icmp_ratelimit": 0,
        "net.ipv6.icmp.ratelimit": 0,
        "net.ipv4.icmp_msgs_per_sec": 1_000_000,
        "net.ipv4.icmp_msgs_burst": 1_000_000,
        "net.ipv4.ip_forward": forward,
        "net.ipv6.conf.all.forwarding": forward,
        "net.ipv4.conf.all.rp_filter": 0,
        "net.ipv4.conf.default.rp_filter": 0,
        # gw and node forward back out the interface a packet came in on; no redirects.
        "net.ipv4.conf.all.send_redirects": 0,
        "net.ipv4.conf.default.send_redirects": 0,
        "net.ipv4.conf.all.accept_redirects": 0,
        "net.ipv4.conf.default.accept_redirects": 0,
        "net.ipv6.conf.all.accept_redirects": 0,
        "net.ipv6.conf.default.accept_redirects": 0,
        # Addresses must be usable at once, not after a second of duplicate detection.
        "net.ipv6.conf.all.accept_dad": 0,
        "net.ipv6.conf.default.accept_dad": 0,
    }


def run_checked(argv: Sequence[str], input: str | None = None, timeout: float = 30.0) -> str:
    proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def reachable(source: Where, ip: str, port: int, deadline: float) -> Result:
    """A TCP request from source to ip:port, repeated while it times out (veths, and bridge
    ports, come up asynchronously) until deadline; the last result."""
    result = request_tcp(source, ip, port, 0.2)
    while result.outcome == "timeout" and time.monotonic() < deadline:
        result = request_tcp(source, ip, port, 0.2)
    return result


def list_netns() -> list[str]:
    """Names of all named network namespaces on the machine."""
    return [line.split()[0] for line in run_checked(["ip", "netns", "list"]).splitlines() if line]
