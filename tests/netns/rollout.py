"""A rolling update as the EndpointSlice controller plays it, under live traffic.

For each endpoint of the services: the new pod appears (not ready), becomes ready; the old
one becomes `ready: false, serving: true, terminating: true`; then it is removed from the
slices, and only after that sync does its pod stop (its listeners close, so a packet still
sent there is refused, never silently answered). Each change is followed by exactly one
proxier sync, so every probe can be placed before, during or after the sync that made it.

Load (`Load`, one asyncio thread inside the client's namespace, so sockets cost no netns
round trip): new TCP connections at a paced rate, a fresh-source-port UDP query every
10 ms (each over the frontends in turn: ClusterIP, NodePort, ExternalIP, LB IP), long-held
TCP connections through an echo service that talk every few tens of milliseconds, and
fixed-source-port UDP streams (one socket each, the same conntrack flow all along).
Used by tests/netns/test_rollout.py and bench/bench_rollout.py.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import math
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from lace_proxy.dataplane.netns import enter_netns
from lace_proxy.demo.testbed import UPLINK_NODE4, Host, Testbed

from .proxykit import EXT4, LB4, NODE, Harness

WEB, ECHO, DNS = "10.96.0.40", "10.96.0.41", "10.96.0.53"
TARGET = 8080  # the pods' who-am-I servers (TCP and UDP)
ECHO_PORT = 9000  # the pods' echo servers (TCP, connections held)
WEB_NODE_PORT, DNS_NODE_PORT = 30080, 30053
#: Frontends of each load, used in turn (address, port).
TCP_FRONTENDS = ((WEB, 80), (UPLINK_NODE4, WEB_NODE_PORT), (EXT4, 80), (LB4, 80))
UDP_FRONTENDS = ((DNS, 53), (UPLINK_NODE4, DNS_NODE_PORT), (EXT4, 53), (LB4, 53))
#: Source ports the load binds, one pool per protocol (TCP and UDP ports are separate
#: 5-tuples): never reused within a run, so every probe is a new conntrack/IPVS flow.
SOURCE_PORTS = range(10000, 61000)

State = Literal["pending", "ready", "terminating", "gone"]
CONDITIONS: dict[str, dict[str, bool]] = {
    "pending": {"ready": False, "serving": False, "terminating": False},
    "ready": {"ready": True, "serving": True, "terminating": False},
    "terminating": {"ready": False, "serving": True, "terminating": True},
}


def manifests(states: dict[str, tuple[Host, State]]) -> list[dict[str, Any]]:
    """web (TCP), echo (TCP, held connections) and dns (UDP): one slice each, listing every
    pod not gone with its conditions, as the EndpointSlice controller writes them."""
    external = {"externalIPs": [EXT4], "status": {"loadBalancer": {"ingress": [{"ip": LB4}]}}}

    def svc(name: str, ip: str, port: int, target: int, protocol: str, **spec: Any) -> Any:
        ports = [{"name": "p", "port": port, "targetPort": target, "protocol": protocol}]
        if spec.get("type") == "LoadBalancer":
            ports[0]["nodePort"] = WEB_NODE_PORT if protocol == "TCP" else DNS_NODE_PORT
        status = spec.pop("status", {})
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"clusterIPs": [ip], "ports": ports, **spec},
            "status": status,
        }

    def slice_(service: str, port: int, protocol: str) -> dict[str, Any]:
        return {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{service}-abcde",
                "namespace": "default",
                "labels": {"kubernetes.io/service-name": service},
            },
            "addressType": "IPv4",
            "ports": [{"name": "p", "port": port, "protocol": protocol}],
            "endpoints": [
                {"addresses": [pod.ipv4], "nodeName": NODE, "conditions": CONDITIONS[state]}
                for pod, state in states.values()
                if state != "gone"
            ],
        }

    return [
        svc("web", WEB, 80, TARGET, "TCP", type="LoadBalancer", **external),
        slice_("web", TARGET, "TCP"),
        svc("echo", ECHO, ECHO_PORT, ECHO_PORT, "TCP", type="ClusterIP"),
        slice_("echo", ECHO_PORT, "TCP"),
        svc("dns", DNS, 53, TARGET, "UDP", type="LoadBalancer", **external),
        slice_("dns", TARGET, "UDP"),
    ]


# --- the load ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """One new TCP connection or one UDP query: sent, finished, how, and who answered.

    The node picked its endpoint at some moment between `sent` and `done` (the answer came
    after it), not necessarily close to `sent`: the load's thread can lose the GIL to the
    test's syncing thread between reading the clock and sending, and the kernel may leave
    the packet to ksoftirqd; on a busy machine for longer than a short sync takes
    (measured under load: sends up to 13 ms late, syncs as short as 2 ms). So a probe is
    judged on that whole interval (`_inside`).
    """

    kind: Literal["tcp", "udp"]
    frontend: str
    sent: float
    done: float
    outcome: str  # "reply", or what went wrong: refused, reset, timeout, lost, an errno
    name: str = ""  # the pod that answered


@dataclass
class Exchange:
    """One request/answer on a long-lived TCP connection or a fixed-port UDP stream."""

    sent: float
    done: float
    outcome: str  # "reply", "closed" (EOF), or what went wrong
    name: str = ""


@dataclass
class Flow:
    """A long-lived flow: a held TCP connection, or a UDP socket that keeps its port."""

    kind: Literal["held", "stream"]
    frontend: str
    exchanges: list[Exchange] = field(default_factory=list)

    @property
    def first(self) -> str:
        """The pod that answered first (where the flow was balanced to)."""
        return next((e.name for e in self.exchanges if e.outcome == "reply"), "")


class PortPool:
    """Fresh source ports; raises rather than wrap (a reused 5-tuple would follow an old
    conntrack or IPVS entry)."""

    def __init__(self) -> None:
        self._next = iter(SOURCE_PORTS)

    def bind(self, sock: socket.socket) -> None:
        for port in self._next:
            try:
                sock.bind(("0.0.0.0", port))
                return
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:  # e.g. a listener of the client's server
                    raise
        raise RuntimeError("out of fresh source ports: bound the load by count")


def _outcome(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, ConnectionResetError):
        return "reset"
    if isinstance(exc, OSError):
        return errno.errorcode.get(exc.errno or 0, str(exc))
    return type(exc).__name__


def _who(data: bytes) -> str:
    """The answering pod of a who-am-I line ("NAME IP:PORT PEER")."""
    return data.decode(errors="replace").split(" ", 1)[0]


class Load:
    """Paced probes and long-lived flows from the client, in one asyncio thread.

    Every loop is bounded in count (`max_probes` per kind) and time (`max_seconds`): the
    load stops by itself even if nobody calls `stop`.
    """

    def __init__(
        self,
        client: Host,
        *,
        tcp_rate: float = 250.0,
        udp_every: float = 0.01,
        talk_every: float = 0.05,
        max_probes: int = 20_000,
        max_seconds: float = 600.0,
    ) -> None:
        self.client = client
        self.tcp_rate = tcp_rate
        self.udp_every = udp_every
        self.talk_every = talk_every
        self.max_probes = min(max_probes, len(SOURCE_PORTS) - 100)
        self.max_seconds = max_seconds
        self.probes: list[Probe] = []
        self.flows: list[Flow] = []
        self.started = self.stopped = 0.0
        self._tcp_ports, self._udp_ports = PortPool(), PortPool()
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._thread = threading.Thread(target=self._main, name="rollout-load", daemon=True)

    # -- from the test's thread --

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            raise RuntimeError(f"the load did not start: {self._error!r}")

    def stop(self) -> None:
        """Stop probing, let what is in flight finish (each within its timeout), join."""
        self._stop.set()
        self._thread.join(timeout=30)
        if self._thread.is_alive():
            raise RuntimeError("the load did not stop within 30 s")
        if self._error is not None:
            raise RuntimeError("the load failed") from self._error

    def hold(self, frontend: tuple[str, int]) -> Flow:
        """Open a long-lived TCP connection (to an echo service) that talks until its pod
        closes it; returns it once it has been answered."""
        return self._call(self._open("held", frontend))

    def stream(self, frontend: tuple[str, int]) -> Flow:
        """Start a fixed-source-port UDP stream (a query every `udp_every`, each awaited);
        returns it once it has been answered."""
        return self._call(self._open("stream", frontend))

    def finished_since(self, t: float) -> tuple[int, int]:
        """(TCP, UDP) probes sent at or after t that have finished. Probes are recorded as
        they finish, so the scan stops at the first one finished before t."""
        tcp = udp = 0
        for p in reversed(list(self.probes)):
            if p.done < t:
                break
            if p.sent >= t:
                tcp += p.kind == "tcp"
                udp += p.kind == "udp"
        return tcp, udp

    def _call(self, opening: Coroutine[Any, Any, Flow]) -> Flow:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(opening, self._loop).result(timeout=60)

    # -- in the load's thread --

    def _main(self) -> None:
        try:
            enter_netns(self.client.ns.name)
            asyncio.run(self._run())
        except BaseException as exc:  # reported by start() or stop()
            self._error = exc
            self._ready.set()

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.started = time.monotonic()
        pacers = [
            self._pace(1 / self.tcp_rate, TCP_FRONTENDS, self._tcp),
            self._pace(self.udp_every, UDP_FRONTENDS, self._udp),
        ]
        self._ready.set()
        await asyncio.gather(*pacers)
        self.stopped = time.monotonic()
        while self._tasks:
            await asyncio.gather(*list(self._tasks))

    def _running(self) -> bool:
        return not self._stop.is_set() and time.monotonic() < self.started + self.max_seconds

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _pace(
        self,
        interval: float,
        frontends: Sequence[tuple[str, int]],
        probe: Callable[[str, int], Awaitable[None]],
    ) -> None:
        """Start a probe every `interval`, over the frontends in turn. Late slots (the GIL,
        a busy CPU) are caught up in a burst of at most 5, then the schedule restarts."""
        anchor = time.monotonic()
        targets = itertools.cycle(frontends)
        for i in range(self.max_probes):
            if not self._running():
                return
            delay = anchor + i * interval - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            elif delay < -5 * interval:
                anchor = time.monotonic() - i * interval
            self._spawn(probe(*next(targets)))

    async def _tcp(self, address: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        sent = time.monotonic()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        outcome, data = "reply", b""
        try:
            sock.setblocking(False)
            self._tcp_ports.bind(sock)
            async with asyncio.timeout(2.0):
                await loop.sock_connect(sock, (address, port))
                while chunk := await loop.sock_recv(sock, 4096):
                    data += chunk
        except (OSError, TimeoutError) as exc:
            outcome = _outcome(exc)
        finally:
            sock.close()
        name = _who(data) if outcome == "reply" else ""
        if outcome == "reply" and not data:
            outcome = "empty"
        self.probes.append(Probe("tcp", f"{address}:{port}", sent, time.monotonic(), outcome, name))

    async def _udp(self, address: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        sent = time.monotonic()
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        outcome, data = "reply", b""
        try:
            sock.setblocking(False)
            self._udp_ports.bind(sock)
            sock.connect((address, port))
            sock.send(b"?\n")
            async with asyncio.timeout(1.0):
                data = await loop.sock_recv(sock, 512)
        except (OSError, TimeoutError) as exc:
            outcome = "lost" if isinstance(exc, TimeoutError) else _outcome(exc)
        finally:
            sock.close()
        name = _who(data) if outcome == "reply" else ""
        self.probes.append(Probe("udp", f"{address}:{port}", sent, time.monotonic(), outcome, name))

    async def _open(self, kind: Literal["held", "stream"], frontend: tuple[str, int]) -> Flow:
        loop = asyncio.get_running_loop()
        flow = Flow(kind, f"{frontend[0]}:{frontend[1]}")
        sock = socket.socket(
            socket.AF_INET, socket.SOCK_STREAM if kind == "held" else socket.SOCK_DGRAM
        )
        try:
            sock.setblocking(False)
            (self._tcp_ports if kind == "held" else self._udp_ports).bind(sock)
            async with asyncio.timeout(2.0):
                if kind == "held":
                    await loop.sock_connect(sock, frontend)
                else:
                    sock.connect(frontend)
        except BaseException:
            sock.close()
            raise
        answered: asyncio.Future[None] = loop.create_future()
        self.flows.append(flow)
        self._spawn((self._held if kind == "held" else self._stream)(flow, sock, answered))
        await answered
        return flow

    async def _held(self, flow: Flow, sock: socket.socket, answered: asyncio.Future[None]) -> None:
        """Talk on a held connection until the pod closes it (or it fails), or the load stops."""
        loop = asyncio.get_running_loop()
        try:
            for n in range(self.max_probes):
                if not self._running() and answered.done():
                    return
                word = f"w{n}\n".encode()
                sent, outcome, line = time.monotonic(), "reply", b""
                try:
                    await loop.sock_sendall(sock, word)
                    async with asyncio.timeout(2.0):
                        while not line.endswith(b"\n"):
                            chunk = await loop.sock_recv(sock, 4096)
                            if not chunk:
                                break
                            line += chunk
                except (OSError, TimeoutError) as exc:
                    outcome = _outcome(exc)
                if outcome == "reply" and not line:
                    outcome = "closed"
                elif outcome == "reply" and not line.endswith(b" " + word):
                    outcome = f"garbled {line!r}"
                flow.exchanges.append(Exchange(sent, time.monotonic(), outcome, _who(line)))
                if not answered.done():
                    answered.set_result(None)
                if outcome != "reply":
                    return
                await asyncio.sleep(self.talk_every)
        finally:
            sock.close()

    async def _stream(
        self, flow: Flow, sock: socket.socket, answered: asyncio.Future[None]
    ) -> None:
        """A query every `udp_every` from one socket (one 5-tuple), each awaited up to 1 s."""
        loop = asyncio.get_running_loop()
        try:
            for _ in range(self.max_probes):
                if not self._running() and answered.done():
                    return
                sent, outcome, data = time.monotonic(), "reply", b""
                try:
                    sock.send(b"?\n")
                    async with asyncio.timeout(1.0):
                        data = await loop.sock_recv(sock, 512)
                except (OSError, TimeoutError) as exc:
                    outcome = "lost" if isinstance(exc, TimeoutError) else _outcome(exc)
                flow.exchanges.append(Exchange(sent, time.monotonic(), outcome, _who(data)))
                if not answered.done():
                    answered.set_result(None)
                await asyncio.sleep(max(0.0, sent + self.udp_every - time.monotonic()))
        finally:
            sock.close()


# --- the rollout ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One change to the slices and the proxier sync that followed it."""

    pod: str
    state: State
    started: float  # the sync's start (the change was written just before)
    ended: float  # the sync's end: the kernel holds the change
    sync: int  # the proxier's sync counter after it


