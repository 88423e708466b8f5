"""The nftables backend's sync logic without root: what apply, full sync and adoption send,
on the fake kernel of testkit/fakenft.py. tests/netns/test_adoption.py and its neighbours
prove the same on a real kernel, with traffic."""

from __future__ import annotations

import asyncio
import gc
import random

import pytest

from lace_proxy.dataplane.nftables.backend import NftablesBackend
from lace_proxy.dataplane.nftables.kernel import KernelState
from lace_proxy.dataplane.nftables.settings import NftablesSettings
from lace_proxy.dataplane.nftables.transaction import NftError, Transaction
from lace_proxy.model import EndpointSlice, Service
from lace_proxy.model.service import ServicePort
from lace_proxy.proxier import Proxier
from lace_proxy.table import ServiceTable
from testkit.fakenft import FakeNft

from .tablekit import ep, eps, svc

NODE = "node-a"
SETTINGS = NftablesSettings(cluster_cidrs=("10.244.0.0/16",))
#: The same with the biggest containers split in four (parts.py), as at scale.
SPLIT = NftablesSettings(cluster_cidrs=("10.244.0.0/16",), parts=4)
LAYOUTS = pytest.mark.parametrize("settings", [SETTINGS, SPLIT], ids=["whole", "split"])
T = "inet lace-proxy"
VIP = "10.96.0.10"


class Node:
    """A node's service table and nftables backend on a fake kernel, synced by hand as the
    proxier syncs them."""

    def __init__(
        self,
        nft: FakeNft | None = None,
        *,
        verify_every: int = 1,
        settings: NftablesSettings = SETTINGS,
    ) -> None:
        self.nft = nft if nft is not None else FakeNft()
        self.verify_every = verify_every
        self.settings = settings
        self.table = ServiceTable(NODE)
        self.backend = NftablesBackend(settings, self.nft, verify_every=verify_every)
        self.objects: dict[tuple[str, str], Service | EndpointSlice] = {}

    def put(self, *objects: Service | EndpointSlice) -> None:
        for obj in objects:
            if isinstance(obj, Service):
                self.table.upsert_service(obj)
            else:
                self.table.upsert_slice(obj)
            self.objects[(type(obj).__name__, obj.key)] = obj

    def remove(self, obj: Service | EndpointSlice) -> None:
        if isinstance(obj, Service):
            self.table.delete_service(obj.key)
        else:
            self.table.delete_slice(obj.key)
        del self.objects[(type(obj).__name__, obj.key)]

    def sync(self, *, full: bool = False) -> list[str]:
        """Program what changed (everything, with `full`); the commands sent."""
        sent = len(self.nft.applied)
        changes = self.table.build()
        if full:
            self.table.commit()
            self.backend.full_sync(list(self.table.plans()), changes)
        else:
            self.backend.apply(changes)
            self.table.commit()
        return [c for tx in self.nft.applied[sent:] for c in tx.lines()]

    def restarted(self, nft: FakeNft | None = None) -> Node:
        """A new process: the same objects, a backend that remembers nothing, on this node's
        kernel (or on `nft`)."""
        node = Node(
            nft if nft is not None else self.nft,
            verify_every=self.verify_every,
            settings=self.settings,
        )
        node.put(*self.objects.values())
        return node

    def kernel(self) -> KernelState:
        state = self.backend.read_back()
        assert state is not None
        return state

    def affinity_id(self, plan_id: str) -> str:
        return self.backend.renderer.affinity_ids.get(plan_id)


def web(
    *endpoints: str, name: str = "web", vip: str = VIP, **spec: object
) -> tuple[Service, EndpointSlice]:
    """A service and its slice; the first endpoint runs on this node, the others elsewhere."""
    nodes = [NODE if i == 0 else "node-b" for i in range(len(endpoints))]
    return (
        svc(name, ips=(vip,), **spec),
        eps(*(ep(ip, node) for ip, node in zip(endpoints, nodes, strict=True)), service=name),
    )


def fresh_kernel(node: Node) -> KernelState:
    """What a new process programs from the same objects into an empty kernel."""
    fresh = node.restarted(FakeNft())
    fresh.sync(full=True)
    return fresh.kernel()


