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

Servers (servers.py) run in node, client and every pod, on all their addresses
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
import itertools
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Self

from lace_proxy.demo.addresses import (
    CLIENT4,
    CLIENT6,
    ESCAPE_ICMP4,
    ESCAPE_ICMP6,
    EXTERNAL_CIDR4,
    EXTERNAL_CIDR6,
    FABRIC4,
    GW4,
    GW6,
    GWLINK_NODE4,
    GWLINK_NODE6,
    POD_CIDR4,
    POD_CIDR6,
    POD_GATEWAY4,
    POD_GATEWAY6,
    SERVICE_CIDR4,
    SERVICE_CIDR6,
    SINK_ICMP,
    UPLINK_NODE4,
    UPLINK_NODE6,
)
from lace_proxy.demo.forkserver import ForkServer, Server
from lace_proxy.demo.netns import (
    Host,
    Icmp,
    Netns,
    Reply,
    Result,
    Where,
    host_sysctls,
    list_netns,
    namespace_of,
    reachable,
    request_tcp,
    request_udp,
    run_checked,
    write_sysctls,
)

# Tests, the sandbox and the other testbeds import the whole kit from here.
__all__ = [
    "CLIENT4",
    "CLIENT6",
    "DEFAULT_PORTS",
    "ESCAPE_ICMP4",
    "ESCAPE_ICMP6",
    "EXTERNAL_CIDR4",
    "EXTERNAL_CIDR6",
    "FABRIC4",
    "GW4",
    "GW6",
    "GWLINK_NODE4",
    "GWLINK_NODE6",
    "MAX_PODS",
    "POD_CIDR4",
    "POD_CIDR6",
    "POD_GATEWAY4",
    "POD_GATEWAY6",
    "SERVICE_CIDR4",
    "SERVICE_CIDR6",
    "SINK_ICMP",
    "UPLINK_NODE4",
    "UPLINK_NODE6",
    "Host",
    "Icmp",
    "Netns",
    "Reply",
    "Result",
    "Testbed",
    "TestbedBase",
    "Where",
    "host_sysctls",
    "list_netns",
    "reachable",
    "remove_stale_namespaces",
    "request_tcp",
    "request_udp",
    "run_checked",
    "write_sysctls",
]

DEFAULT_PORTS = (80, 8080, 30080)
MAX_PODS = 99  # keeps namespace names within IFNAMSIZ-1 (15) characters

GW_SINK_RULES = """
table inet lace_testbed_sink {
    chain forward {
        type filter hook forward priority 0; policy accept;
        meta nfproto ipv4 reject with icmp type net-prohibited
        meta nfproto ipv6 reject with icmpv6 type reject-route
    }
}
"""

# "lp<pid hex>.<testbed no hex><role>". Testbed's roles: N(ode), C(lient), G(w), P<i> (pods).
# ClusterTestbed's: F(abric), Xf and Xn (the far and near clients), Na and Nb (nodes), and
# Pa1 Pa2 Pab Pb1 Pbb (pods: the node's letter, then the pod's number or b for blue).
# EgressTestbed's: E (the edge) and Pax (a pod of node-a outside the pod prefixes).
_NAME_PATTERN = re.compile(
    r"lp([0-9a-f]+)\.[0-9a-f]+(?:N|C|G|P[0-9]+|F|E|X[fn]|N[ab]|P[ab][12b]|Pax)"
)
_testbeds = itertools.count()


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
        self._servers: list[Server] = []
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
    ) -> Server:
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed by Server.stop)
        argv = [name, *map(str, ports)]
        if http_ports:
            argv += ["--http", *map(str, http_ports)]
        if echo_ports:
            argv += ["--echo", *map(str, echo_ports)]
        return ForkServer.spawn(host.ns.name, argv, stderr)

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
        full = ["ip", "netns", "exec", namespace_of(where).name, *argv]
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