@dataclass
class Rollout:
    """Replaces each pod of `old` by the pod of `new` at the same index, one at a time.

    `settle` waits after each sync until the load has finished `tcp_after` new connections
    and `udp_after` queries sent after the sync ended (bounded by `settle_seconds`), so
    every change is crossed by traffic.
    """

    tb: Testbed
    proxy: Harness
    load: Load
    tcp_after: int = 50
    udp_after: int = 20
    settle_seconds: float = 20.0
    steps: list[Step] = field(default_factory=list)
    stops: list[tuple[str, float]] = field(default_factory=list)  # (pod, when its servers stopped)
    states: dict[str, tuple[Host, State]] = field(default_factory=dict)

    def begin(self, pods: Sequence[Host]) -> None:
        """The service's endpoints before the rollout: these pods, ready (one sync)."""
        for pod in pods:
            self.states[pod.name] = (pod, "ready")
        self.proxy.write("rollout", *manifests(self.states))
        self.proxy.sync()

    def roll(self, old: Sequence[Host], new: Sequence[Host]) -> None:
        for out, into in zip(old, new, strict=True):
            if into.name in {pod for pod, _ in self.stops}:  # back after an earlier round
                serve(self.tb, into)
            self.change(into, "pending")
            self.change(into, "ready")
            self.change(out, "terminating")
            self.change(out, "gone")
            self.stops.append((out.name, time.monotonic()))
            self.tb.stop_serving(out.name)
            self.settle(time.monotonic())

    def change(self, pod: Host, state: State) -> None:
        """Write the slices with `pod` in `state`, then run the proxier's next sync: the one
        that programs exactly this change."""
        self.states[pod.name] = (pod, state)
        self.proxy.write("rollout", *manifests(self.states))
        before = self.proxy.proxier.stats.syncs
        started = time.monotonic()
        self.proxy.sync()
        ended = time.monotonic()
        syncs = self.proxy.proxier.stats.syncs
        assert syncs == before + 1, (before, syncs)
        self.steps.append(Step(pod.name, state, started, ended, syncs))
        self.settle(ended)

    def settle(self, since: float) -> None:
        deadline = time.monotonic() + self.settle_seconds
        while time.monotonic() < deadline:
            tcp, udp = self.load.finished_since(since)
            if tcp >= self.tcp_after and udp >= self.udp_after:
                return
            time.sleep(0.02)