def test_an_endpoint_change_sends_only_its_elements() -> None:
    node = Node()
    node.put(*web("10.244.1.10", "10.244.2.10"))
    node.sync(full=True)
    node.put(*web("10.244.1.10", "10.244.2.10", "10.244.3.10"))
    assert node.sync() == [
        f"add element {T} endpoints-2-v4 {{ {VIP} . tcp . 80 : 10.244.3.10 . 8080 }}",
        f"delete element {T} endpoints-count-2-v4 {{ {VIP} . tcp . 80 }}",
        f"add element {T} endpoints-count-3-v4 {{ {VIP} . tcp . 80 }}",
    ]  # the count is data; no hairpin pair: the new endpoint runs on another node
    node.put(*web("10.244.3.10", "10.244.2.10", "10.244.1.10"))  # now this node's is .3
    node.sync()
    node.put(*web("10.244.1.10", "10.244.3.10"))
    assert node.sync() == [
        f"delete element {T} endpoints-1-v4 {{ {VIP} . tcp . 80 }}",
        f"add element {T} endpoints-1-v4 {{ {VIP} . tcp . 80 : 10.244.3.10 . 8080 }}",
        f"delete element {T} endpoints-2-v4 {{ {VIP} . tcp . 80 }}",
        f"add element {T} endpoints-count-2-v4 {{ {VIP} . tcp . 80 }}",
        f"delete element {T} endpoints-count-3-v4 {{ {VIP} . tcp . 80 }}",
        f"delete element {T} hairpin-v4 {{ 10.244.3.10 . 10.244.3.10 }}",
        f"add element {T} hairpin-v4 {{ 10.244.1.10 . 10.244.1.10 }}",
    ]
    assert node.kernel() == fresh_kernel(node)


@LAYOUTS
def test_a_full_sync_of_the_table_as_programmed_sends_nothing(settings: NftablesSettings) -> None:
    node = Node(settings=settings)
    node.put(*web("10.244.1.10", "10.244.2.10"))
    node.put(*web("10.244.1.11", name="sticky", vip="10.96.0.11", session_affinity=True))
    node.put(svc("lonely", ips=("10.96.0.12", "fd00:96::12")))
    node.sync(full=True)
    assert node.sync(full=True) == []
    # A restarted process adopts the table: nothing flushed, nothing sent.
    assert node.restarted().sync(full=True) == []


def test_a_periodic_full_sync_reads_elements_only_when_the_structure_changed() -> None:
    node = Node(verify_every=10)
    node.put(*web("10.244.1.10", "10.244.2.10"))
    node.sync(full=True)
    node = node.restarted()
    assert node.sync(full=True) == []
    assert node.nft.listings == 1  # the first full sync of a process verifies every element
    node.nft.tamper(f"delete element {T} endpoints-1-v4 {{ {VIP} . tcp . 80 }}")
    assert node.sync(full=True) == []
    assert node.nft.listings == 1  # elements unread: the deleted one is not noticed yet
    node.nft.tamper(f"flush chain {T} ext-v4")
    sent = node.sync(full=True)
    assert node.nft.listings == 2  # the structure differs: every element is verified
    assert f"flush chain {T} ext-v4" in sent
    assert f"add element {T} endpoints-1-v4 {{ {VIP} . tcp . 80 : 10.244.2.10 . 8080 }}" in sent


def test_drift_is_repaired_element_by_element() -> None:
    node = Node()
    node.put(*web("10.244.1.10", "10.244.2.10"))
    node.put(*web("10.244.1.11", name="edge", vip="10.96.0.11", external_ips=("192.0.2.11",)))
    node.sync(full=True)
    node.nft.tamper(
        f"delete element {T} endpoints-1-v4 {{ {VIP} . tcp . 80 }}",
        f"flush chain {T} ext-v4",
        f"add chain {T} intruder",
    )
    sent = node.sync(full=True)
    rules = [c for c in sent if c.startswith(f"add rule {T} ext-v4 ")]
    assert len(rules) == 2
    assert sorted(sent) == sorted(
        [
            f"add element {T} endpoints-1-v4 {{ {VIP} . tcp . 80 : 10.244.2.10 . 8080 }}",
            f"flush chain {T} ext-v4",
            *rules,
            f"flush chain {T} intruder",
            f"delete chain {T} intruder",
        ]
    )
    assert node.kernel() == fresh_kernel(node)


def test_a_restart_adopts_the_affinity_ids_of_the_previous_process() -> None:
    sticky = "default/sticky:http/TCP/v4"
    first = Node()
    endpoints = ("10.244.1.10", "10.244.2.10", "10.244.2.11")
    first.put(*web(*endpoints, name="sticky", session_affinity=True))
    first.sync(full=True)
    assigned = first.affinity_id(sticky)
    # An endpoint leaves: the service port gets a new id, its clients' choices are orphaned.
    first.put(*web(*endpoints[:2], name="sticky", session_affinity=True))
    first.sync()
    kept = first.affinity_id(sticky)
    assert kept != assigned
    # A new process adopts that id (one of its own would differ): nothing to send.
    second = first.restarted()
    assert second.sync(full=True) == []
    assert second.affinity_id(sticky) == kept
    fresh = first.restarted(FakeNft())
    fresh.sync(full=True)
    assert fresh.affinity_id(sticky) != kept


