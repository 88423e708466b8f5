"""NftablesBackend: changesets into one atomic nft transaction each, by diff, never a flush.

- `apply` programs one changeset: it renders the plans that left or changed as they were
  programmed and as they are now, and sends only the difference (elements out and in,
  chains whose rules changed). Elements several plans hold (a ClusterIP of several ports,
  an endpoint of several services) are reference-counted and programmed once. A change
  that needs an endpoint count or affinity timeout the shared chains have no rule for yet
  makes it (with nft, in the same transaction).
- `full_sync` brings the table to every plan. The first of a process, the one after a
  refused transaction, and every `verify_every`-th read every element back and send only
  what differs (adoption: a restarted proxy keeps its predecessor's table, affinity ids and
  clients' remembered endpoints included); the others apply the changeset and compare the
  table's structure only. A table of another skeleton is rewritten in one batch.
- UDP flows whose endpoint left are moved once a sync is in (conntrack.py), their replies
  in flight rescued first (rescue.py).

What is rendered is render.py's and skeleton.py's; what is read back is kernel.py's.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable

from lace_proxy.dataplane import rescue
from lace_proxy.dataplane.base import NO_NETWORKS, Changeset, NetworkLayout, Plan
from lace_proxy.dataplane.conntrack import (
    Conntrack,
    Filter,
    StaleFlows,
    UdpFlow,
    stale_udp_filters,
    stale_udp_filters_by_elements,
)
from lace_proxy.dataplane.nft import Nft
from lace_proxy.dataplane.nftables import parts
from lace_proxy.dataplane.nftables.affinity import IdAdoption, backend_set, needs_id
from lace_proxy.dataplane.nftables.kernel import KernelState, canonical, rule_hash
from lace_proxy.dataplane.nftables.render import Rendered, Renderer, element_key, name_hash
from lace_proxy.dataplane.nftables.settings import NftablesSettings
from lace_proxy.dataplane.nftables.shared import ENDPOINT_MAP, need_of
from lace_proxy.dataplane.nftables.skeleton import ACCESS_CHAINS, RESCUE_CONTAINERS
from lace_proxy.dataplane.nftables.transaction import Elements, NftError, Transaction
from lace_proxy.gcpause import collection_paused

log = logging.getLogger(__name__)

#: Dynamic state a full sync keeps: clients' remembered endpoints, moved flows' replies.
KEPT = ("affinity-v4", "affinity-v6", *RESCUE_CONTAINERS)
#: Changes whenever what a table's skeleton means changes (see NftablesBackend._skeleton).
SKELETON_VERSION = 3
#: Every this many full syncs read every element back (see NftablesBackend.full_sync).
VERIFY_EVERY = 10


class NftablesBackend:
    """Programs plans into this node's nftables table; never decides policy."""

    family = "inet"

    def __init__(
        self,
        settings: NftablesSettings,
        nft: Nft | None = None,
        conntrack: Conntrack | None = None,
        *,
        verify_every: int = VERIFY_EVERY,
        udp_flows_moved: Callable[[int, int], None] | None = None,
    ) -> None:
        self.settings = settings
        self.verify_every = verify_every
        self.nft = nft or Nft()
        self.conntrack = conntrack
        # Told (rescued, unrescued) after each sync that moved UDP flows (rescue.py).
        self._udp_flows_moved = udp_flows_moved
        self.renderer = Renderer(settings)
        self._refs: Counter[tuple[str, str]] = Counter()  # shared element -> plans holding it
        # The counts and affinity timeouts the shared chains have rules for (shared.NEED).
        self._needs: set[str] = set()
        # The table's chains (with their rules and comments) and sets as programmed, without
        # elements: what a full sync that reads no element compares the kernel's with.
        self._structure = Rendered()
        # The network model's objects as programmed (the caller hands the wanted layout to
        # each sync, taken together with the plans, so the two always agree).
        self._programmed_layout = NO_NETWORKS
        self._networks = self.renderer.render_networks(NO_NETWORKS)
        # The first full sync adopts the affinity ids a previous process left in the kernel.
        self._synced = False
        # Whether the kernel holds what this process programmed (no batch refused since the
        # last verified full sync), and how many full syncs ago that one was.
        self._trusted = False
        self._since_verified = 0

    @property
    def table(self) -> str:
        """The name of our table (family `inet`)."""
        return self.settings.table

    def full_sync(
        self,
        plans: Iterable[Plan],
        changes: Changeset | None = None,
        layout: NetworkLayout = NO_NETWORKS,
    ) -> int:
        """Bring the table to these plans by diff; returns the command count.

        Used for the first sync (also after a restart) and the periodic reconcile. The first
        one of a process, the one after a refused transaction, and every `verify_every`-th
        read every element back (a second or two at 30k services, Python's parsing and
        comparing most of it) and program only what differs, in one
        atomic batch: nothing is flushed, so a restarted proxy adopts what its predecessor
        made (affinity ids and clients' pinned endpoints included) and drift is repaired
        element by element. The others program `changes` as `apply` does and check the
        table's structure (chains, rules, sets: read in milliseconds) against the structure
        as programmed (kept by every sync, so that no plan is rendered again), verifying
        every element only if it differs.
        """
        plans = list(plans)
        if (
            self._synced
            and self._trusted
            and changes is not None
            and self._since_verified + 1 < self.verify_every
            and self.settings.parts_for(len(plans), self.renderer.parts) == self.renderer.parts
        ):
            count = self.apply(changes, layout)
            kernel = KernelState.read(self.nft, self.family, self.table, elements=False)
            tx = None if kernel is None else self._reconcile(self._structure, kernel, {})
            if tx is not None and not tx.commands:
                self._since_verified += 1
                return count
            log.warning("nftables: table %s is not as programmed; verifying it", self.table)
        with collection_paused():
            return self._verified_sync(plans, changes, layout)

    def _verified_sync(
        self, plans: list[Plan], changes: Changeset | None, layout: NetworkLayout
    ) -> int:
        """full_sync with every element read back (see there)."""
        kernel = KernelState.read(self.nft, self.family, self.table, elements=True)
        held = self.renderer.parts if kernel is None else parts.count(kernel.containers)
        self.renderer.parts = self.settings.parts_for(len(plans), held)
        adoption = None
        if kernel is not None and not self._synced:
            ids = self.renderer.affinity_ids
            adoption = IdAdoption(ids, plans, kernel.affinity_ids())
        merged, refs, needs, networks = self._render_all(plans, layout, kernel)
        diff: dict[str, tuple[set[str], set[str]]] = {}
        tx = None
        if kernel is not None:
            diff = self._element_diff(merged, kernel, adoption or None)
            tx = self._reconcile(merged, kernel, diff)
        if tx is None:
            tx = self._rewrite(merged, networks, kernel)
        if kernel is None:
            # An empty kernel (a node's first start) has no traffic to keep: the skeleton
            # and chains go to nft, then the elements (the bulk) in a batch of their own.
            self._apply(Transaction([c for c in tx.commands if not isinstance(c, Elements)]))
            self._apply(Transaction([c for c in tx.commands if isinstance(c, Elements)]))
        else:
            self._apply(tx)
        self._refs = refs
        self._needs = needs
        self._structure = Rendered(
            chains=dict(merged.chains), comments=dict(merged.comments), sets=dict(merged.sets)
        )
        self._networks, self._programmed_layout = networks, layout
        self._synced = self._trusted = True
        self._since_verified = 0
        if kernel is not None:
            # What the kernel held is known: only flows it translated to endpoints now
            # gone, or left alone for frontends now served, are stale.
            self._move_udp_flows(stale_udp_filters_by_elements(diff, plans))
        elif changes is not None:
            self._move_udp_flows(stale_udp_filters(changes))
        return len(tx)

    def _render_all(
        self, plans: list[Plan], layout: NetworkLayout, kernel: KernelState | None
    ) -> tuple[Rendered, Counter[tuple[str, str]], set[str], Rendered]:
        """Every plan's objects merged, with the shared elements, chains and sets and the
        network model's objects: what the table must hold (with its shared-element counts
        and the counts its shared chains dispatch on)."""
        ids = self.renderer.affinity_ids
        ids.keep_only({p.id for p in plans if needs_id(p)})
        for plan in sorted(plans, key=lambda p: p.id):  # deterministic probing
            if needs_id(plan):
                ids.assign(plan.id, backend_set(plan))
        merged = Rendered(deferred={})
        refs: Counter[tuple[str, str]] = Counter()
        for plan in plans:
            refs.update(self.renderer.render(plan, merged).shared)
        for container, element in refs:
            merged.element(container, element)
        needs = merged.needs | self.renderer.shared.precreated() | self._needs
        if kernel is not None:  # counts stay once made, as after `apply`
            needs |= {n for n in map(need_of, kernel.containers) if n is not None}
        merged.chains.update(self.renderer.shared.chains(needs))
        merged.sets.update(self.renderer.shared.sets(needs))
        networks = self.renderer.render_networks(layout)
        merged.merge(networks)
        return merged, refs, needs, networks

    def _apply(self, tx: Transaction) -> None:
        """Apply a batch; one the kernel refused leaves the table's state unknown to us, so
        the next full sync verifies every element."""
        try:
            self.nft.apply(tx)
        except Exception:
            self._trusted = False
            raise

    def _element_diff(
        self, merged: Rendered, kernel: KernelState, adoption: IdAdoption | None = None
    ) -> dict[str, tuple[set[str], set[str]]]:
        """Per container: the kernel's elements that are not wanted, and the wanted ones it
        lacks (dynamic state excluded), each container's parsed from the listing now unless
        `kernel` holds them already (and dropped from it). Elements are compared as text
        first; the few left over canonically (nft prints a /32 in an interval set as an
        address, a range that is a prefix as the prefix, a mark as a decimal number).

        The endpoint maps come first: an `adoption` of affinity ids sees what they held, and
        replaces the ids it must (their plans rendered again) before the rest is compared."""
        wanted = {**merged.elements}
        for container, values in self.renderer.base_elements().items():
            wanted.setdefault(container, set()).update(values)
        out: dict[str, tuple[set[str], set[str]]] = {}
        deferred = set(merged.endpoint_maps())
        names = wanted.keys() | kernel.containers.keys() | deferred
        for container in sorted(names, key=_endpoint_maps_first):
            endpoint_map = ENDPOINT_MAP.match(container)
            if adoption is not None and endpoint_map is None:
                for plan in adoption.plans():
                    before = self.renderer.render(plan)
                    if adoption.revise(plan):
                        after = self.renderer.render(plan)
                        merged.swap(before, after)
                        wanted.update((c, merged.elements[c]) for c in merged.elements)
                adoption = None
            kind = kernel.containers.get(container)
            if _dynamic(container) or (kind is None and container not in merged.sets):
                continue
            # One map at a time, dropped once compared: at 30k services they hold ~1M. One
            # the kernel lacks (a count first needed now) is declared by this sync
            # (_reconcile), then filled here.
            have = kernel.elements.pop(container, None) if kind is not None else set()
            if have is None:
                listing = kernel.listing
                have = set() if listing is None else set(listing.elements(container))
            if adoption is not None and endpoint_map and endpoint_map[1] in IdAdoption.MAPS:
                adoption.seen(have)
            # An endpoint map's elements are made now, and dropped once compared.
            want = (
                merged.endpoint_elements(container)
                if container in deferred
                else wanted.get(container, set())
            )
            gone, new = have - want, want - have
            if gone and new:
                by_canon = {canonical(e): e for e in gone}
                for e in list(new):
                    match = by_canon.pop(canonical(e), None)
                    if match is not None:
                        gone.discard(match)
                        new.discard(e)
            if gone or new:
                out[container] = (gone, new)
        return out

    def _reconcile(
        self,
        merged: Rendered,
        kernel: KernelState,
        diff: dict[str, tuple[set[str], set[str]]],
    ) -> Transaction | None:
        """The batch that turns the kernel's table into `merged`, or None where only a
        rewrite can (see full_sync)."""
        r = self.renderer
        counts = r.base_rule_counts()  # the skeleton's chains
        base_containers = r.base_containers()
        skeleton = self._skeleton()
        if skeleton not in kernel.rules:
            return None
        for name, count in counts.items():
            # (The network model's chains are declared by the skeleton, filled by plans.)
            if name not in merged.chains and len(kernel.rules.get(name, ())) != count:
                return None
        if not base_containers <= kernel.containers.keys():
            return None
        missing = {n for n in merged.chains if n not in kernel.rules}
        changed = {
            n
            for n, rules in merged.chains.items()
            if n in kernel.rules and kernel.rules[n] != [rule_hash(x) for x in rules]
        }
        t = self.settings.table
        tx = Transaction()
        for name, spec in sorted(merged.sets.items()):
            if name not in kernel.containers:
                tx.add(self._container_decl(name, spec))
        tx.extend(self._chain_decl(n, merged.comments.get(n)) for n in sorted(missing))
        for name in sorted(missing | changed, key=_chain_order):
            if name in changed:
                tx.add(f"flush chain inet {t} {name}")
            self._add_rules(tx, name, merged.chains[name])
        for container, (gone, new) in sorted(diff.items()):
            if gone:
                tx.add(self._elements("delete", container, {element_key(e) for e in gone}))
            if new:
                tx.add(self._elements("add", container, new))
        keep = merged.chains.keys() | counts.keys() | {skeleton}
        gone_chains = sorted(kernel.rules.keys() - keep, key=_chain_order, reverse=True)
        tx.extend(f"flush chain inet {t} {name}" for name in gone_chains)
        tx.extend(f"delete chain inet {t} {name}" for name in gone_chains)
        for name, kind in sorted(kernel.containers.items()):
            if name not in merged.sets and name not in base_containers:
                tx.add(f"delete {kind} inet {t} {name}")
        return tx

    def _rewrite(
        self, merged: Rendered, networks: Rendered, kernel: KernelState | None
    ) -> Transaction:
        """One batch that flushes every chain, replaces every map and set, deletes what is
        no longer wanted and fills in the rest; the affinity state stays."""
        tx = Transaction()
        t = self.settings.table
        if kernel is not None:
            chains, containers = kernel.rules.keys(), kernel.containers
            tx.extend(f"flush chain inet {t} {name}" for name in sorted(chains))
            # Maps and sets are made anew (nft must see their definitions in the batch
            # that adds the rules using them); only the affinity state stays.
            tx.extend(
                f"delete {kind} inet {t} {name}"
                for name, kind in sorted(containers.items())
                if not _dynamic(name)
            )
            keep = merged.chains.keys() | self.renderer.base_chains() | {self._skeleton()}
            tx.extend(f"delete chain inet {t} {name}" for name in sorted(chains - keep))
            tx.extend(
                f"delete {kind} inet {t} {name}"
                for name, kind in sorted(containers.items())
                if name.startswith("aff-") and name not in merged.sets
            )
        # nft 1.0.6 refuses an interval map element naming a chain declared after the map in
        # the same batch, so the network chains are declared before the table's skeleton.
        tx.add(f"add table inet {t}")
        tx.extend(
            self._chain_decl(name, networks.comments.get(name))
            for name in sorted(networks.chains.keys() - set(ACCESS_CHAINS))
        )
        tx.extend(self.renderer.base())
        tx.add(self._chain_decl(self._skeleton(), None))
        self._add_objects(tx, merged)
        return tx

    def _skeleton(self) -> str:
        """The name of an empty chain that marks the skeleton the table was made with: a
        table of another skeleton (another version or configuration) is rewritten."""
        return f"skeleton-{name_hash(SKELETON_VERSION, *self.renderer.base())}"

    def apply(self, changes: Changeset, layout: NetworkLayout = NO_NETWORKS) -> int:
        """Program one changeset (and the network model's `layout`, if it changed) as one
        atomic transaction; returns the command count."""
        ids = self.renderer.affinity_ids
        old, new = Rendered(), Rendered()
        delta: Counter[tuple[str, str]] = Counter()  # shared element -> change in holders
        for plan in (*changes.removed, *(before for before, _ in changes.updated)):
            r = self.renderer.render(plan)  # with the ids they were programmed with
            delta.subtract(r.shared)
            old.merge(r)
        for plan in (*changes.added, *(after for _, after in changes.updated)):
            if needs_id(plan):
                ids.assign(plan.id, backend_set(plan))
        for plan in (*changes.added, *(after for _, after in changes.updated)):
            r = self.renderer.render(plan)
            delta.update(r.shared)
            new.merge(r)
        networks = self._networks
        if layout != self._programmed_layout:
            networks = self.renderer.render_networks(layout)
            old.merge(self._networks)
            new.merge(networks)
        tx = Transaction()
        t = self.settings.table
        # 1. New sets and chains exist before anything refers to them.
        for name, spec in sorted(new.sets.items()):
            if name not in old.sets:
                tx.add(self._container_decl(name, spec))
        # A new endpoint count or affinity timeout (rare: counts up to 16 are made by every
        # full sync): its sets and maps, its pick chains and its rule in the shared chain.
        missing = new.needs - self._needs
        counting, shared_sets = self._shared(self._needs | missing) if missing else ({}, {})
        for name, spec in sorted(shared_sets.items()):
            tx.add(self._container_decl(name, spec))
        tx.extend(self._chain_decl(name, None) for name in sorted(counting))
        changed = {n: r for n, r in new.chains.items() if old.chains.get(n) != r}
        for name in sorted(changed):
            tx.add(self._chain_decl(name, new.comments.get(name)))
        # 2. Chains whose rules changed: endpoint chains first, then what jumps to them.
        for name in sorted(changed, key=_chain_order):
            if name in old.chains:
                tx.add(f"flush chain inet {t} {name}")
            self._add_rules(tx, name, changed[name])
        for name in sorted(counting, key=_chain_order):
            if name in self._structure.chains:
                tx.add(f"flush chain inet {t} {name}")
            self._add_rules(tx, name, counting[name])
        # 3. Elements: obsolete ones out, then new ones in (a changed value is both).
        for container in sorted(old.elements.keys() | new.elements.keys()):
            before = old.elements.get(container, set())
            after = new.elements.get(container, set())
            delete = {element_key(e) for e in before - after}
            if delete:
                tx.add(self._elements("delete", container, delete))
            add = after - before
            if add:
                tx.add(self._elements("add", container, add))
        # 4. Shared elements appear with their first holder and go with their last.
        appear: dict[str, set[str]] = {}
        go: dict[str, set[str]] = {}
        for shared, change in delta.items():
            container, element = shared
            was = self._refs[shared] > 0
            now = self._refs[shared] + change > 0
            if was != now:
                (appear if now else go).setdefault(container, set()).add(element)
        for container in sorted(appear.keys() | go.keys()):
            if container in go:
                tx.add(self._elements("delete", container, go[container]))
            if container in appear:
                tx.add(self._elements("add", container, appear[container]))
        # 5. Chains and sets nothing refers to any more (shared chains stay: they are few).
        gone = sorted(old.chains.keys() - new.chains.keys(), key=_chain_order, reverse=True)
        tx.extend(f"flush chain inet {t} {name}" for name in gone)
        tx.extend(f"delete chain inet {t} {name}" for name in gone)
        for name in sorted(old.sets.keys() - new.sets.keys()):
            tx.add(f"delete set inet {t} {name}")
        self._apply(tx)
        self._networks, self._programmed_layout = networks, layout
        still = {after.id for _, after in changes.updated if needs_id(after)}
        for plan in (*changes.removed, *(before for before, _ in changes.updated)):
            if needs_id(plan) and plan.id not in still:
                ids.release(plan.id)
        self._needs |= missing
        self._record_structure(old, new, {**changed, **counting}, shared_sets)
        for shared, change in delta.items():
            count = self._refs[shared] + change
            if count > 0:
                self._refs[shared] = count
            else:
                del self._refs[shared]
        self._move_udp_flows(stale_udp_filters(changes))
        return len(tx)

    def _shared(self, needs: set[str]) -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
        """The shared chains whose rules differ for these needs from the programmed ones',
        and the sets these needs add."""
        before = self.renderer.shared.chains(self._needs)
        after = self.renderer.shared.chains(needs)
        sets = self.renderer.shared.sets(needs)
        programmed = self.renderer.shared.sets(self._needs)
        return (
            {n: r for n, r in after.items() if before.get(n) != r},
            {n: s for n, s in sets.items() if n not in programmed},
        )

    def _record_structure(
        self,
        old: Rendered,
        new: Rendered,
        changed: dict[str, tuple[str, ...]],
        shared_sets: dict[str, str],
    ) -> None:
        """Keep the record of the programmed structure as `apply` changed it."""
        record = self._structure
        for name in old.chains.keys() - new.chains.keys():
            record.chains.pop(name, None)
            record.comments.pop(name, None)
        record.sets.update(shared_sets)
        for name, rules in changed.items():
            record.chains[name] = rules
            if name in new.comments:
                record.comments[name] = new.comments[name]
        for name in old.sets.keys() - new.sets.keys():
            record.sets.pop(name, None)
        record.sets.update(new.sets)

    def _move_udp_flows(self, stale: StaleFlows) -> None:
        """Delete the stale UDP conntrack entries, once the replies in flight on those that
        leave an endpoint are rescued."""
        if self.conntrack is None or not stale:
            return
        self.rescue_udp_replies(stale.moved)
        self.conntrack.delete_udp([*stale.moved, *stale.untranslated])

    def rescue_udp_replies(self, moved: list[Filter]) -> list[UdpFlow]:
        """Rescue the replies in flight of the UDP flows these filters select, which are
        about to lose their translation: their conntrack entries deleted here, or in IPVS
        mode their real server (rescue.py). Returns the flows."""
        if self.conntrack is None or not moved:
            return []
        flows = self.conntrack.list_udp(moved)
        rescued = min(len(flows), rescue.LIMIT)
        tx = rescue.transaction(self.settings.table, flows)
        if tx:
            try:
                self.nft.apply(tx)
            except NftError as exc:
                rescued = 0
                log.warning("nftables: replies in flight of moved UDP flows not rescued: %s", exc)
        if flows and self._udp_flows_moved is not None:
            self._udp_flows_moved(rescued, len(flows) - rescued)
        return flows

    def node_addresses_changed(self, addresses: tuple[str, ...]) -> bool:
        """The node's own addresses changed; True when the next sync must be a full one.

        They are the NodePort addresses under nodePortAddresses "primary" (in the table's
        fixed part), and they decide whether loadBalancerSourceRanges let the node's own
        traffic in (plans' elements): the next full sync reads every element back.
        """
        if addresses == self.renderer.node_addresses:
            return False
        self.renderer.node_addresses = addresses
        self._trusted = False
        return True

    def cleanup(self) -> bool:
        """Remove everything this backend made (the whole table)."""
        return self.nft.delete_table(self.family, self.settings.table)

    def read_back(self) -> KernelState | None:
        """What the kernel holds in our table, for the CLI, adoption and tests."""
        state = KernelState.read(self.nft, self.family, self.table, elements=True)
        if state is not None:
            state.load(state.containers)
        return state

    def _container_decl(self, name: str, spec: str) -> str:
        """A set's declaration, or a map's (its spec says what a key maps to)."""
        kind = "map" if " : " in spec else "set"
        return f"add {kind} inet {self.settings.table} {name} {{ {spec} }}"

    def _chain_decl(self, name: str, comment: str | None) -> str:
        body = f' {{ comment "{comment}"; }}' if comment else ""
        return f"add chain inet {self.settings.table} {name}{body}"

    def _add_rules(self, tx: Transaction, chain: str, rules: Iterable[str]) -> None:
        """Each rule carries a hash of its text, so a read-back tells whether a chain's rules
        are the wanted ones (nft prints rules in a form of its own)."""
        t = self.settings.table
        tx.extend(f'add rule inet {t} {chain} {r} comment "{rule_hash(r)}"' for r in rules)

    def _add_objects(self, tx: Transaction, r: Rendered) -> None:
        """Declare and fill `r`'s objects; its elements move into the transaction (taken out
        of `r`: at 30k services the table's strings are held once, not twice)."""
        for name, spec in sorted(r.sets.items()):
            tx.add(self._container_decl(name, spec))
        for name in sorted(r.chains):
            tx.add(self._chain_decl(name, r.comments.get(name)))
        for name in sorted(r.chains, key=_chain_order):
            self._add_rules(tx, name, r.chains[name])
        deferred = set(r.endpoint_maps())
        for container in sorted(r.elements.keys() | deferred):
            if container in deferred:
                values = r.endpoint_elements(container)
            else:
                values = r.elements.pop(container)
            if values:
                tx.add(self._elements("add", container, values))

    def _elements(self, verb: str, container: str, elements: Iterable[str]) -> Elements:
        """Elements added to (or keys deleted from) one map or set."""
        return Elements(verb, self.family, self.settings.table, container, tuple(elements))


def _chain_order(name: str) -> tuple[int, str]:
    """Endpoint chains first, then policy chains, then the chains that jump to those."""
    rank = {"ep": 0, "svc": 1, "local": 1, "lb": 1, "npc": 1, "arec": 1, "ext": 2, "xl": 2}
    rank |= {"np": 2, "alb": 2, "anp": 2, "aext": 3}
    return rank.get(name.split("-", 1)[0], 9), name


def _endpoint_maps_first(container: str) -> tuple[bool, str]:
    return ENDPOINT_MAP.match(container) is None, container


def _dynamic(container: str) -> bool:
    """State the packet path writes (clients' remembered endpoints): never diffed."""
    return container in KEPT or container.startswith("aff-")