def hold_on_each(load: Load, pods: Sequence[Host], per_pod: int = 2) -> list[Flow]:
    """Held connections through the echo service until each pod holds `per_pod` of them
    (balancing is random or round robin: bounded tries)."""
    held: list[Flow] = []
    for _ in range(20 * per_pod * len(pods)):
        if min(sum(f.first == pod.name for f in held) for pod in pods) >= per_pod:
            break
        held.append(load.hold((ECHO, ECHO_PORT)))
    return held


def stream_on_each(load: Load, pods: Sequence[Host]) -> list[Flow]:
    """A fixed-source-port UDP stream on every UDP frontend, until each pod has one."""
    streams: list[Flow] = []
    for _ in range(20 * len(pods)):
        streams += [load.stream(frontend) for frontend in UDP_FRONTENDS]
        if {pod.name for pod in pods} <= {f.first for f in streams}:
            break
    return streams


def serve(tb: Testbed, pod: Host) -> None:
    """A pod's servers, named after it: who-am-I on TARGET (TCP, UDP), echo on ECHO_PORT."""
    tb.serve(pod, (TARGET,), echo_ports=(ECHO_PORT,))


# --- verdicts ------------------------------------------------------------------------------


@dataclass
class Verdict:
    """What went wrong for one kind of traffic, out of how many."""

    kind: str
    total: int
    failed: list[str] = field(default_factory=list)  # what went wrong, one line each

    def line(self) -> str:
        return f"{self.kind}: {len(self.failed)} failed / {self.total}"


