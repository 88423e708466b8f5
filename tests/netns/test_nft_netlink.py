"""nf_tables elements lace-proxy encodes itself, carried out by a real kernel: every layout
written and read back (and nft reads the same meaning), batches split over many messages,
a refusal that names the element and changes nothing, and an endpoint change of a running
proxy that reaches the kernel without an nft process. The codec is the one this build
chose (tox runs the suite once per twin)."""

from __future__ import annotations

import ipaddress
import random
import re
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from lace_proxy.dataplane.nft import Nft
from lace_proxy.dataplane.nftables import codec
from lace_proxy.dataplane.nftables.backend import NftablesBackend
from lace_proxy.dataplane.nftables.kernel import KernelState, canonical
from lace_proxy.dataplane.nftables.netlink import ElementChannel
from lace_proxy.dataplane.nftables.settings import NftablesSettings
from lace_proxy.dataplane.nftables.transaction import Elements, NftError
from lace_proxy.demo.testbed import Testbed

from .proxykit import VIP4, Harness, RecordingNft, endpoints, service

pytestmark = pytest.mark.netns

TABLE = "lace-proxy"
CHAIN = "nl-target"  # an empty chain the verdicts name (valid from any hook)


@pytest.fixture
def node() -> Iterator[str]:
    """A network namespace holding our table's skeleton and shared chains, no elements."""
    name = f"lp-nl-{random.randrange(1 << 24):06x}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    backend = NftablesBackend(NftablesSettings(), Nft(name))
    try:
        backend.full_sync([])
        nft = ["ip", "netns", "exec", name, "nft"]
        subprocess.run([*nft, f"add chain inet {TABLE} {CHAIN}"], check=True)
        for family, key in (
            (4, "ipv4_addr . inet_proto . inet_service"),
            (6, "inet_proto . inet_service"),
        ):
            kind = "" if family == 4 else "nodeports-"
            spec = f"{{ type {key}; }}"
            subprocess.run(
                [*nft, f"add set inet {TABLE} reach-{kind}abc-v{family} {spec}"], check=True
            )
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def _address(rng: random.Random, family: int) -> str:
    if family == 4:
        return str(ipaddress.IPv4Address(rng.randrange(0x0A000000, 0x0AFFFFFF)))
    return str(ipaddress.IPv6Address((0xFD00 << 112) | rng.randrange(1 << 64)))


def _field(code: int, rng: random.Random, family: int) -> str:
    if code in (codec.ADDR4, codec.ADDR6):
        return _address(rng, family)
    if code == codec.PROTO:
        return rng.choice(("tcp", "udp", "sctp"))
    if code == codec.PORT:
        return str(rng.randrange(1, 65536))
    if code == codec.MARK:
        return f"{rng.randrange(1, 1 << 32):#010x}"
    return rng.choice((f"goto {CHAIN}", f"jump {CHAIN}", "drop", "accept"))


def _elements(container: str, rng: random.Random, count: int) -> list[str]:
    """Distinct random elements of the container's layout (intervals: disjoint ranges)."""
    lay = codec.layout(container)
    assert lay is not None
    family = 6 if container.endswith("v6") else 4
    out: dict[str, str] = {}
    if lay.interval and len(lay.key) == 1:
        bits = 32 if family == 4 else 128
        base = int(ipaddress.ip_address("10.0.0.0" if family == 4 else "fd00::"))
        for i in range(count):  # /24s (/120s) apart, some a prefix, some a range, some one
            first = base + (i << 8) + (i % 3) * 16
            last = first + (255 if i % 3 == 0 else (0 if i % 3 == 1 else 16 + i % 7))
            a, b = ipaddress.ip_address(first), ipaddress.ip_address(last)
            key = f"{a}/{bits - 8}" if i % 3 == 0 else (str(a) if a == b else f"{a}-{b}")
            data = f" : {_field(codec.VERDICT, rng, family)}" if lay.data else ""
            out[key] = key + data
        return list(out.values())
    while len(out) < count:
        fields = [_field(c, rng, family) for c in lay.key]
        if lay.interval:  # firewall-allow: the source as a prefix
            fields[-1] = f"{fields[-1]}/{rng.choice((24, 32) if family == 4 else (64, 128))}"
        key = " . ".join(fields)
        data = " . ".join(_field(c, rng, family) for c in lay.data)
        out[key] = f"{key} : {data}" if lay.data else key
    return list(out.values())


def _meaning(elements: list[str]) -> set[object]:
    return {canonical(e) for e in elements}


CONTAINERS = [*sorted(codec._BY_NAME), "reach-abc-v4", "reach-nodeports-abc-v6"]


