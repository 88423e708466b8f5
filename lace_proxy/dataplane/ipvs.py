"""The IPVS backend (`mode: ipvs`): IPVS load-balances, nftables does everything else.

As kube-proxy's IPVS mode: every ClusterIP, ExternalIP and load-balancer IP is an address of
a dummy interface (`lace-ipvs0`, kept down), so packets to it are delivered locally, where
IPVS picks a real server and translates (NAT forwarding, set explicitly: pyroute2 defaults
to direct routing). A NodePort is a virtual service on each node address. nftables keeps its
table with translation switched off (`NftablesSettings.translate`): access control (the Lace
network model), reject/drop for services without (local) endpoints, source ranges,
masquerade marks and hairpin, and a filter that keeps other ports of service addresses away
from the node's own sockets.

Sync is a diff against what IPVS holds (a dump), never a flush, so a restart adopts the
previous process's services and established connections carry on. A new address goes
onto the dummy interface only once IPVS holds its virtual services with their real servers
(`_add_to_dummy`), so a frontend is never the node's own without them. A real server that
leaves is first set to weight 0 (no new connections) and deleted once its connections have
drained (as kube-proxy), or after `grace_period` if one is set. Ownership: virtual services
on the dummy interface's addresses, and on node addresses within the NodePort range; nothing
else is touched.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import math
import os
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from pyroute2 import IPVS, IPRoute, IPVSDest, IPVSService
from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST, genlmsg
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.generic import ipvs as genl_ipvs

from lace_proxy.dataplane.base import NO_NETWORKS
from lace_proxy.dataplane.conntrack import Filter, delete_requests
from lace_proxy.dataplane.netlink import (
    NETLINK_GENERIC,
    NETLINK_NETFILTER,
    NetlinkSocket,
    send_together,
)
from lace_proxy.dataplane.nft import enter_netns
from lace_proxy.dataplane.nftables import NftablesBackend
from lace_proxy.networks.graph import NetworkLayout
from lace_proxy.table import Backend, Changeset, Plan

log = logging.getLogger(__name__)

PROTOCOLS = {"TCP": socket.IPPROTO_TCP, "UDP": socket.IPPROTO_UDP, "SCTP": 132}
MASQUERADE = 0  # IP_VS_CONN_F_MASQ: NAT forwarding
PERSISTENT = 0x0001  # IP_VS_SVC_F_PERSISTENT
#: The sysctls kube-proxy's IPVS mode sets: conntrack entries for IPVS connections (so that
#: nftables can masquerade them), and no new connections to a real server that is gone.
SYSCTLS = {
    "net/ipv4/vs/conntrack": 1,
    "net/ipv4/vs/expire_nodest_conn": 1,
    "net/ipv4/vs/expire_quiescent_template": 1,
    "net/ipv4/ip_forward": 1,
}
STRICT_ARP = {"net/ipv4/conf/all/arp_ignore": 1, "net/ipv4/conf/all/arp_announce": 2}
#: IPVS's table as text, in the reading thread's network namespace (the kernel thread enters
#: the node's namespace with setns; /proc/net would follow the process's).
PROC_IP_VS = "/proc/thread-self/net/ip_vs"
T = TypeVar("T")


@dataclass(frozen=True)
class IpvsSettings:
    """ipvs.*: the default scheduler, the dummy interface, NodePorts, graceful termination."""

    scheduler: str = "rr"
    interface: str = "lace-ipvs0"
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
    dummy_addresses: frozenset[str]  # held by the dummy interface
    node_addresses: tuple[str, ...]  # where NodePort virtual services go


def render(
    plan: Plan, node_addresses: Iterable[str], default_scheduler: str
) -> list[tuple[VirtualServer, int, Target]]:
    """A plan's virtual services, each with its rank (0: an address frontend, 1: a NodePort on
    a node address): its ClusterIP, ExternalIPs and LB IPs, and its NodePort on each node
    address of the plan's family."""
    scheduler = getattr(plan, "scheduler", "") or default_scheduler

    def target(backends: Iterable[Backend], verdict: str | None) -> Target:
        servers = frozenset() if verdict else frozenset((b.ip, b.port) for b in backends)
        return Target(scheduler, plan.affinity_timeout, servers)

    internal = target(plan.internal_backends, plan.internal_verdict)
    out = [(VirtualServer(plan.protocol, plan.cluster_ip, plan.port), 0, internal)]
    external = target(plan.external_backends, plan.external_verdict)
    for address in (*plan.external_ips, *plan.lb_ips):
        out.append((VirtualServer(plan.protocol, address, plan.port), 0, external))
    if plan.node_port:
        for address in node_addresses:
            if _family(address) == plan.family:
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
        self._of_plan: dict[str, list[VirtualServer]] = {}

    def add(self, plan: Plan) -> list[VirtualServer]:
        """Record a plan's virtual services; returns them."""
        rendered = render(plan, self.node_addresses, self.scheduler)
        for vs, rank, target in rendered:
            self._wants.setdefault(vs, {})[plan.id] = (rank, target)
        self._of_plan[plan.id] = [vs for vs, _, _ in rendered]
        return self._of_plan[plan.id]

    def remove(self, plan: Plan) -> list[VirtualServer]:
        """Forget a plan (as it was added); returns the virtual services it wanted."""
        services = self._of_plan.pop(plan.id, [])
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
        _, _, target = min((rank, pid, t) for pid, (rank, t) in wants.items())
        return target

    def plans(self, vs: VirtualServer) -> list[str]:
        """The plans wanting a virtual service, the one it serves first."""
        return [pid for _, pid in sorted((r, pid) for pid, (r, _) in self._wants[vs].items())]

    def desired(self) -> dict[VirtualServer, Target]:
        return {vs: t for vs in self._wants if (t := self.target(vs)) is not None}