def usable(steps: Sequence[Step], initial: Sequence[str]) -> dict[str, list[tuple[float, float]]]:
    """When each pod may answer a new flow: from the start of the sync that made it ready to
    the end of the sync that made it terminating (or the end). A flow whose endpoint was
    picked (between its send and its answer) outside every window of the pod that answered
    it went to an endpoint the proxy must not use."""
    windows: dict[str, list[tuple[float, float]]] = {
        name: [(-math.inf, math.inf)] for name in initial
    }
    for step in steps:
        if step.state == "ready":
            windows.setdefault(step.pod, []).append((step.started, math.inf))
        elif step.state == "terminating":
            start, _ = windows[step.pod][-1]
            windows[step.pod][-1] = (start, step.ended)
    return windows


def _inside(windows: list[tuple[float, float]], sent: float, done: float) -> bool:
    """Whether an endpoint picked between `sent` and `done` may have been picked inside one
    of the windows."""
    return any(start <= done and sent <= end for start, end in windows)


def judge_probes(
    probes: Sequence[Probe], steps: Sequence[Step], initial: Sequence[str]
) -> dict[str, Verdict]:
    """Per kind: every probe answered, and by a pod usable when it was sent."""
    windows = usable(steps, initial)
    out = {kind: Verdict(kind, 0) for kind in ("tcp", "udp")}
    for p in probes:
        verdict = out[p.kind]
        verdict.total += 1
        if p.outcome != "reply":
            verdict.failed.append(f"{p}")
        elif not _inside(windows.get(p.name, []), p.sent, p.done):
            verdict.failed.append(f"{p}: {p.name} was not a usable endpoint then")
    return out


