"""IPVS mode's model: virtual services, what each should be (`Target`), and which plans
want it (`Wanted`), computed from plans with no kernel access (kernel.py reads and writes
IPVS; backend.py syncs)."""

from __future__ import annotations

import math
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from operator import attrgetter
from typing import NamedTuple

from lace_proxy.table import Backend, Plan

PROTOCOLS = {"TCP": socket.IPPROTO_TCP, "UDP": socket.IPPROTO_UDP, "SCTP": 132}
PERSISTENT = 0x0001  # IP_VS_SVC_F_PERSISTENT
#: A backend's real server: (ip, port), read in C (a cold sync reads 127k at 10k services).
_SERVER = attrgetter("ip", "port")
#: The protocol number of every route lace-proxy makes for a service address (`ip route show
#: table local proto 145`), by which it finds them. The kernel reserves 0-4 and interprets
#: none above; iproute2's rt_protos names 8-18, 42, 99 and 186-192 (routing daemons), FRR
#: 186-199: 145 is none of them.
ROUTE_PROTOCOL = 145


@dataclass(frozen=True)
class IpvsSettings:
    """ipvs.*: the default scheduler, the dummy interface, NodePorts, graceful termination;
    lace.ipvs: how service addresses are made local."""

    scheduler: str = "rr"
    interface: str = "lace-ipvs0"
    #: lace.ipvs.serviceAddresses localRoutes: every service address is a `local` route in the
    #: local table; False (`interface`, kube-proxy's way): an address of `interface`.
    local_routes: bool = False
    #: The protocol number that marks a local route as this backend's; None: none is (the
    #: backend `cleanup --kube-proxy` removes kube-proxy's leftovers with: lace-proxy's routes
    #: are not among them).
    route_protocol: int | None = ROUTE_PROTOCOL
    node_port_range: tuple[int, int] = (30000, 32767)
    # Seconds a removed TCP real server may keep its connections; by default until they are
    # gone, as kube-proxy's graceful termination (a forced deletion resets live ones).
    grace_period: float = math.inf
    strict_arp: bool = False
    #: ipvs.excludeCIDRs: stale virtual services on these addresses are left alone by syncs
    #: and cleanup (kube-proxy's meaning); the table's own services are still programmed.
    exclude_cidrs: tuple[str, ...] = ()
    #: ipvs.tcpTimeout, tcpFinTimeout, udpTimeout in seconds; 0 keeps the kernel's value.
    tcp_timeout: int = 0
    tcp_fin_timeout: int = 0
    udp_timeout: int = 0

    def __post_init__(self) -> None:
        if self.local_routes and self.route_protocol is None:
            raise ValueError("local routes need a route protocol to be found by")


class VirtualServer(NamedTuple):
    protocol: str  # TCP | UDP | SCTP
    address: str
    port: int


class Target(NamedTuple):
    """What a virtual service should be: scheduler, persistence and real servers."""

    scheduler: str
    persistence: int  # ClientIP affinity timeout in seconds; 0: none
    servers: frozenset[tuple[str, int]]


#: ipvsadm's names of the forwarding methods (IP_VS_CONN_F_FWD_MASK of a real server's flags).
FORWARD_METHODS = {0: "Masq", 1: "Local", 2: "Tunnel", 3: "Route", 4: "Bypass"}


class RealServer(NamedTuple):
    """A real server as IPVS holds it, with what `ipvsadm -Ln` shows of it."""

    address: str
    port: int
    forward: str  # FORWARD_METHODS' names
    weight: int  # 0: draining (no new connections)
    active: int
    inactive: int


@dataclass(frozen=True)
class KernelView:
    """Everything IPVS holds (ours and others'), with the addresses that decide which virtual
    services are ours and where NodePorts go: what `lace-proxy kernel` compares with the
    table. A service's Target lists its serving real servers (weight > 0), as a sync sees
    them; `real_servers` has all of them in detail."""

    services: dict[VirtualServer, Target]
    real_servers: dict[VirtualServer, tuple[RealServer, ...]]
    #: The service addresses the node holds, either way: the dummy interface's and those of
    #: this backend's local routes (both are ours, as a sync sees them).
    service_addresses: frozenset[str]
    node_addresses: tuple[str, ...]  # where NodePort virtual services go