def test_every_layout_is_written_and_read_back_as_nft_reads_it(node: str) -> None:
    """Each map and set the codec writes: the kernel takes the elements, reads them back as
    written (by meaning), and nft, which knows the declared types, lists the same."""
    rng = random.Random(17)
    channel = ElementChannel(node)
    wanted = {c: _elements(c, rng, 40) for c in CONTAINERS}
    channel.apply([Elements("add", "inet", TABLE, c, tuple(e)) for c, e in wanted.items()])
    listing = Nft(node).list_table_text("inet", TABLE)
    assert listing is not None
    for container, elements in wanted.items():
        got = channel.read("inet", TABLE, container)
        assert got is not None
        assert _meaning(got) == _meaning(elements), container
        assert _meaning(listing.elements(container)) == _meaning(elements), container
    # Deleted by key (a map's value left out), they are gone. (The rescue maps' elements
    # time out by themselves: not deleted here, lest they expire first on a slow machine.)
    wanted = {c: els for c, els in wanted.items() if not c.startswith("rescue-")}
    channel.apply(
        [
            Elements("delete", "inet", TABLE, c, tuple(e.split(" : ")[0] for e in els[:30]))
            for c, els in wanted.items()
        ]
    )
    for container, elements in wanted.items():
        assert _meaning(channel.read("inet", TABLE, container) or []) == _meaning(elements[30:])


def test_a_batch_of_many_messages_is_one_transaction(node: str) -> None:
    """30k endpoints take many messages (each element list under 64 KiB); all arrive, and
    a refusal in the last message leaves the kernel without any of them."""
    rng = random.Random(3)
    elements = _elements("endpoints-0-v4", rng, 30_000)
    channel = ElementChannel(node)
    bad = f"{VIP4} . tcp . 80 . 0 : 10.0.0.1 . 70000"  # a port out of range: the codec's
    with pytest.raises(NftError, match="70000"):
        channel.apply([Elements("add", "inet", TABLE, "endpoints-0-v4", (*elements, bad))])
    # The kernel's own refusal, named: a verdict to a chain that does not exist.
    nowhere = f"{VIP4} . tcp . 80 : goto nowhere"
    fine = [e for e in _elements("service-ips-v4", rng, 3000) if "goto" in e or "drop" in e]
    with pytest.raises(NftError, match="nowhere") as refused:
        channel.apply(
            [
                Elements("add", "inet", TABLE, "endpoints-0-v4", tuple(elements)),
                Elements("add", "inet", TABLE, "service-ips-v4", (*fine, nowhere)),
            ]
        )
    assert "No such file or directory" in str(refused.value)
    assert channel.read("inet", TABLE, "endpoints-0-v4") == []
    channel.apply([Elements("add", "inet", TABLE, "endpoints-0-v4", tuple(elements))])
    got = channel.read("inet", TABLE, "endpoints-0-v4")
    assert got is not None and sorted(got) == sorted(elements)


def test_an_absent_container_reads_as_none(node: str) -> None:
    channel = ElementChannel(node)
    assert channel.read("inet", TABLE, "reach-nothere-v4") is None
    assert channel.read("inet", "no-such-table", "endpoints-0-v4") is None


class _Counting(RecordingNft):
    """The real nft, counting the nft processes run."""

    def __init__(self, netns: str) -> None:
        super().__init__(netns)
        self.runs: list[list[str]] = []

    def _run(self, args: list[str], stdin: str | None = None) -> str:
        self.runs.append(args)
        return super()._run(args, stdin)


def test_an_endpoint_change_runs_no_nft(
    make_testbed: Callable[..., Testbed], tmp_path: Path
) -> None:
    """A running proxy's endpoint change goes to the kernel as one netlink batch, and the
    traffic follows it."""
    tb = make_testbed(pods=3)
    harness = Harness(tb, tmp_path / "m", verify_every=10)
    counting = _Counting(tb.node.ns.name)
    harness.nft.nft = counting
    pods = tb.pods
    harness.write("web", service("web", [VIP4]), endpoints("web", pods))
    harness.sync()
    assert counting.runs  # the first sync: the skeleton is nft's
    counting.runs.clear()
    sent = len(counting.applied)
    harness.write("web", service("web", [VIP4]), endpoints("web", pods[:1]))
    harness.sync()
    assert counting.runs == []
    (tx,) = counting.applied[sent:]
    assert tx.elements_only()
    got = harness.nft.read_back()
    assert got is not None
    assert {e.split(" : ")[1] for e in got.elements["endpoints-0-v4"]} == {f"{pods[0].ipv4} . 8080"}