def judge_held(flows: Sequence[Flow], stops: Sequence[tuple[str, float]]) -> Verdict:
    """Every held connection is answered by its pod at every exchange until that pod stops;
    then the pod closes it (EOF, or a reset if it had unread data), and nothing else ends it.
    """
    verdict = Verdict("held", 0)
    for flow in (f for f in flows if f.kind == "held"):
        verdict.total += 1
        pod, opened = flow.first, flow.exchanges[0].sent
        until = min((t for name, t in stops if name == pod and t > opened), default=math.inf)
        last = flow.exchanges[-1]
        for e in flow.exchanges:
            by_pod = e.outcome == "reply" and e.name == pod
            closed = e is last and e.outcome in ("closed", "reset") and e.done >= until
            if not (by_pod or closed):
                verdict.failed.append(f"{flow.frontend} held on {pod} (stopped at {until}): {e}")
                break
        else:
            if until != math.inf and last.outcome == "reply":
                verdict.failed.append(f"{flow.frontend} held on {pod}: open after it stopped")
    return verdict


def judge_streams(
    flows: Sequence[Flow], steps: Sequence[Step], initial: Sequence[str], leaves_at: State
) -> Verdict:
    """Every query of a fixed-source-port UDP stream is answered, by the pod the flow is
    on, until the sync that puts that pod in state `leaves_at` starts; once that sync has
    ended, by another pod, usable then (the flow moved within that one sync), which it then
    stays on in turn. No query is lost: not even one in flight as its flow moved, whose
    reply the old pod sends once the flow's conntrack entry is gone (rescue.py).
    """
    windows = usable(steps, initial)
    verdict = Verdict("stream", 0)
    for flow in (f for f in flows if f.kind == "stream"):
        pod, since = flow.first, flow.exchanges[0].sent
        for e in flow.exchanges:
            verdict.total += 1
            leave = next(
                (s for s in steps if (s.pod, s.state) == (pod, leaves_at) and s.started > since),
                None,
            )
            wrong = ""
            if e.outcome != "reply":
                wrong = "lost"
            elif e.name == pod:
                if leave is not None and e.sent > leave.ended:
                    wrong = "still on it after that sync"
            elif leave is None or e.done < leave.started:
                wrong = "left it before that sync"
            elif not _inside(windows.get(e.name, []), e.sent, e.done):
                wrong = f"moved to {e.name}, not a usable endpoint then"
            else:
                pod, since = e.name, e.sent
            if wrong:
                verdict.failed.append(f"{flow.frontend} stream on {pod}: {wrong}: {e}")
    return verdict