def render(
    plan: Plan, node_addresses: Iterable[str], default_scheduler: str
) -> list[tuple[VirtualServer, int, Target]]:
    """A plan's virtual services, each with its rank (0: an address frontend, 1: a NodePort on
    a node address): its ClusterIP, ExternalIPs and LB IPs, and its NodePort on each node
    address of the plan's family."""
    scheduler = getattr(plan, "scheduler", "") or default_scheduler

    def target(backends: Iterable[Backend], verdict: str | None) -> Target:
        servers = frozenset() if verdict else frozenset(map(_SERVER, backends))
        return Target(scheduler, plan.affinity_timeout, servers)

    internal_backends = plan.internal_backends
    internal = target(internal_backends, plan.internal_verdict)
    out = [(VirtualServer(plan.protocol, plan.cluster_ip, plan.port), 0, internal)]
    externals = (*plan.external_ips, *plan.lb_ips)
    if not externals and not plan.node_port:  # most plans: no external frontend to render
        return out
    external_backends = plan.external_backends
    if external_backends is internal_backends and plan.external_verdict == plan.internal_verdict:
        external = internal  # both policies Cluster (most): the same target, made once
    else:
        external = target(external_backends, plan.external_verdict)
    for address in externals:
        out.append((VirtualServer(plan.protocol, address, plan.port), 0, external))
    if plan.node_port:
        for address in node_addresses:
            if address_family(address) == plan.family:
                out.append((VirtualServer(plan.protocol, address, plan.node_port), 1, external))
    return out


class Wanted:
    """Which plans want each virtual service, and what it should be.

    Two plans can render the same virtual service: a NodePort on a node address that is
    also another service's ExternalIP (same port). The address frontend wins, as in nftables
    mode (service-ips is looked up before service-nodeports), then the lower plan id; when
    the winner goes, the other takes over instead of the service vanishing.
    """

    def __init__(self, node_addresses: Iterable[str], scheduler: str) -> None:
        self.node_addresses = tuple(node_addresses)
        self.scheduler = scheduler
        self._wants: dict[VirtualServer, dict[str, tuple[int, Target]]] = {}
        # By plan id: the plan as added, and the virtual services it rendered.
        self._of_plan: dict[str, tuple[Plan, list[VirtualServer]]] = {}

    def add(self, plan: Plan) -> list[VirtualServer]:
        """Record a plan's virtual services; returns them."""
        rendered = render(plan, self.node_addresses, self.scheduler)
        for vs, rank, target in rendered:
            self._wants.setdefault(vs, {})[plan.id] = (rank, target)
        services = [vs for vs, _, _ in rendered]
        self._of_plan[plan.id] = (plan, services)
        return services

    def update(self, plans: Iterable[Plan]) -> None:
        """Hold exactly `plans`, rendering only those not already recorded as the very same
        object: the table hands out an unchanged plan as the same object, so a periodic
        full sync renders what changed, not 30k plans (at 10k services, rendering all of
        them was ~2 s of a resync in the test VM)."""
        current = {plan.id: plan for plan in plans}
        for pid, (old, _) in list(self._of_plan.items()):
            if current.get(pid) is not old:
                self.remove(old)
        for pid, plan in current.items():
            if pid not in self._of_plan:
                self.add(plan)

    def remove(self, plan: Plan) -> list[VirtualServer]:
        """Forget a plan (as it was added); returns the virtual services it wanted."""
        _, services = self._of_plan.pop(plan.id, (plan, []))
        for vs in services:
            wants = self._wants[vs]
            wants.pop(plan.id, None)
            if not wants:
                del self._wants[vs]
        return services

    def target(self, vs: VirtualServer) -> Target | None:
        wants = self._wants.get(vs)
        if not wants:
            return None
        if len(wants) == 1:  # almost every virtual service: one plan renders it
            ((_, target),) = wants.values()
            return target
        _, _, target = min((rank, pid, t) for pid, (rank, t) in wants.items())
        return target

    def plans(self, vs: VirtualServer) -> list[str]:
        """The plans wanting a virtual service, the one it serves first."""
        return [pid for _, pid in sorted((r, pid) for pid, (r, _) in self._wants[vs].items())]

    def desired(self) -> dict[VirtualServer, Target]:
        return {vs: t for vs in self._wants if (t := self.target(vs)) is not None}


def addresses_of(plan: Plan) -> set[str]:
    """The service addresses a plan needs local (NodePorts use the node's own)."""
    return {plan.cluster_ip, *plan.external_ips, *plan.lb_ips}


def address_family(address: str) -> int:
    return 6 if ":" in address else 4
