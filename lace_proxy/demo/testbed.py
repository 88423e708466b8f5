"""A dual-stack network-namespace testbed for driving a service proxy with real packets.

Topology: every box is a namespace, each link a veth pair created straight into its two
namespaces (nothing is created in the root namespace; packets never leave these namespaces)::

    client eth0 ────── up0  node  gw0 ────── eth0 gw
    10.250.0.2         10.250.0.1 10.250.1.1       10.250.1.2
    fd00:250::2        fd00:250::1 fd00:250:1::1   fd00:250:1::2
                         vp1 ────── eth0 pod1 10.251.0.11 fd00:251::11
                         vp2 ────── eth0 pod2 10.251.0.12 fd00:251::12  ...
    (10.251.0.1 and fd00:251::1 on every vpN: the pods' gateway)

* node: where the proxy runs. Forwards IPv4 and IPv6. Its uplink address (10.250.0.1,
  fd00:250::1) is the "node IP" for NodePorts; 10.251.0.1 / fd00:251::1 on every pod veth is
  the pods' gateway. Its default route points at gw.
* gw: the node's default router and the sink for untouched traffic. It rejects every packet it
  would forward with ICMP net-prohibited (IPv4) / reject-route (IPv6), codes a proxy has no
  reason to use, so a VIP packet the proxy failed to translate comes back as outcome "escaped"
  instead of being mistaken for a REJECT or a DROP. It runs no server.
* pods: routed point-to-point veths rather than a bridge, so pod-to-pod and hairpin traffic
  always crosses the node's IP layer (and conntrack) without br_netfilter or hairpin mode.
* client: a host next to the node. By default its default route is the node, so it also
  reaches pods directly; with ``client_routes_pods=False`` it only has routes to the service
  and external ranges (and its link to the node), so it reaches pods only through addresses
  the proxy translates.

Servers (tests/netns/servers.py) run in node, client and every pod, on all their addresses
and on ``ports`` (TCP and UDP), and answer "NAME LOCAL_IP:PORT PEER_IP". What the topology
supports asserting:

* which endpoint answered (Reply.name) and the address it was reached on after DNAT (Reply.ip);
* whether the source was masqueraded (Reply.peer is the client's own address, or the node's);
* REJECT ("refused", with the errno and ICMP type/code/sender, or no ICMP for a TCP RST) vs
  DROP ("timeout") vs not handled at all ("escaped", or the node's own server answering for a
  NodePort on a node address).

Masquerade never decides deliverability here: a pod's only route is the node, whose conntrack
reverses the DNAT, so un-masqueraded replies reach the client too. Assert on Reply.peer.
Requests use connected sockets, so (as for a real client) a UDP answer from an address other
than the one asked is ignored and the request times out.
"""

from __future__ import annotations

import abc
import contextlib
import ctypes
import errno
import itertools
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures.thread import BrokenThreadPool
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal, Self, TypeVar

# Address plan: private ranges only, the same in every testbed (each has its own namespaces).
UPLINK_NODE4, UPLINK_NODE6 = "10.250.0.1", "fd00:250::1"
CLIENT4, CLIENT6 = "10.250.0.2", "fd00:250::2"
GWLINK_NODE4, GWLINK_NODE6 = "10.250.1.1", "fd00:250:1::1"
GW4, GW6 = "10.250.1.2", "fd00:250:1::2"
POD_CIDR4, POD_CIDR6 = "10.251.0.0/24", "fd00:251::/64"
POD_GATEWAY4, POD_GATEWAY6 = "10.251.0.1", "fd00:251::1"
SERVICE_CIDR4, SERVICE_CIDR6 = "10.96.0.0/16", "fd00:96::/112"
EXTERNAL_CIDR4, EXTERNAL_CIDR6 = "10.252.0.0/24", "fd00:252::/64"  # LoadBalancer / external IPs
FABRIC4 = "10.250.0.254"  # the two-node testbed's router and sink (cluster.py)

DEFAULT_PORTS = (80, 8080, 30080)
MAX_PODS = 99  # keeps namespace names within IFNAMSIZ-1 (15) characters
SOURCE_PORTS = range(20000, 30000)  # below the ephemeral range and the NodePort range

