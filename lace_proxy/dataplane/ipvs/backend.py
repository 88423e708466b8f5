"""The IPVS backend (`mode: ipvs`): IPVS load-balances, nftables does everything else.

As kube-proxy's IPVS mode: every ClusterIP, ExternalIP and load-balancer IP is an address of
a dummy interface (`lace-ipvs0`, kept down), so packets to it are delivered locally, where
IPVS picks a real server and translates (NAT forwarding, as the IPVS codec asks for every
real server). With `IpvsSettings.local_routes` (lace.ipvs.serviceAddresses localRoutes)
each is a `local` route in the local table instead, which is all such an address amounts to
for routing, without the cost of an interface's addresses (addresses.py); the switch from
one way to the other leaves nothing of the first behind (local.py). A NodePort
is a virtual service on each node address. nftables keeps its
table with translation switched off (`NftablesSettings.translate`): access control (the Lace
network model), reject/drop for services without (local) endpoints, source ranges,
masquerade marks and hairpin, and a filter that keeps other ports of service addresses away
from the node's own sockets.

Sync is a diff against what IPVS holds (dumps), never a flush, so a restart adopts the
previous process's services and established connections carry on. What a sync changes goes
to the kernel in batches (`netlink.IpvsChannel`): one for the virtual and real servers, one
for the drained real servers' deletions, and the UDP move's own; the service addresses in
batches of their own (`addresses.AddressChannel`). A new address is made local only once
IPVS holds its virtual services with their real servers (`_make_local`), so a frontend is
never the node's own without them. A real server that
leaves is deleted at once if IPVS tracks no connection to it; otherwise it is first set to
weight 0 (no new connections) and deleted once its connections have drained, or after
`grace_period` if one is set (as kube-proxy's graceful termination). Ownership: virtual services
on the service addresses (the dummy interface's, this backend's local routes'), and on node
addresses within the NodePort range; nothing else is touched.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from pyroute2 import IPVS

from lace_proxy.dataplane.base import NO_NETWORKS
from lace_proxy.dataplane.ipvs import kernel
from lace_proxy.dataplane.ipvs.addresses import AddressChannel
from lace_proxy.dataplane.ipvs.kernel import STRICT_ARP, SYSCTLS
from lace_proxy.dataplane.ipvs.local import LOGGED, ServiceAddresses
from lace_proxy.dataplane.ipvs.model import (
    IpvsSettings,
    KernelView,
    Target,
    VirtualServer,
    Wanted,
    addresses_of,
)
from lace_proxy.dataplane.ipvs.netlink import Batch, IpvsChannel
from lace_proxy.dataplane.ipvs.udp import remove_udp_servers
from lace_proxy.dataplane.netns import enter_netns
from lace_proxy.dataplane.nftables.backend import NftablesBackend
from lace_proxy.gcpause import collection_paused
from lace_proxy.networks.graph import NetworkLayout
from lace_proxy.table import Changeset, Plan

log = logging.getLogger(__name__)
T = TypeVar("T")


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
        self.local = ServiceAddresses(settings)
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
        self._address_refs: Counter[str] = Counter()  # service address -> plans using it
        self._node_addresses: tuple[str, ...] = ()
        # Real servers draining at weight 0, with their deadlines, per virtual service.
        self._terminating: dict[VirtualServer, dict[tuple[str, int], float]] = {}
        self.last_changes = 0  # IPVS and address operations of the last sync (0: converged)
        # Whether IPVS holds what this process programmed (no sync failed since the last
        # full sync that read every real server back), and how many full syncs ago that was.
        self._trusted = False
        self._since_verified = 0
        self._index = -1  # the dummy interface's, as of the last full sync (-1: none)
        self._channel: IpvsChannel | None = None  # made on the kernel's thread, kept

    # -- the Dataplane protocol --

    def full_sync(
        self,
        plans: Iterable[Plan],
        changes: Changeset | None = None,
        layout: NetworkLayout = NO_NETWORKS,
    ) -> int:
        """nftables in full, then IPVS and the service addresses.

        As nftables mode's: the first full sync of a process, the one after a failed sync,
        and every `verify_every`-th (the nftables part's setting) read IPVS and the service
        addresses back whole and program what differs (adoption; drift repaired server by
        server). The others apply `changes` as `apply` does, after a check of what a few
        requests show (`_periodic`); only if that differs is everything read back then. A
        whole read-back is one dump per virtual service (the kernel ends a dump only once its
        first buffer is read): at 10k services, most of a verified sync."""
        plans = list(plans)
        count = self.nft.full_sync(plans, changes, layout)
        if (
            changes is not None
            and self._trusted
            and self._since_verified + 1 < self.nft.verify_every
        ):
            self._trusted = False  # until the check says otherwise (also if it raises)
            checked = self._run(self._periodic, changes)
            if checked is not None:
                self._trusted = True
                self._since_verified += 1
                self.last_changes = checked
                return count + checked
            log.warning("IPVS: not as programmed; reading every real server back")
        self._trusted = False
        with collection_paused():
            self.last_changes = self._run(self._reconcile, plans)
        self._trusted, self._since_verified = True, 0
        return count + self.last_changes

    def apply(self, changes: Changeset, layout: NetworkLayout = NO_NETWORKS) -> int:
        """nftables' transaction, then the changed plans' virtual services; a failure makes
        the next full sync read every real server back."""
        count = self.nft.apply(changes, layout)
        trusted, self._trusted = self._trusted, False
        self.last_changes = self._run(self._apply, changes)
        self._trusted = trusted
        return count + self.last_changes

    def node_addresses_changed(self, addresses: tuple[str, ...]) -> bool:
        """As nftables mode (which renders them); the addresses NodePort virtual services
        use are read from the kernel at each full sync."""
        return self.nft.node_addresses_changed(addresses)

    def cleanup(self) -> bool:
        """Remove every virtual service of ours, the dummy interface, our local routes and
        the nftables table."""
        self.remove_ipvs()
        return self.nft.cleanup()

    def remove_ipvs(self) -> int:
        """Remove every virtual service of ours, the dummy interface and our local routes (in
        either way: a node may have switched); returns how many virtual services."""
        return self._run(self._cleanup)

    def held(self) -> dict[VirtualServer, Target]:
        """What IPVS holds (ours and others'), for the CLI and tests."""

        def dump() -> dict[VirtualServer, Target]:
            return {vs: target for vs, (target, _) in kernel.dump(self._ipvs()).items()}

        return self._run(dump)

    def inspect(self) -> KernelView:
        """What IPVS holds in detail, the service addresses (either way's) and the node
        addresses a sync would put NodePorts on, read as a sync reads them (`kernel.read`);
        changes nothing (not even the dummy interface), so the CLI can show and diff a live
        node."""

        def read() -> KernelView:
            with AddressChannel() as channel:
                local = self.local.read(channel)
            nodes = self._local_addresses(local.every, local.dummy)
            held = kernel.read(self._ipvs())
            services = {vs: kernel.target(vs_held) for vs, vs_held in held.items()}
            details = {vs: servers for vs, (_, _, servers) in held.items()}
            return KernelView(services, details, frozenset(local.mine | local.other), nodes)

        return self._run(read)

    def owns(
        self, vs: VirtualServer, service_addresses: Collection[str], node_addresses: Collection[str]
    ) -> bool:
        """The ownership rule: a virtual service on a service address (the dummy's, or of a
        local route of ours), or on a node address within the NodePort range, is ours
        (everything else is left alone)."""
        if self._excluded(vs.address):
            return False
        low, high = self.settings.node_port_range
        return vs.address in service_addresses or (
            vs.address in node_addresses and low <= vs.port <= high
        )

    # -- on the kernel's thread --

    def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._worker is None:
            return self._guarded(fn, *args)
        return self._worker.submit(self._guarded, fn, *args).result()

    def _guarded(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except OSError:  # the IPVS socket may be what failed: the next call makes a new one
            self._close_channel()
            raise

    def _ipvs(self) -> IpvsChannel:
        """The IPVS channel, made on first use in the kernel's thread (its namespace)."""
        if self._channel is None:
            self._channel = IpvsChannel()
        return self._channel

    def _close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def _settle(self) -> None:
        """The sysctls and timeouts IPVS mode needs (written at every full sync, so that a
        change behind our back is undone)."""
        kernel.write_sysctls({**SYSCTLS, **(STRICT_ARP if self.settings.strict_arp else {})})
        s = self.settings
        timeouts = (s.tcp_timeout, s.tcp_fin_timeout, s.udp_timeout)
        if any(timeouts):
            with IPVS() as ipvs:
                kernel.set_timeouts(ipvs, timeouts)

    def _reconcile(self, plans: list[Plan]) -> int:
        self._settle()
        refs: Counter[str] = Counter()
        for plan in plans:
            refs.update(addresses_of(plan))
        with AddressChannel() as addresses:
            return self._sync_ipvs(addresses, plans, refs)

    def _periodic(self, changes: Changeset) -> int | None:
        """A full sync that trusts IPVS and the service addresses as nftables mode's trusts
        its elements (see full_sync): it checks what a few requests show (the dummy
        interface is the one programmed, or still absent with local routes; the node
        addresses NodePorts use are the same; one virtual service has its real servers: IPVS
        was not cleared), then applies `changes`. Returns the operation count, or None if
        the kernel is not as programmed (the caller then reads everything back)."""
        self._settle()
        with AddressChannel() as addresses:
            links = {link.name: link.ifindex for link in addresses.links()}
            index = links.get(self.settings.interface, -1)
            node = [a for i in links.values() if i != index for a in addresses.addresses(i)]
        if index != self._index or self._local_addresses(node, index) != self._node_addresses:
            return None
        if not self._canary_holds():
            return None
        return self._apply(changes)

    def _canary_holds(self) -> bool:
        """Whether one programmed virtual service with real servers has them in IPVS (one
        dump): IPVS cleared behind our back (`ipvsadm -C`) shows here at once."""
        for vs, target in self._programmed.items():
            if target.servers:
                servers = self._ipvs().servers(vs)
                return {(r[0], r[1]) for r in servers if r[3] > 0} == target.servers
        return True

    def _sync_ipvs(self, addresses: AddressChannel, plans: list[Plan], refs: Counter[str]) -> int:
        """Virtual services by diff against what IPVS holds, and the service addresses by
        diff against what the kernel holds of them: one dump of the namespace's addresses
        (which also has the node's; the dummy's among them) and one of our local routes per
        family. What the other way holds (left by a process with the other setting) is ours
        too, and goes once this way holds every address (local.py)."""
        local = self.local.read(addresses, make=True)
        index, held = local.dummy, local.mine
        self._node_addresses = self._local_addresses(local.every, index)
        self._address_refs = refs
        wanted, scheduler = self._wanted, self.settings.scheduler
        if (wanted.node_addresses, wanted.scheduler) != (self._node_addresses, scheduler):
            wanted = Wanted(self._node_addresses, scheduler)
        wanted.update(plans)
        desired = wanted.desired()
        now = self._clock()
        count = 0
        failed: list[str] = []
        channel = self._ipvs()
        held_services = {}
        ours = set(refs) | held | local.other  # also the addresses of services deleted meanwhile
        # What drains is what IPVS holds at weight 0, as read now: a real server left by a
        # previous process is finished too; one IPVS lost behind our back (`ipvsadm -C`) is
        # forgotten, so the diff adds it anew. Known deadlines are kept.
        terminating: dict[VirtualServer, dict[tuple[str, int], float]] = {}
        for vs, (target, draining) in kernel.dump(channel).items():
            # Ours: by address, wanted now, or made by this process (e.g. a NodePort on an
            # address the node no longer has).
            made = vs in self._programmed and not self._excluded(vs.address)
            if vs in desired or self._owns(vs, ours) or made:
                held_services[vs] = target
                if draining:
                    known = self._terminating.get(vs, {})
                    deadline = now + self.settings.grace_period
                    terminating[vs] = {s: known.get(s, deadline) for s in draining}
        self._terminating = terminating
        try:
            count += self._converge(channel, held_services, desired)
        finally:
            count += self._make_local(addresses, index, set(refs) - held, failed)
        self._programmed, self._wanted = desired, wanted
        # After IPVS: the addresses say which services are ours.
        count += self.local.change(addresses, index, held - set(refs), failed, add=False)
        count += self.local.leave_the_other_way(addresses, local, failed)
        self._index = -1 if self.settings.local_routes else index
        _raise_if(failed)
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
        failed: list[str] = []
        held = {vs: self._programmed[vs] for vs in touched if vs in self._programmed}
        index = self.local.index() if appear or vanish else -1
        try:
            count += self._converge(self._ipvs(), held, after, only=touched)
        finally:
            if appear:
                with AddressChannel() as addresses:
                    count += self._make_local(addresses, index, appear, failed)
        for vs in touched - set(after):
            self._programmed.pop(vs, None)
        self._programmed.update(after)
        for address, d in delta.items():
            refs[address] += d
            if refs[address] <= 0:
                del refs[address]
        if vanish:
            with AddressChannel() as addresses:
                count += self.local.change(addresses, index, vanish, failed, add=False)
        _raise_if(failed)
        return count

    def _make_local(
        self, channel: AddressChannel, index: int, addresses: set[str], failed: list[str]
    ) -> int:
        """Make new service addresses local; called once IPVS holds their virtual services
        with every real server (also when the kernel refused some other operation). An
        address makes its frontends the node's own at once: added first, a new connection
        reached the node's own sockets on that port (or was reset), then a virtual service
        with no real server yet (IPVS refused it). Until it is added, a new address is routed
        as a foreign one (nftables refuses connections to a ClusterIP that is not local:
        cluster-ips-check)."""
        return self.local.change(channel, index, addresses, failed, add=True)

    def _converge(
        self,
        channel: IpvsChannel,
        held: dict[VirtualServer, Target],
        desired: dict[VirtualServer, Target],
        only: set[VirtualServer] | None = None,
    ) -> int:
        """Make the virtual services in `held` (ours; all of them, or those in `only`) look
        like `desired` (one batch of requests; what the kernel refuses stops nothing else),
        then finish real servers whose draining is over. Real servers leaving a TCP or SCTP
        virtual service are looked up first (a dump of it): one without connections is
        deleted in the batch (as kube-proxy's graceful termination tries first), the others
        drain."""
        now = self._clock()
        failed: list[str] = []
        udp_gone: list[tuple[VirtualServer, tuple[str, int]]] = []
        zeroed: dict[int, tuple[VirtualServer, tuple[str, int]]] = {}
        batch = channel.batch()
        for vs, want in desired.items():
            have = held.get(vs)
            if have != want:  # most of a periodic sync's: as held, nothing to plan
                busy = {}
                if have is not None and have.servers - want.servers and self._drains(vs):
                    busy = kernel.connections(channel, vs)
                self._plan(batch, vs, have, want, udp_gone, zeroed, busy)
        for vs in held:
            if vs in desired or (only is not None and vs not in only):
                continue
            self._terminating.pop(vs, None)
            batch.delete_service(vs)
        refused = self._send(channel, batch, failed)
        for sequence, (vs, server) in zeroed.items():
            if sequence not in refused:  # no new connections; deleted once drained
                self._terminating.setdefault(vs, {})[server] = now + self.settings.grace_period
        count = len(batch) - len(refused)
        count += remove_udp_servers(channel, self.nft, udp_gone, failed)
        count += self._finish_draining(channel, now, failed)
        _raise_if(failed)  # the others are programmed; the sync counts as failed, is retried
        return count

    def _send(self, channel: IpvsChannel, batch: Batch, failed: list[str]) -> set[int]:
        """Send a batch; each refusal is logged (naming what it asked) and added to
        `failed`. Returns the refused requests' sequence numbers."""
        refused = channel.send(batch)
        for refusal in refused[:LOGGED]:
            log.error("%s", refusal)
        if len(refused) > LOGGED:
            log.error("IPVS: %d more requests of that batch refused", len(refused) - LOGGED)
        failed += map(str, refused)
        return {r.sequence for r in refused}

    def _finish_draining(self, channel: IpvsChannel, now: float, failed: list[str]) -> int:
        """Delete the real servers whose draining is over (no connection left, or past their
        deadline): a dump of each virtual service that has any, then one batch."""
        batch = channel.batch()
        for vs in sorted(self._terminating):
            draining = self._terminating[vs]
            conns = kernel.connections(channel, vs)
            for server in sorted(draining):
                if conns.get(server, 0) == 0 or now >= draining[server]:
                    del draining[server]
                    if server in conns:
                        batch.delete_server(vs, server)
            if not draining:
                del self._terminating[vs]
        return len(batch) - len(self._send(channel, batch, failed))

    def _plan(
        self,
        batch: Batch,
        vs: VirtualServer,
        have: Target | None,
        want: Target,
        udp_gone: list[tuple[VirtualServer, tuple[str, int]]],
        zeroed: dict[int, tuple[VirtualServer, tuple[str, int]]],
        busy: dict[tuple[str, int], int],
    ) -> None:
        """One virtual service to `want`, as requests in `batch`: its UDP real servers to
        delete go to `udp_gone`, the requests setting others with connections (`busy`) to
        weight 0 to `zeroed`; the rest are deleted."""
        if have is None:  # all of a cold sync's: nothing held, so nothing drains
            batch.add_service(vs, want)
            _add_servers(batch, vs, sorted(want.servers))
            return
        if (have.scheduler, have.persistence) != (want.scheduler, want.persistence):
            batch.change_service(vs, want)
        draining = self._terminating.get(vs, {})
        new = sorted(want.servers - have.servers)
        if draining:
            for server in [server for server in new if server in draining]:
                del draining[server]  # back before it was deleted
                batch.change_server(vs, server, 1)
            new = [server for server in new if server not in draining]
        _add_servers(batch, vs, new)
        for server in sorted(have.servers - want.servers):
            if vs.protocol == "UDP":
                udp_gone.append((vs, server))  # deleted at once: udp.py
            elif busy.get(server, 0):
                zeroed[batch.change_server(vs, server, 0)] = (vs, server)
            else:
                batch.delete_server(vs, server)
        if vs in self._terminating and not self._terminating[vs]:
            del self._terminating[vs]

    def _drains(self, vs: VirtualServer) -> bool:
        """Whether a real server leaving `vs` with connections drains first (UDP's never
        do; none does with a grace period of 0)."""
        return vs.protocol != "UDP" and self.settings.grace_period > 0

    def _owns(self, vs: VirtualServer, service_addresses: set[str]) -> bool:
        return self.owns(vs, service_addresses, self._node_addresses)

    def _excluded(self, address: str) -> bool:
        if not self._exclude:  # as on most nodes: no address to parse per virtual service
            return False
        ip = ipaddress.ip_address(address)
        return any(ip in net for net in self._exclude if net.version == ip.version)

    def _local_addresses(
        self, addresses: list[tuple[int, str]], dummy_index: int, *, every: bool = False
    ) -> tuple[str, ...]:
        """The node's addresses that NodePorts answer on (as nftables' NodePort rule), of
        the namespace's (`AddressChannel.addresses`); with `every`, all that NodePorts may
        ever have used (cleanup: no Node object, no config)."""
        nft = self.nft.settings
        out = []
        for index, address in addresses:
            if index == dummy_index:
                continue
            ip = ipaddress.ip_address(address)
            if ip.is_loopback or ip.is_link_local:
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
        self._trusted = False  # the next full sync reads everything back
        failed: list[str] = []
        with AddressChannel() as addresses:
            local = self.local.read(addresses)
            self._node_addresses = self._local_addresses(local.every, local.dummy, every=True)
            self.local.remove(addresses, local, failed)
        service_addresses = local.mine | local.other
        channel = self._ipvs()
        batch = channel.batch()
        for vs, _, _ in kernel.services(channel):
            made = vs in self._programmed and not self._excluded(vs.address)
            if self._owns(vs, service_addresses) or made:
                batch.delete_service(vs)
        refused = self._send(channel, batch, failed)
        self._close_channel()  # nothing of ours is left to sync; a later call makes a new one
        _raise_if(failed)
        self._programmed.clear()
        self._terminating.clear()
        return len(batch) - len(refused)


def _add_servers(batch: Batch, vs: VirtualServer, servers: list[tuple[str, int]]) -> None:
    """New real servers at weight 1, in one codec call; those IPVS would refuse are logged."""
    for server in batch.add_servers(vs, servers, 1):
        log.warning("IPVS %s: real server %s is not a unicast address; skipped", vs, server)


def _raise_if(failed: list[str]) -> None:
    """A sync whose kernel operations were refused in part fails (and is retried), once
    every other operation is carried out."""
    if failed:
        raise RuntimeError(f"{len(failed)} IPVS operations failed: {'; '.join(failed[:3])}")