def addresses_of(plan: Plan) -> set[str]:
    """The addresses a plan needs on the dummy interface (NodePorts use the node's own)."""
    return {plan.cluster_ip, *plan.external_ips, *plan.lb_ips}


def _family(address: str) -> int:
    return 6 if ":" in address else 4


class IpvsBackend:
    """Programs plans into IPVS (and the rest into nftables); never decides policy."""

    def __init__(
        self,
        settings: IpvsSettings,
        nft: NftablesBackend,
        netns: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if nft.settings.translate:
            raise ValueError("the nftables part of IPVS mode must not translate")
        self.settings = settings
        self.nft = nft
        self.netns = netns
        self._clock = clock
        # Kernel calls run on one thread that lives in the namespace (tests; production: here).
        self._worker = (
            ThreadPoolExecutor(1, initializer=enter_netns, initargs=(netns,)) if netns else None
        )
        self._exclude = tuple(ipaddress.ip_network(c, strict=False) for c in settings.exclude_cidrs)
        self._programmed: dict[VirtualServer, Target] = {}
        self._wanted = Wanted((), settings.scheduler)  # set by each full sync
        self._address_refs: Counter[str] = Counter()  # dummy address -> plans using it
        self._node_addresses: tuple[str, ...] = ()
        # Real servers draining at weight 0, with their deadlines, per virtual service.
        self._terminating: dict[VirtualServer, dict[tuple[str, int], float]] = {}
        self.last_changes = 0  # IPVS and address operations of the last sync (0: converged)

    # -- the Dataplane protocol --

    def full_sync(
        self,
        plans: Iterable[Plan],
        changes: Changeset | None = None,
        layout: NetworkLayout = NO_NETWORKS,
    ) -> int:
        """nftables in full, then IPVS and the dummy's addresses by diff against the kernel."""
        plans = list(plans)
        count = self.nft.full_sync(plans, changes, layout)
        self.last_changes = self._run(self._reconcile, plans)
        return count + self.last_changes

    def apply(self, changes: Changeset, layout: NetworkLayout = NO_NETWORKS) -> int:
        """nftables' transaction, then the changed plans' virtual services."""
        count = self.nft.apply(changes, layout)
        self.last_changes = self._run(self._apply, changes)
        return count + self.last_changes

    def node_addresses_changed(self, addresses: tuple[str, ...]) -> bool:
        """As nftables mode (which renders them); the addresses NodePort virtual services
        use are read from the kernel at each full sync."""
        return self.nft.node_addresses_changed(addresses)

    def cleanup(self) -> bool:
        """Remove every virtual service of ours, the dummy interface and the nftables table."""
        self.remove_ipvs()
        return self.nft.cleanup()

    def remove_ipvs(self) -> int:
        """Remove every virtual service of ours and the dummy interface; returns how many."""
        return self._run(self._cleanup)

    def held(self) -> dict[VirtualServer, Target]:
        """What IPVS holds (ours and others'), for the CLI and tests."""

        def dump() -> dict[VirtualServer, Target]:
            with IPVS() as ipvs:
                return {vs: target for vs, (target, _) in _dump(ipvs).items()}

        return self._run(dump)

    def inspect(self) -> KernelView:
        """What IPVS holds in detail, the dummy's addresses and the node addresses a sync
        would put NodePorts on, read as a sync reads them (`_read`); changes nothing (not
        even the dummy interface), so the CLI can show and diff a live node."""

        def read() -> KernelView:
            with IPRoute() as ipr:
                links = ipr.link_lookup(ifname=self.settings.interface)
                index = int(links[0]) if links else -1
                dummy = _held_addresses(ipr, index) if links else set()
                nodes = self._local_addresses(ipr, index)
            with IPVS() as ipvs:
                held = _read(ipvs)
            services = {vs: _target(vs_held) for vs, vs_held in held.items()}
            details = {vs: servers for vs, (_, _, servers) in held.items()}
            return KernelView(services, details, frozenset(dummy), nodes)

        return self._run(read)

    def owns(
        self, vs: VirtualServer, dummy_addresses: Collection[str], node_addresses: Collection[str]
    ) -> bool:
        """The ownership rule: a virtual service on a dummy address, or on a node address
        within the NodePort range, is ours (everything else is left alone)."""
        if self._excluded(vs.address):
            return False
        low, high = self.settings.node_port_range
        return vs.address in dummy_addresses or (
            vs.address in node_addresses and low <= vs.port <= high
        )

    # -- on the kernel's thread --

    def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._worker is None:
            return fn(*args)
        return self._worker.submit(fn, *args).result()

    def _reconcile(self, plans: list[Plan]) -> int:
        _write_sysctls({**SYSCTLS, **(STRICT_ARP if self.settings.strict_arp else {})})
        s = self.settings
        timeouts = (s.tcp_timeout, s.tcp_fin_timeout, s.udp_timeout)
        if any(timeouts):
            with IPVS() as ipvs:
                _set_timeouts(ipvs, timeouts)
        refs: Counter[str] = Counter()
        for plan in plans:
            refs.update(addresses_of(plan))
        with IPRoute() as ipr:
            index = _dummy(ipr, self.settings.interface)
            self._node_addresses = self._local_addresses(ipr, index)
            held = _held_addresses(ipr, index)
        self._address_refs = refs
        wanted = Wanted(self._node_addresses, self.settings.scheduler)
        for plan in plans:
            wanted.add(plan)
        desired = wanted.desired()
        now = self._clock()
        count = 0
        with IPVS() as ipvs:
            held_services = {}
            ours = set(refs) | held  # also the addresses of services deleted meanwhile
            for vs, (target, draining) in _dump(ipvs).items():
                # Ours: by address, wanted now, or made by this process (e.g. a NodePort on
                # an address the node no longer has).
                made = vs in self._programmed and not self._excluded(vs.address)
                if vs in desired or self._owns(vs, ours) or made:
                    held_services[vs] = target
                    for server in draining:  # e.g. left by a previous process: finish them
                        self._terminating.setdefault(vs, {}).setdefault(
                            server, now + self.settings.grace_period
                        )
            try:
                count += self._converge(ipvs, held_services, desired)
            finally:
                count += self._add_to_dummy(set(refs) - held)
        self._programmed, self._wanted = desired, wanted
        with IPRoute() as ipr:  # after IPVS: the addresses say which services are ours
            count += _del_addresses(ipr, index, held - set(refs))
        return count

    def _apply(self, changes: Changeset) -> int:
        wanted = self._wanted
        touched: set[VirtualServer] = set()
        delta: Counter[str] = Counter()
        for plan in (*changes.removed, *(old for old, _ in changes.updated)):
            touched.update(wanted.remove(plan))
            delta.subtract(addresses_of(plan))
        for plan in (*changes.added, *(new for _, new in changes.updated)):
            touched.update(wanted.add(plan))
            delta.update(addresses_of(plan))
        after = {vs: t for vs in touched if (t := wanted.target(vs)) is not None}
        refs = self._address_refs
        appear = {a for a, d in delta.items() if d > 0 and refs[a] == 0}
        vanish = {a for a, d in delta.items() if d < 0 and refs[a] + d <= 0}
        count = 0
        held = {vs: self._programmed[vs] for vs in touched if vs in self._programmed}
        with IPVS() as ipvs:
            try:
                count += self._converge(ipvs, held, after, only=touched)
            finally:
                count += self._add_to_dummy(appear)
        for vs in touched - set(after):
            self._programmed.pop(vs, None)
        self._programmed.update(after)
        for address, d in delta.items():
            refs[address] += d
            if refs[address] <= 0:
                del refs[address]
        if vanish:
            with IPRoute() as ipr:
                index = _dummy(ipr, self.settings.interface)
                count += _del_addresses(ipr, index, vanish)
        return count

    def _add_to_dummy(self, addresses: set[str]) -> int:
        """Put new service addresses on the dummy interface; called once IPVS holds their
        virtual services with every real server (also when the kernel refused some other
        operation). An address makes its frontends the node's own at once: added first, a
        new connection reached the node's own sockets on that port (or was reset), then a
        virtual service with no real server yet (IPVS refused it). Until it is added, a new
        address is routed as a foreign one (nftables refuses connections to a ClusterIP that
        is not local: cluster-ips-check)."""
        if not addresses:
            return 0
        with IPRoute() as ipr:
            return _add_addresses(ipr, _dummy(ipr, self.settings.interface), addresses)

    def _converge(
        self,
        ipvs: Any,
        held: dict[VirtualServer, Target],
        desired: dict[VirtualServer, Target],
        only: set[VirtualServer] | None = None,
    ) -> int:
        """Make the virtual services in `held` (ours; all of them, or those in `only`) look
        like `desired`, then finish real servers whose draining is over."""
        count = 0
        now = self._clock()
        failed: list[str] = []
        udp_gone: list[tuple[VirtualServer, tuple[str, int]]] = []
        for vs, want in desired.items():
            try:
                count += self._converge_one(ipvs, vs, held.get(vs), want, now, udp_gone)
            except RuntimeError as exc:  # one service the kernel refuses stops no other
                failed.append(str(exc))
        count += self._remove_udp(ipvs, udp_gone, failed)
        for vs, have in held.items():
            if vs in desired or (only is not None and vs not in only):
                continue
            self._terminating.pop(vs, None)
            try:
                _call(ipvs.service, "del", service=_service(vs, have))
                count += 1
            except RuntimeError as exc:
                failed.append(str(exc))
        for vs in sorted(self._terminating):
            draining = self._terminating[vs]
            conns = _connections(ipvs, vs)
            for server in sorted(draining):
                if conns.get(server, 0) == 0 or now >= draining[server]:
                    del draining[server]
                    if server in conns:
                        _call(ipvs.dest, "del", service=_key(vs), dest=_dest(server, 0))
                        count += 1
            if not draining:
                del self._terminating[vs]
        if failed:  # the others are programmed; the sync counts as failed and is retried
            raise RuntimeError(f"{len(failed)} IPVS operations failed: {'; '.join(failed[:3])}")
        return count

    def _remove_udp(
        self, ipvs: Any, gone: list[tuple[VirtualServer, tuple[str, int]]], failed: list[str]
    ) -> int:
        """Delete UDP real servers at once (no graceful termination for UDP, as kube-proxy):
        a flow's next packet then finds its connection's server gone and is balanced anew.

        IPVS drops that packet instead if it still has the flow's old, confirmed conntrack
        entry (ip_vs_in, expire_nodest_conn: "old conntrack"), until the kernel's own flush
        of the server's connections deletes the entry a moment later. So:
        1. The leaving servers get weight 0, so that no new flow picks them; their flows
           keep them, and the listing that follows holds every flow they will ever have.
        2. The replies on their way from those servers are rescued (nftables translates
           them once IPVS no longer does), and the flows' deletion requests are encoded.
        3. With nothing in between (netlink.send_together): the flows' entries are deleted,
           the servers, then the flows' entries again (those a packet made in between, sent
           on to the old server, which is still there). A flow loses a packet only if it
           sends two inside that moment.
        Whatever flow the listing missed is deleted last, by endpoint (`conntrack -D`)."""
        if not gone:
            return 0
        family = ipvs.prid  # the IPVS generic netlink family's id, as the kernel numbers it
        with NetlinkSocket(NETLINK_GENERIC, answers=len(gone)) as genl:
            send_together([(genl, _dest_requests(family, genl_ipvs.IPVS_CMD_SET_DEST, gone))])
            for (vs, server), why in _refusals(gone, genl.answers()):
                log.warning("IPVS %s: weight 0 for real server %s refused: %s", vs, server, why)
            flows = self.nft.rescue_udp_replies([_flows_to(vs, server) for vs, server in gone])
            first = delete_requests(flows, 1)
            again = delete_requests(flows, len(flows) + 1)
            servers = _dest_requests(family, genl_ipvs.IPVS_CMD_DEL_DEST, gone)
            with NetlinkSocket(NETLINK_NETFILTER, answers=2 * len(flows)) as ct:
                started = time.perf_counter()
                send_together(
                    [*((ct, c) for c in first), (genl, servers), *((ct, c) for c in again)]
                )
                log.debug(
                    "IPVS: %d UDP real servers and %d flows' entries deleted in %.3f ms",
                    len(gone),
                    len(flows),
                    (time.perf_counter() - started) * 1000,
                )
                for sequence, code in ct.answers().items():
                    if sequence <= len(flows) and code != errno.ENOENT:
                        log.warning("conntrack: deleting %s failed: %s", flows[sequence - 1], code)
            refused = _refusals(gone, genl.answers())
        failed += [f"IPVS del real server {s} of {vs} failed: {c}" for (vs, s), c in refused]
        if self.nft.conntrack is not None:
            self.nft.conntrack.delete_udp(sorted({_flows_to(None, s) for _, s in gone}))
        return len(gone) - len(refused)

    def _converge_one(
        self,
        ipvs: Any,
        vs: VirtualServer,
        have: Target | None,
        want: Target,
        now: float,
        udp_gone: list[tuple[VirtualServer, tuple[str, int]]],
    ) -> int:
        """One virtual service to `want`; its UDP real servers to delete go to `udp_gone`."""
        count = 0
        service = _service(vs, want)
        if have is None:
            _call(ipvs.service, "add", service=service)
            count += 1
            have = Target(want.scheduler, want.persistence, frozenset())
        elif (have.scheduler, have.persistence) != (want.scheduler, want.persistence):
            _call(ipvs.service, "set", service=service)
            count += 1
        draining = self._terminating.get(vs, {})
        for server in sorted(want.servers - have.servers):
            if not _unicast(server[0]):
                log.warning("IPVS %s: real server %s is not a unicast address; skipped", vs, server)
                continue
            back = draining.pop(server, None) is not None
            _call(ipvs.dest, "set" if back else "add", service=service, dest=_dest(server, 1))
            count += 1
        for server in sorted(have.servers - want.servers):
            if vs.protocol == "UDP":
                udp_gone.append((vs, server))  # deleted at once: _remove_udp
                continue
            # No new connections; deleted once drained (below, or at a later sync).
            _call(ipvs.dest, "set", service=service, dest=_dest(server, 0))
            self._terminating.setdefault(vs, {})[server] = now + self.settings.grace_period
            count += 1
        if vs in self._terminating and not self._terminating[vs]:
            del self._terminating[vs]
        return count

    def _owns(self, vs: VirtualServer, dummy_addresses: set[str]) -> bool:
        return self.owns(vs, dummy_addresses, self._node_addresses)

    def _excluded(self, address: str) -> bool:
        ip = ipaddress.ip_address(address)
        return any(ip in net for net in self._exclude if net.version == ip.version)

    def _local_addresses(
        self, ipr: Any, dummy_index: int, *, every: bool = False
    ) -> tuple[str, ...]:
        """The node's addresses that NodePorts answer on (as nftables' NodePort rule); with
        `every`, all that NodePorts may ever have used (cleanup: no Node object, no config)."""
        nft = self.nft.settings
        out = []
        for msg in ipr.get_addr():
            # IFA_LOCAL is the node's own end of a point-to-point link (IFA_ADDRESS the peer's).
            address = str(ipaddress.ip_address(msg.get("local") or msg.get("address")))
            ip = ipaddress.ip_address(address)
            if msg["index"] == dummy_index or ip.is_loopback or ip.is_link_local:
                continue
            if every:
                out.append(address)
                continue
            if nft.node_port_primary and address not in self.nft.renderer.node_addresses:
                continue
            if nft.node_port_cidrs and not any(
                ip in ipaddress.ip_network(c, strict=False)
                for c in nft.node_port_cidrs
                if ipaddress.ip_network(c, strict=False).version == ip.version
            ):
                continue
            out.append(address)
        return tuple(sorted(set(out)))

    def _cleanup(self) -> int:
        with IPRoute() as ipr:
            links = ipr.link_lookup(ifname=self.settings.interface)
            dummy_addresses = (
                {str(ipaddress.ip_address(m.get("address"))) for m in ipr.get_addr(index=links[0])}
                if links
                else set()
            )
            self._node_addresses = self._local_addresses(ipr, links[0] if links else -1, every=True)
            if links:
                ipr.link("del", index=links[0])
        count = 0
        with IPVS() as ipvs:
            for vs, (target, _) in _dump(ipvs).items():
                made = vs in self._programmed and not self._excluded(vs.address)
                if self._owns(vs, dummy_addresses) or made:
                    _call(ipvs.service, "del", service=_service(vs, target))
                    count += 1
        self._programmed.clear()
        self._terminating.clear()
        return count


class _ConfigMsg(genlmsg):
    """IPVS_CMD_SET/GET_CONFIG with the timeouts as u32 (pyroute2's ipvsmsg has them as
    raw bytes and no call that sends them)."""

    prefix = "IPVS_CMD_ATTR_"
    nla_map = (
        ("IPVS_CMD_ATTR_UNSPEC", "none"),
        ("IPVS_CMD_ATTR_SERVICE", "none"),
        ("IPVS_CMD_ATTR_DEST", "none"),
        ("IPVS_CMD_ATTR_DAEMON", "none"),
        ("IPVS_CMD_ATTR_TIMEOUT_TCP", "uint32"),
        ("IPVS_CMD_ATTR_TIMEOUT_TCP_FIN", "uint32"),
        ("IPVS_CMD_ATTR_TIMEOUT_UDP", "uint32"),
    )


TIMEOUT_ATTRS = (
    "IPVS_CMD_ATTR_TIMEOUT_TCP",
    "IPVS_CMD_ATTR_TIMEOUT_TCP_FIN",
    "IPVS_CMD_ATTR_TIMEOUT_UDP",
)


def _config_msg(cmd: int, attrs: list[tuple[str, int]]) -> _ConfigMsg:
    msg = _ConfigMsg()
    msg["cmd"] = cmd
    msg["version"] = genl_ipvs.GENL_VERSION
    msg["attrs"] = attrs
    return msg


def timeouts(ipvs: Any) -> tuple[int, int, int]:
    """IPVS's tcp, tcpfin and udp timeouts in seconds (`ipvsadm -L --timeout`)."""
    request = _config_msg(genl_ipvs.IPVS_CMD_GET_CONFIG, [])
    (reply,) = ipvs.nlm_request(request, msg_type=ipvs.prid, msg_flags=NLM_F_REQUEST)
    raw = dict(reply.get("attrs"))  # decoded as ipvsmsg: "84:03:00:00", host byte order
    values = [bytes.fromhex(str(raw[name]).replace(":", "")) for name in TIMEOUT_ATTRS]
    t = tuple(int.from_bytes(v, sys.byteorder) for v in values)
    return t[0], t[1], t[2]


def _set_timeouts(ipvs: Any, wanted: tuple[int, int, int]) -> None:
    """Set the non-zero timeouts that differ (0 keeps the kernel's value, as kube-proxy)."""
    current = timeouts(ipvs)
    if all(w in (0, c) for w, c in zip(wanted, current, strict=True)):
        return
    attrs = [(name, w) for name, w in zip(TIMEOUT_ATTRS, wanted, strict=True) if w]
    request = _config_msg(genl_ipvs.IPVS_CMD_SET_CONFIG, attrs)
    flags = NLM_F_REQUEST | NLM_F_ACK
    tuple(ipvs.nlm_request(request, msg_type=ipvs.prid, msg_flags=flags))
    log.info("IPVS timeouts (tcp, tcpfin, udp) set to %s (were %s)", wanted, current)


def _unicast(address: str) -> bool:
    """IPVS refuses multicast, unspecified and IPv6 link-local real servers."""
    ip = ipaddress.ip_address(address)
    return not (ip.is_multicast or ip.is_unspecified or (ip.version == 6 and ip.is_link_local))


def _call(fn: Callable[..., Any], command: str, **kwargs: Any) -> None:
    try:
        fn(command, **kwargs)
    except NetlinkError as exc:
        what = ", ".join(f"{k}={dict(v)}" for k, v in kwargs.items())
        raise RuntimeError(f"IPVS {command} failed ({exc}): {what}") from exc


def _service(vs: VirtualServer, target: Target) -> Any:
    persistent = PERSISTENT if target.persistence else 0
    fields: dict[str, Any] = {
        "addr": vs.address,
        "port": vs.port,
        "protocol": PROTOCOLS[vs.protocol],
        "sched_name": target.scheduler,
        "flags": {"flags": persistent, "mask": 0xFFFFFFFF},
        "timeout": target.persistence,
    }
    if _family(vs.address) == 6:
        fields["netmask"] = "128.0.0.0"  # the prefix length 128, as a host-order u32
    return IPVSService(**fields)


def _flows_to(vs: VirtualServer | None, server: tuple[str, int]) -> Filter:
    """The conntrack filter of a virtual service's flows to one real server, or of all its
    flows (`vs` None). IPVS mode keeps conntrack entries, their reply tuple the real
    server's (net.ipv4.vs.conntrack)."""
    family = ("-f", "ipv6") if ":" in server[0] else ()
    frontend = () if vs is None else ("--orig-dst", vs.address, "--orig-port-dst", str(vs.port))
    return (*family, *frontend, "--reply-src", server[0], "--reply-port-src", str(server[1]))


def _dest_requests(
    family: int, command: int, servers: list[tuple[VirtualServer, tuple[str, int]]]
) -> bytes:
    """One IPVS request per real server (weight 0, for IPVS_CMD_SET_DEST), numbered from 1
    in the order given, each acknowledged."""
    out = []
    for sequence, (vs, server) in enumerate(servers, 1):
        msg = genl_ipvs.ipvsmsg()
        msg["cmd"] = command
        msg["version"] = genl_ipvs.GENL_VERSION
        msg["attrs"] = [
            ("IPVS_CMD_ATTR_SERVICE", _key(vs).dump_key()),
            ("IPVS_CMD_ATTR_DEST", _dest(server, 0).dump_nla()),
        ]
        msg["header"]["type"] = family
        msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK
        msg["header"]["sequence_number"] = sequence
        msg.encode()
        out.append(bytes(msg.data))
    return b"".join(out)


def _refusals(
    servers: list[tuple[VirtualServer, tuple[str, int]]], answers: dict[int, int]
) -> list[tuple[tuple[VirtualServer, tuple[str, int]], str]]:
    """The requests of `_dest_requests` the kernel refused, or did not answer, with why."""
    out = []
    for sequence, pair in enumerate(servers, 1):
        code = answers.get(sequence)
        if code != 0:
            why = "no answer" if code is None else f"{errno.errorcode.get(code, code)}"
            out.append((pair, why))
    return out


def _dest(server: tuple[str, int], weight: int) -> Any:
    return IPVSDest(addr=server[0], port=server[1], fwd_method=MASQUERADE, weight=weight)


def _key(vs: VirtualServer) -> Any:
    """The fields that name a virtual service (for its real servers' commands)."""
    return IPVSService(addr=vs.address, port=vs.port, protocol=PROTOCOLS[vs.protocol])


def _dests(ipvs: Any, vs: VirtualServer) -> list[dict[str, Any]]:
    return [dict(m.get("IPVS_CMD_ATTR_DEST")["attrs"]) for m in ipvs.dest("dump", service=_key(vs))]


def _persistence(msg: Any) -> int:
    """A dumped service's persistence timeout (0: not persistent), from its raw attributes."""
    attrs = dict(msg.get("IPVS_CMD_ATTR_SERVICE")["attrs"])
    flags = attrs.get("IPVS_SVC_ATTR_FLAGS", {})
    flags = flags.get("flags", 0) if isinstance(flags, dict) else int(flags)
    return int(attrs.get("IPVS_SVC_ATTR_TIMEOUT", 0)) if flags & PERSISTENT else 0


def _real_server(d: dict[str, Any]) -> RealServer:
    fwd = int(d.get("IPVS_DEST_ATTR_FWD_METHOD", MASQUERADE)) & 0x7
    return RealServer(
        str(d["IPVS_DEST_ATTR_ADDR"]),
        int(d["IPVS_DEST_ATTR_PORT"]),
        FORWARD_METHODS.get(fwd, str(fwd)),
        int(d.get("IPVS_DEST_ATTR_WEIGHT", 1)),
        int(d.get("IPVS_DEST_ATTR_ACTIVE_CONNS", 0)),
        int(d.get("IPVS_DEST_ATTR_INACT_CONNS", 0)),
    )


def _connections(ipvs: Any, vs: VirtualServer) -> dict[tuple[str, int], int]:
    """Each real server's connections (active and inactive) under a virtual service."""
    return {(r.address, r.port): r.active + r.inactive for r in map(_real_server, _dests(ipvs, vs))}


def _services(ipvs: Any) -> Iterator[tuple[VirtualServer, str, int]]:
    """Every address virtual service IPVS holds (one netlink dump), with its scheduler and
    persistence read from the raw attributes; fwmark services are left out."""
    names = {number: name for name, number in PROTOCOLS.items()}
    for msg in ipvs.service("dump"):
        attrs = dict(msg.get("IPVS_CMD_ATTR_SERVICE")["attrs"])
        protocol = names.get(attrs.get("IPVS_SVC_ATTR_PROTOCOL", 0))
        if attrs.get("IPVS_SVC_ATTR_FWMARK") or protocol is None:
            continue
        vs = VirtualServer(
            protocol, str(attrs["IPVS_SVC_ATTR_ADDR"]), int(attrs["IPVS_SVC_ATTR_PORT"])
        )
        yield vs, str(attrs.get("IPVS_SVC_ATTR_SCHED_NAME", "")), _persistence(msg)


def virtual_services() -> list[VirtualServer]:
    """Every address virtual service IPVS holds here (the calling thread's namespace)."""
    with IPVS() as ipvs:
        return [vs for vs, _, _ in _services(ipvs)]


def _real_servers(path: str = PROC_IP_VS) -> dict[VirtualServer, list[RealServer]]:
    """Every virtual service's real servers, from one read of /proc/net/ip_vs (of the
    calling thread's namespace): a dump per virtual service would cost a netlink round trip
    each. Its lines: "TCP  0A600001:0050 rr ..." (IPv6: "[fd00:0000:...]:0050"), then
    "  -> 0A010001:1F90      Masq    1      0          0" (forward, weight, conns)."""
    out: dict[VirtualServer, list[RealServer]] = {}
    current: list[RealServer] | None = None
    with open(path, encoding="ascii") as f:
        for line in f:
            words = line.split()
            if not words:
                continue
            if words[0] in PROTOCOLS and len(words) >= 2:
                address, port = _proc_address(words[1])
                current = out.setdefault(VirtualServer(words[0], address, port), [])
            elif words[0] == "->" and current is not None and words[1][0] in "0123456789ABCDEF[":
                address, port = _proc_address(words[1])
                weight, active, inactive = (int(w) for w in words[3:6])
                current.append(RealServer(address, port, words[2], weight, active, inactive))
            elif words[0] == "FWM":
                current = None  # a fwmark service's real servers: not ours to read
    return out


def _proc_address(text: str) -> tuple[str, int]:
    """ "0A600001:0050" or "[fd00:0000:...:0001]:01BB" -> ("10.96.0.1", 80) / ("fd00::1", 443)."""
    host, _, port = text.rpartition(":")
    ip = (
        ipaddress.ip_address(host[1:-1])
        if host.startswith("[")
        else ipaddress.IPv4Address(int(host, 16))
    )
    return str(ip), int(port, 16)


Held = tuple[str, int, tuple[RealServer, ...]]  # scheduler, persistence, real servers


def _read(ipvs: Any) -> dict[VirtualServer, Held]:
    """Every address virtual service IPVS holds, with its real servers."""
    servers = _real_servers()
    return {
        vs: (sched, persist, tuple(servers.get(vs, ()))) for vs, sched, persist in _services(ipvs)
    }


def _target(held: Held) -> Target:
    """A held virtual service as a sync sees it: its serving real servers (weight > 0)."""
    scheduler, persistence, servers = held
    return Target(
        scheduler, persistence, frozenset((r.address, r.port) for r in servers if r.weight > 0)
    )


def _dump(ipvs: Any) -> dict[VirtualServer, tuple[Target, frozenset[tuple[str, int]]]]:
    """What IPVS holds: each virtual service with its serving real servers, and those of
    weight 0 (draining) apart."""
    return {
        vs: (_target(h), frozenset((r.address, r.port) for r in h[2] if r.weight == 0))
        for vs, h in _read(ipvs).items()
    }


def _dummy(ipr: Any, name: str) -> int:
    """The dummy interface's index, made (and left down, as kube-ipvs0) if missing."""
    links = ipr.link_lookup(ifname=name)
    if not links:
        ipr.link("add", ifname=name, kind="dummy")
        links = ipr.link_lookup(ifname=name)
    return int(links[0])


def _held_addresses(ipr: Any, index: int) -> set[str]:
    return {str(ipaddress.ip_address(m.get("address"))) for m in ipr.get_addr(index=index)}


def _add_addresses(ipr: Any, index: int, addresses: set[str]) -> int:
    """Add addresses to the dummy (one there already is fine: no dump of them all)."""
    count = 0
    for address in sorted(addresses):
        length = 32 if _family(address) == 4 else 128
        try:
            ipr.addr("add", index=index, address=address, prefixlen=length)
            count += 1
        except NetlinkError as exc:
            if exc.code != errno.EEXIST:
                raise
    return count


def _del_addresses(ipr: Any, index: int, addresses: set[str]) -> int:
    count = 0
    for address in sorted(addresses):
        length = 32 if _family(address) == 4 else 128
        try:
            ipr.addr("del", index=index, address=address, prefixlen=length)
            count += 1
        except NetlinkError:
            pass  # not there
    return count


def _write_sysctls(values: dict[str, int]) -> None:
    for key, value in values.items():
        path = Path("/proc/sys", key)
        if path.exists() and os.access(path, os.W_OK):
            path.write_text(f"{value}\n")
        else:
            log.warning("sysctl %s: not available here", key.replace("/", "."))