def test_an_endpoint_gone_while_down_orphans_the_affinity_id() -> None:
    sticky = "default/sticky:http/TCP/v4"
    first = Node()
    first.put(*web("10.244.1.10", "10.244.2.10", name="sticky", session_affinity=True))
    first.sync(full=True)
    before = first.affinity_id(sticky)
    # Added while down: remembered choices stay valid, and so does the id.
    first.put(
        *web("10.244.1.10", "10.244.2.10", "10.244.2.11", name="sticky", session_affinity=True)
    )
    grown = first.restarted()
    grown.sync(full=True)
    assert grown.affinity_id(sticky) == before
    # Gone while down: the adopted id is replaced, in the maps that key by it.
    first.put(*web("10.244.1.10", name="sticky", session_affinity=True))
    shrunk = first.restarted()
    sent = shrunk.sync(full=True)
    after = shrunk.affinity_id(sticky)
    assert after != before
    assert f"add element {T} affinity-ids-v4 {{ {VIP} . tcp . 80 : {after} }}" in sent


def test_a_refused_transaction_makes_the_next_sync_a_verified_full_one() -> None:
    nft = FakeNft()
    backend = NftablesBackend(SETTINGS, nft, verify_every=10)
    proxier = Proxier(ServiceTable(NODE), backend, sources=["files"])
    proxier.synced("files")
    service, slice_ = web("10.244.1.10", "10.244.2.10")
    proxier.service_upserted(service)
    proxier.slice_upserted(slice_)
    assert asyncio.run(proxier.sync())
    assert (proxier.stats.full_syncs, nft.listings) == (1, 0)  # an empty kernel: nothing to read
    proxier.slice_upserted(web("10.244.1.10")[1])
    nft.refuse_next()
    assert not asyncio.run(proxier.sync())
    assert len(nft.refused) == 1 and proxier.stats.failures == 1
    # The retry is a full sync that reads every element back: the kernel's state is unknown.
    assert asyncio.run(proxier.sync())
    assert (proxier.stats.full_syncs, nft.listings) == (2, 1)
    node = Node()
    node.put(*web("10.244.1.10"))
    node.sync(full=True)
    assert backend.read_back() == node.kernel()


def test_a_count_first_needed_while_no_proxy_ran_is_made_and_filled_by_the_restart() -> None:
    """17 endpoints, more than any count made before: a restarted process declares the
    count's set and maps and fills them (they were declared and left empty, so the service
    was in no count set and unreachable until a later verified sync)."""
    first = Node()
    first.put(*web("10.244.1.10"))
    first.sync(full=True)
    first.put(*web(*[f"10.244.2.{i}" for i in range(1, 18)]))
    second = first.restarted()
    sent = second.sync(full=True)
    assert f"add element {T} endpoints-count-17-v4 {{ {VIP} . tcp . 80 }}" in sent
    assert second.kernel() == fresh_kernel(second)


def test_a_count_past_the_precreated_ones_is_made_by_the_change() -> None:
    node = Node()
    node.put(*web("10.244.1.10"))
    node.sync(full=True)
    many = [f"10.244.2.{i}" for i in range(1, 18)]  # 17: more than the precreated counts
    node.put(*web(*many))
    sent = node.sync()
    frontend = "type ipv4_addr . inet_proto . inet_service"
    assert f"add set {T} endpoints-count-17-v4 {{ {frontend}; }}" in sent
    assert f"add map {T} endpoints-16-v4 {{ {frontend} : ipv4_addr . inet_service; }}" in sent
    assert f"add chain {T} lb-pick-16-v4" in sent
    rule = f"add rule {T} lb-v4 ip daddr . meta l4proto . th dport @endpoints-count-17-v4 "
    assert any(c.startswith(rule) for c in sent)
    assert node.kernel() == fresh_kernel(node)
    # The count stays once made: going back to it is data again.
    node.put(*web("10.244.1.10"))
    node.sync()
    node.put(*web(*many))
    assert all(c.startswith(("add element", "delete element")) for c in node.sync())