def test_the_structure_read_over_netlink_is_what_nft_lists(
    make_testbed: Callable[..., Testbed], tmp_path: Path
) -> None:
    """Chains with their comments, rules in order with their hash comments, maps and sets:
    the netlink read agrees with nft's own JSON (and chain comments with its text)."""
    tb = make_testbed(pods=2)
    harness = Harness(tb, tmp_path / "m")
    sticky = {"sessionAffinity": "ClientIP"}
    harness.write(
        "sticky",
        service("sticky", ["10.96.0.13", "fd00:96::13"], **sticky),
        endpoints("sticky", tb.pods, v6=True),
    )
    harness.sync()
    nft = Nft(tb.node.ns.name)
    raw = nft.ruleset()
    ours = ElementChannel(tb.node.ns.name).table_objects("inet", TABLE)
    assert ours is not None
    got = KernelState.from_json(ours)
    items = [i for i in raw["nftables"] if next(iter(i.values())).get("table") == TABLE]
    listed = KernelState.from_json({"nftables": [{"table": {}}, *items]})
    assert (got.rules, got.containers) == (listed.rules, listed.containers)
    assert any(got.rules[c] for c in got.rules if c.startswith("svc-"))
    text = subprocess.run(
        ["ip", "netns", "exec", tb.node.ns.name, "nft", "list", "table", "inet", TABLE],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    comments = dict(re.findall(r'chain (\S+) \{\n\t\tcomment "([^"]*)"', text))
    assert got.comments == comments and "default/sticky:p/TCP/v6" in comments.values()


def test_threads_sharing_a_channel_each_get_their_own_answers(node: str) -> None:
    """The dataplane thread syncs while another reads the table back (the proxier's tests,
    the state socket): each request's answers reach the thread that asked, none hangs."""
    channel = ElementChannel(node)
    rng = random.Random(5)
    elements = _elements("endpoints-0-v4", rng, 2000)
    failures: list[BaseException] = []

    def write() -> None:
        try:
            for _ in range(40):
                channel.apply([Elements("add", "inet", TABLE, "endpoints-0-v4", tuple(elements))])
                keys = tuple(e.split(" : ")[0] for e in elements)
                channel.apply([Elements("delete", "inet", TABLE, "endpoints-0-v4", keys)])
        except BaseException as exc:  # reported below
            failures.append(exc)

    def read() -> None:
        try:
            for _ in range(40):
                objects = channel.table_objects("inet", TABLE)
                assert objects is not None and KernelState.from_json(objects).containers
                got = channel.read("inet", TABLE, "endpoints-0-v4")
                assert got is not None and len(got) in (0, len(elements))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=write), threading.Thread(target=read)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread waits for an answer it never gets"
    assert failures == []


def test_a_count_past_the_precreated_ones_is_made_by_the_change(
    make_testbed: Callable[..., Testbed], tmp_path: Path
) -> None:
    """Every full sync makes counts 1..16; a change to 17 endpoints makes its count (set,
    endpoint map, pick chain, rule) in its own transaction, which the kernel takes."""
    tb = make_testbed(pods=3)
    harness = Harness(tb, tmp_path / "m", verify_every=1)
    counting = _Counting(tb.node.ns.name)
    harness.nft.nft = counting
    harness.write("web", service("web", [VIP4]), endpoints("web", tb.pods))
    harness.sync()
    others = [SimpleNamespace(ipv4=f"10.244.9.{i}") for i in range(1, 15)]
    harness.write("web", service("web", [VIP4]), endpoints("web", [*tb.pods, *others]))
    sent = len(counting.applied)
    harness.sync()
    assert len(counting.applied) == sent + 1  # one transaction, not a full sync
    got = harness.nft.read_back()
    assert got is not None
    assert got.elements["endpoints-count-17-v4"] == {f"{VIP4} . tcp . 80"}
    held = {e for i in range(17) for e in got.elements[f"endpoints-{i}-v4"]}
    wanted = [*(p.ipv4 for p in tb.pods), *(o.ipv4 for o in others)]
    assert held == {f"{VIP4} . tcp . 80 : {ip} . 8080" for ip in wanted}
    chain = tb.exec(tb.node, ["nft", "list", "chain", "inet", TABLE, "lb-v4"]).stdout
    assert "@endpoints-count-17-v4 numgen random mod 17 vmap" in chain
    sent = len(counting.applied)
    harness.sync(full=True)  # reads every element back: the table is as a full sync wants
    assert counting.applied[sent:] == []