# (ICMP type, code) that gw uses for "left the node untouched".
ESCAPE_ICMP4 = (3, 9)  # destination unreachable, network administratively prohibited
ESCAPE_ICMP6 = (1, 6)  # destination unreachable, reject route to destination
# Every sink's ICMP sender and the (type, code) it rejects with: an error from one of these,
# and only with that type and code, means "escaped". No other host uses these addresses.
SINK_ICMP: dict[str, tuple[int, int]] = {
    GW4: ESCAPE_ICMP4,
    GW6: ESCAPE_ICMP6,
    FABRIC4: ESCAPE_ICMP4,
}

SERVER_SCRIPT = Path(__file__).with_name("servers.py")

GW_SINK_RULES = """
table inet lace_testbed_sink {
    chain forward {
        type filter hook forward priority 0; policy accept;
        meta nfproto ipv4 reject with icmp type net-prohibited
        meta nfproto ipv6 reject with icmpv6 type reject-route
    }
}
"""

CLONE_NEWNET = 0x40000000
IP_RECVERR = 11  # not exported by Python 3.11's socket module
IPV6_RECVERR = 25
SO_EE_ORIGIN_ICMP, SO_EE_ORIGIN_ICMP6 = 2, 3
SOCK_EXTENDED_ERR = struct.Struct("=IBBBBII")  # errno, origin, type, code, pad, info, data

# "lp<pid hex>.<testbed no hex><role>". Testbed's roles: N(ode), C(lient), G(w), P<i> (pods).
# ClusterTestbed's: F(abric), Xf and Xn (the far and near clients), Na and Nb (nodes), and
# Pa1 Pa2 Pab Pb1 Pbb (pods: the node's letter, then the pod's number or b for blue).
# EgressTestbed's: E (the edge) and Pax (a pod of node-a outside the pod prefixes).
_NAME_PATTERN = re.compile(
    r"lp([0-9a-f]+)\.[0-9a-f]+(?:N|C|G|P[0-9]+|F|E|X[fn]|N[ab]|P[ab][12b]|Pax)"
)
_LIBC = ctypes.CDLL(None, use_errno=True)
_testbeds = itertools.count()
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


def _netns(where: Where) -> Netns:
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
    with _netns(where).socket(_family(ip), socket.SOCK_STREAM) as sock:
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
    with _netns(where).socket(_family(ip), socket.SOCK_DGRAM) as sock:
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