def test_endpoint_changes_never_add_a_jump() -> None:
    """An endpoint change (a count that changes, endpoints that go and come back, an
    affinity id replaced) adds no goto or jump element, nor does a new service: adding one
    makes the kernel re-validate every chain it leads to (seconds at 30k services on 6.1)."""
    node = Node()

    def node_port(port: int) -> dict[str, object]:
        return {"type": "NodePort", "ports": (ServicePort("http", "TCP", 80, 8080, port),)}

    kinds: dict[str, dict[str, object]] = {
        "web": {},
        "edge": {"external_ips": ("192.0.2.11",), **node_port(30011)},
        "local": {
            "external_ips": ("192.0.2.12",),
            "external_traffic_policy": "Local",
            **node_port(30012),
        },
        "sticky": {"session_affinity": True, **node_port(30013)},
    }
    for i, (name, spec) in enumerate(kinds.items()):
        node.put(*web("10.244.1.10", "10.244.2.10", name=name, vip=f"10.96.0.{20 + i}", **spec))
    node.sync(full=True)
    sent: list[str] = []
    for endpoints in (
        ("10.244.1.10", "10.244.2.10", "10.244.3.10"),
        ("10.244.2.10",),
        (),
        ("10.244.1.11",),
        ("10.244.1.11", "10.244.2.11"),
        ("10.244.2.11",),
    ):
        for i, (name, spec) in enumerate(kinds.items()):
            node.put(*web(*endpoints, name=name, vip=f"10.96.0.{20 + i}", **spec))
        sent += node.sync()
    # Nor does a new service (a jump element of a per-service chain is the exception).
    new = {**kinds["local"], "external_ips": ("192.0.2.13",), **node_port(30014)}
    node.put(*web("10.244.1.12", name="new", vip="10.96.0.30", **new))
    sent += node.sync()
    jumps = [c for c in sent if c.startswith("add element") and (": goto" in c or ": jump" in c)]
    assert sent and not jumps
    assert node.restarted().sync(full=True) == []  # what a new process wants (ids adopted)


def test_a_table_of_another_skeleton_is_rewritten_in_one_batch() -> None:
    node = Node()
    node.put(*web("10.244.1.10", "10.244.2.10"))
    node.sync(full=True)
    marker = next(c for c in node.kernel().chains if c.startswith("skeleton-"))
    node.nft.tamper(f"delete chain {T} {marker}")
    restarted = node.restarted()
    batches = len(node.nft.applied)
    sent = restarted.sync(full=True)
    assert len(node.nft.applied) == batches + 1
    assert f"flush chain {T} services" in sent
    assert marker in restarted.kernel().chains
    assert restarted.restarted().sync(full=True) == []


@LAYOUTS
def test_incremental_syncs_leave_the_table_a_full_sync_makes_from_scratch(
    settings: NftablesSettings,
) -> None:
    """Random changes of services of every kind but ClientIP affinity (whose ids depend on
    the history by design), each programmed by `apply`, compared with a new process's
    table after each."""
    rng = random.Random(16)
    kinds: list[dict[str, object]] = [
        {},
        {"type": "NodePort", "ports": (ServicePort("http", "TCP", 80, 8080, 30080),)},
        {
            "type": "NodePort",
            "ports": (ServicePort("http", "TCP", 80, 8080, 30081),),
            "external_traffic_policy": "Local",
        },
        {
            "type": "LoadBalancer",
            "ports": (ServicePort("http", "TCP", 80, 8080, 30082),),
            "lb_ingress_ips": ("192.0.2.3",),
            "lb_source_ranges": ("198.51.100.0/24",),
        },
        {"external_ips": ("192.0.2.4",), "internal_traffic_policy": "Local"},
    ]
    node = Node(settings=settings)
    node.sync(full=True)
    for _ in range(40):
        i = rng.randrange(len(kinds))
        name, vip = f"s{i}", f"10.96.0.{i + 1}"
        pods = [f"10.244.{n}.{i + 10}" for n in range(1, 5)]
        service, slice_ = web(*rng.sample(pods, rng.randint(0, 4)), name=name, vip=vip, **kinds[i])
        if rng.random() < 0.2 and ("Service", service.key) in node.objects:
            node.remove(service)
            node.remove(slice_)
        else:
            node.put(service, slice_)
        node.sync()
        assert node.kernel() == fresh_kernel(node)


class _CollectorWitness(FakeNft):
    """Records whether Python's cyclic collector was on at each transaction."""

    def __init__(self) -> None:
        super().__init__()
        self.collecting: list[bool] = []

    def apply(self, tx: Transaction) -> None:
        self.collecting.append(gc.isenabled())
        super().apply(tx)


def test_a_verified_full_sync_runs_with_the_collector_paused() -> None:
    """The collector is off while a verified full sync renders, reads back and sends (its
    passes found nothing to free and cost 0.3-0.4 s of a 30k adoption), on again after it,
    also after a refused transaction; an incremental change runs with it on."""
    witness = _CollectorWitness()
    node = Node(witness)
    node.put(*web("10.244.1.10", "10.244.2.10"))
    node.sync(full=True)
    assert witness.collecting and not any(witness.collecting)
    assert gc.isenabled()
    node.put(*web("10.244.1.10"))
    node.sync()
    assert witness.collecting[-1]
    witness.refuse_next()
    node.put(*web("10.244.1.11"))
    with pytest.raises(NftError):
        node.sync(full=True)
    assert gc.isenabled()
    gc.disable()  # a caller that paused it itself keeps it paused
    try:
        node.sync(full=True)
        assert not gc.isenabled()
    finally:
        gc.enable()