class _ForkServer:
    """servers.py --fork-server: one per test process, started on first use; it forks the
    testbeds' servers, so none pays an interpreter's start. Exits with this process (its
    control socket closes)."""

    _lock = threading.Lock()
    _running: tuple[int, socket.socket, subprocess.Popen[bytes]] | None = None

    @classmethod
    def spawn(cls, netns: str, argv: Sequence[str], stderr: IO[bytes]) -> _Server:
        """A server in `netns` with these arguments, its stderr to the file `stderr`."""
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        try:
            with cls._lock:
                control = cls._control()
                socket.send_fds(
                    control, [json.dumps([netns, list(argv)]).encode()],
                    [stdin_r, stdout_w, stderr.fileno()],
                )  # fmt: skip
                reply = control.recv(64)
            if not reply.endswith(b"\n"):
                raise RuntimeError("the testbed's fork server did not answer")
            pid = int(reply)
        except BaseException:
            for fd in (stdin_w, stdout_r):
                os.close(fd)
            raise
        finally:
            os.close(stdin_r)
            os.close(stdout_w)
        return _Server(argv[0], pid, os.fdopen(stdin_w, "wb"), os.fdopen(stdout_r, "rb"), stderr)

    @classmethod
    def _control(cls) -> socket.socket:
        if cls._running is not None and cls._running[0] == os.getpid():
            return cls._running[1]
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with theirs:
            argv = [sys.executable, "-I", "-S", str(SERVER_SCRIPT), "--fork-server"]
            proc = subprocess.Popen(
                [*argv, str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                pass_fds=[theirs.fileno()],
                start_new_session=True,  # a terminal's Ctrl-C stays away from it
            )
        cls._running = (os.getpid(), ours, proc)
        return ours


@dataclass
class _Server:
    """One server (a child of the fork server); its stderr goes to a file, so it can never
    block on a pipe. Watched through a pidfd: it is not this process's child."""

    name: str
    pid: int
    stdin: IO[bytes]
    stdout: IO[bytes]
    stderr: IO[bytes]

    def wait_ready(self, deadline: float) -> None:
        ready, _, _ = select.select([self.stdout], [], [], max(deadline - time.monotonic(), 0))
        line = self.stdout.readline() if ready else b""
        if line != b"ready\n":
            raise RuntimeError(f"server {self.name} not ready: {self.stop().strip()}")

    def stop(self) -> str:
        """Close stdin (the server exits on EOF), make sure it is gone; return its stderr."""
        with contextlib.suppress(OSError):
            self.stdin.close()
        try:
            pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            pidfd = None  # already gone and reaped
        if pidfd is not None:  # readable once the process has exited
            try:
                if not select.select([pidfd], [], [], 2)[0]:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    select.select([pidfd], [], [], 5)
            finally:
                os.close(pidfd)
        self.stdout.close()
        if self.stderr.closed:
            return ""
        self.stderr.seek(0)
        with self.stderr:
            return self.stderr.read().decode(errors="replace")


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Ignore Ctrl-C while tearing down, so a second one can't leak namespaces."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)


def reachable(source: Where, ip: str, port: int, deadline: float) -> Result:
    """A TCP request from source to ip:port, repeated while it times out (veths, and bridge
    ports, come up asynchronously) until deadline; the last result."""
    result = request_tcp(source, ip, port, 0.2)
    while result.outcome == "timeout" and time.monotonic() < deadline:
        result = request_tcp(source, ip, port, 0.2)
    return result


class TestbedBase(abc.ABC):
    """What every testbed shares: its namespaces, their workers, servers and teardown.

    Use as a context manager; everything is torn down on exit, also on exceptions and Ctrl-C.
    Names are "lp<pid hex>.<testbed no hex><role>", unique per process (one counter for every
    kind of testbed) and matched by remove_stale_namespaces. Subclasses build in _build.
    """

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, ports: Sequence[int]) -> None:
        if not ports:
            raise ValueError("servers need at least one port")
        self.ports = tuple(ports)
        self.prefix = f"lp{os.getpid():x}.{next(_testbeds):x}"
        self._names: list[str] = []
        self._netns: list[Netns] = []
        self._servers: list[_Server] = []
        self.setup_seconds = 0.0

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def namespace_names(self) -> list[str]:
        """Every namespace this testbed created (or was about to create)."""
        return list(self._names)

    @property
    def server_pids(self) -> list[int]:
        """Process ids of the running servers."""
        return [server.pid for server in self._servers]

    def _name(self, role: str) -> str:
        name = f"{self.prefix}{role}"
        if len(name) > 15:
            raise ValueError(f"namespace name {name!r} is longer than 15 characters")
        return name

    def start(self) -> None:
        """Build everything; on any failure tear down what exists and re-raise."""
        started = time.monotonic()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        self.setup_seconds = time.monotonic() - started

    @abc.abstractmethod
    def _build(self) -> None:
        """Make the namespaces, links, addresses, routes and servers (the subclass's topology)."""

    def _add_namespaces(self, roles: Sequence[str]) -> list[Netns]:
        """Create one namespace per role, with its worker, in order.

        The names are recorded before anything is created, so close() deletes even a half-made
        set.
        """
        names = [self._name(role) for role in roles]
        self._names += names
        run_checked(["ip", "-batch", "-"], "".join(f"netns add {n}\n" for n in names))
        created: list[Netns] = []
        for name in names:
            created.append(Netns(name))
            self._netns.append(created[-1])
        return created

    def _start_servers(self, hosts: Sequence[Host]) -> None:
        """One server per host, named like it on self.ports; started together, then awaited."""
        for host in hosts:
            self._servers.append(self._spawn(host, host.name, self.ports))
        deadline = time.monotonic() + 10
        for server in self._servers:
            server.wait_ready(deadline)

    def _spawn(
        self,
        host: Host,
        name: str,
        ports: Sequence[int],
        http_ports: Sequence[int] = (),
        echo_ports: Sequence[int] = (),
    ) -> _Server:
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed by _Server.stop)
        argv = [name, *map(str, ports)]
        if http_ports:
            argv += ["--http", *map(str, http_ports)]
        if echo_ports:
            argv += ["--echo", *map(str, echo_ports)]
        return _ForkServer.spawn(host.ns.name, argv, stderr)

    def serve(
        self,
        host: Host,
        ports: Sequence[int],
        name: str | None = None,
        http_ports: Sequence[int] = (),
        echo_ports: Sequence[int] = (),
    ) -> None:
        """Start one more server (e.g. on extra ports, HTTP or echo ones); stopped at teardown."""
        server = self._spawn(host, name or host.name, ports, http_ports, echo_ports)
        self._servers.append(server)
        server.wait_ready(time.monotonic() + 10)

    def stop_serving(self, name: str) -> None:
        """Stop every server called `name`, as a pod that goes away: its listeners close (new
        connections are refused) and the connections it holds end."""
        for server in [s for s in self._servers if s.name == name]:
            self._servers.remove(server)
            server.stop()

    def exec(
        self, where: Where, argv: Sequence[str], *, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run a command in a namespace (via `ip netns exec`, so /sys matches too)."""
        full = ["ip", "netns", "exec", _netns(where).name, *argv]
        proc = subprocess.run(full, input=input, capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(full)} failed ({proc.returncode}): {proc.stderr}")
        return proc

    def close(self) -> None:
        """Stop servers and workers, delete the namespaces. Safe to call more than once."""
        with _sigint_deferred():
            for server in self._servers:  # let them all exit at once, then reap them
                with contextlib.suppress(OSError):
                    server.stdin.close()
            for server in self._servers:
                server.stop()
            self._servers.clear()
            for ns in self._netns:
                ns.close()
            self._netns.clear()
            if self._names:
                dels = "".join(f"netns del {n}\n" for n in self._names)
                subprocess.run(
                    ["ip", "-force", "-batch", "-"],
                    input=dels,
                    text=True,
                    capture_output=True,
                    timeout=30,
                )
                left = set(self._names) & set(list_netns())
                if left:
                    raise RuntimeError(f"namespaces left behind: {sorted(left)}")
                self._names = []


class Testbed(TestbedBase):
    """Namespaces, links, addresses, routes and servers for one test (or a session).

    Roles: N (node), C (client), G (gw), P<i> (pods). See TestbedBase for the lifecycle.
    """

    __test__ = False  # not a pytest test class despite the name

    def __init__(
        self,
        pods: int = 2,
        *,
        ports: Sequence[int] = DEFAULT_PORTS,
        client_routes_pods: bool = True,
    ) -> None:
        if not 0 <= pods <= MAX_PODS:
            raise ValueError(f"pods must be 0..{MAX_PODS}")
        super().__init__(ports)
        self.client_routes_pods = client_routes_pods
        self._pod_count = pods
        self.node: Host
        self.client: Host
        self.gw: Host
        self.pods: list[Host] = []

    def _build(self) -> None:
        roles = ["N", "C", "G"] + [f"P{i}" for i in range(1, self._pod_count + 1)]
        node_ns, client_ns, gw_ns, *pod_ns = self._add_namespaces(roles)
        self.node = Host("node", UPLINK_NODE4, UPLINK_NODE6, node_ns)
        self.client = Host("client", CLIENT4, CLIENT6, client_ns)
        self.gw = Host("gw", GW4, GW6, gw_ns)
        self.pods = [
            Host(f"pod{i}", f"10.251.0.{10 + i}", f"fd00:251::{10 + i}", ns)
            for i, ns in enumerate(pod_ns, start=1)
        ]
        for host in (self.node, self.client, self.gw, *self.pods):
            host.ns.call(write_sysctls, host_sysctls(router=host is self.node or host is self.gw))

        # The node creates every veth, putting the far end straight into its namespace.
        run_checked(["ip", "-n", node_ns.name, "-batch", "-"], self._node_batch())
        for host in (self.client, self.gw, *self.pods):
            run_checked(["ip", "-n", host.ns.name, "-batch", "-"], self._peer_batch(host))
        self.exec(self.gw, ["nft", "-f", "-"], input=GW_SINK_RULES)

        self._start_servers((self.node, self.client, *self.pods))
        self._wait_for_links()

    def _node_batch(self) -> str:
        lines = [
            "link set lo up",
            f"link add up0 type veth peer name eth0 netns {self.client.ns.name}",
            f"link add gw0 type veth peer name eth0 netns {self.gw.ns.name}",
            "link set up0 up",
            "link set gw0 up",
            f"addr add {UPLINK_NODE4}/24 dev up0",
            f"addr add {UPLINK_NODE6}/64 dev up0 nodad",
            f"addr add {GWLINK_NODE4}/24 dev gw0",
            f"addr add {GWLINK_NODE6}/64 dev gw0 nodad",
            f"route add default via {GW4}",
            f"route add default via {GW6}",
        ]
        for i, pod in enumerate(self.pods, start=1):
            lines += [
                f"link add vp{i} type veth peer name eth0 netns {pod.ns.name}",
                f"link set vp{i} up",
                f"addr add {POD_GATEWAY4}/32 dev vp{i}",
                f"addr add {POD_GATEWAY6}/128 dev vp{i} nodad",
                f"route add {pod.ipv4}/32 dev vp{i}",
                f"route add {pod.ipv6}/128 dev vp{i}",
            ]
        return "".join(f"{line}\n" for line in lines)

    def _peer_batch(self, host: Host) -> str:
        lines = ["link set lo up", "link set eth0 up"]
        if host is self.client:
            lines += [f"addr add {CLIENT4}/24 dev eth0", f"addr add {CLIENT6}/64 dev eth0 nodad"]
            if self.client_routes_pods:
                via = [("default", UPLINK_NODE4), ("default", UPLINK_NODE6)]
            else:
                via = [(SERVICE_CIDR4, UPLINK_NODE4), (SERVICE_CIDR6, UPLINK_NODE6)]
                via += [(EXTERNAL_CIDR4, UPLINK_NODE4), (EXTERNAL_CIDR6, UPLINK_NODE6)]
            lines += [f"route add {dst} via {gateway}" for dst, gateway in via]
        elif host is self.gw:
            lines += [f"addr add {GW4}/24 dev eth0", f"addr add {GW6}/64 dev eth0 nodad"]
            lines += [
                f"route add default via {GWLINK_NODE4}",
                f"route add default via {GWLINK_NODE6}",
            ]
        else:
            lines += [
                f"addr add {host.ipv4}/32 dev eth0",
                f"addr add {host.ipv6}/128 dev eth0 nodad",
                f"route add {POD_GATEWAY4}/32 dev eth0",
                f"route add {POD_GATEWAY6}/128 dev eth0",
                f"route add default via {POD_GATEWAY4} dev eth0",
                f"route add default via {POD_GATEWAY6} dev eth0",
            ]
        return "".join(f"{line}\n" for line in lines)

    def _wait_for_links(self) -> None:
        """Wait until every link passes traffic (veths come up asynchronously), and check it.

        The node reaches each server, and gw (which has none) answers with a RST. This also
        fills the node's neighbour caches.
        """
        deadline = time.monotonic() + 5
        expected = {ip: "reply" for h in (self.client, *self.pods) for ip in (h.ipv4, h.ipv6)}
        expected |= {GW4: "refused", GW6: "refused"}
        for ip, outcome in expected.items():
            result = reachable(self.node, ip, self.ports[0], deadline)
            if result.outcome != outcome:
                raise RuntimeError(f"node to {ip}: expected {outcome}, got {result}")


def list_netns() -> list[str]:
    """Names of all named network namespaces on the machine."""
    return [line.split()[0] for line in run_checked(["ip", "netns", "list"]).splitlines() if line]


def remove_stale_namespaces() -> list[str]:
    """Delete testbed namespaces whose creating process is gone (killed before teardown).

    Only names in this module's exact pattern are considered, and only when no process with
    the pid encoded in the name exists. Returns the names deleted.
    """
    stale = []
    for name in list_netns():
        match = _NAME_PATTERN.fullmatch(name)
        if match is None:
            continue
        try:
            os.kill(int(match[1], 16), 0)
        except ProcessLookupError:
            stale.append(name)
        except PermissionError:
            pass  # alive, just not ours to signal
    if stale:
        run_checked(["ip", "-force", "-batch", "-"], "".join(f"netns del {n}\n" for n in stale))
    return stale
