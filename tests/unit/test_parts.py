"""The split of the biggest containers (parts.py): how many parts, which part an address is
in, and what the renderer writes with them. tests/netns/test_parts.py holds the split
against the kernel's own reading of the guard, on traffic."""

from __future__ import annotations

import ipaddress
import random

import pytest

from lace_proxy.dataplane.nftables import parts
from lace_proxy.dataplane.nftables.codec import layout
from lace_proxy.dataplane.nftables.render import Rendered, Renderer
from lace_proxy.dataplane.nftables.settings import NftablesSettings
from lace_proxy.dataplane.nftables.shared import ENDPOINT_MAP, need_of
from lace_proxy.table import ServiceTable

from .tablekit import ep, eps, svc


def test_parts_double_past_their_size_and_halve_only_well_below_it() -> None:
    size = parts.PART_SIZE
    assert parts.parts_for(0) == 1
    assert parts.parts_for(size) == 1
    assert parts.parts_for(size + 1) == 2
    assert parts.parts_for(100_000 * 5 // 4) == 8  # 100k Services of 1.25 ports
    # Once split, a table shrinks only below a quarter of its parts' size: no rewrite back
    # and forth around a boundary.
    assert parts.parts_for(size, current=2) == 2
    assert parts.parts_for(size // 2, current=2) == 2
    assert parts.parts_for(size // 2 - 1, current=2) == 1
    assert parts.parts_for(10**9) == parts.MAX_PARTS
    assert parts.parts_for(5, size=2) == 4


def test_an_address_is_in_the_part_of_its_last_byte() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        count = 1 << rng.randrange(0, 9)
        raw = rng.getrandbits(32) if rng.random() < 0.5 else rng.getrandbits(128)
        address = ipaddress.ip_address(raw)
        expected = address.packed[-1] & (count - 1)
        assert parts.part_of(str(address), count) == expected, (address, count)
    assert parts.part_of("fd00::", 8) == 0
    assert parts.part_of("::ffff:10.0.0.13", 8) == 5  # a mapped IPv4 address's last octet
    assert parts.part_of("10.96.3.13", 1) == 0


def test_guards_and_dispatch_read_the_same_bits() -> None:
    assert parts.guard(4, 3, 1) == ""
    assert parts.guard(4, 3, 8) == "ip daddr & 0.0.0.7 == 0.0.0.3 "
    assert parts.guard(6, 10, 16) == "ip6 daddr & ::f == ::a "
    assert parts.dispatch(4, 2, ["a", "b"]) == (
        "ip daddr & 0.0.0.1 vmap { 0.0.0.0 : goto a, 0.0.0.1 : goto b }"
    )
    assert parts.tags(6, 1) == ["v6"]
    assert parts.tags(4, 2) == ["v4-p0", "v4-p1"]


def test_a_table_read_back_tells_its_parts_and_a_container_its_names() -> None:
    assert parts.count(["cluster-ips-v4", "cluster-ips-v6"]) == 1
    assert parts.count([f"cluster-ips-v4-p{k}" for k in range(4)] + ["cluster-ips-v6-p0"]) == 4
    present = ["frontends-lb-v4-p0", "frontends-lb-v4-p1", "frontends-lb-v4-px", "frontends-lb-v6"]
    assert parts.holders("frontends-lb-v4", present) == present[:2]
    assert parts.holders("frontends-lb-v6", present) == ["frontends-lb-v6"]


def test_settings_take_a_power_of_two_of_parts_only() -> None:
    assert NftablesSettings(parts=8).parts_for(1, 1) == 8
    assert NftablesSettings().parts_for(40_000, 1) == 4
    for bad in (3, 512, -2):
        with pytest.raises(ValueError, match="power of two"):
            NftablesSettings(parts=bad)
    with pytest.raises(ValueError, match="part size"):
        NftablesSettings(part_size=0)


def test_a_split_containers_layout_is_the_whole_ones() -> None:
    for name in ("cluster-ips-v4", "frontends-lb-v6", "endpoints-3-v4", "endpoints-count-2-v6"):
        assert layout(f"{name}-p5") == layout(name) is not None
    assert need_of("endpoints-count-7-v4-p3") == need_of("endpoints-count-7-v4") == "lb-v4-7"
    match = ENDPOINT_MAP.match("endpoints-2-v6-p1")
    assert match is not None and match.groups() == ("endpoints", "2", "6", "1")


def test_the_renderer_puts_each_frontend_in_its_parts_and_the_chains_pick_by_them() -> None:
    table = ServiceTable("node-a")
    for k in range(4):
        table.upsert_service(svc(f"s{k}", ips=(f"10.96.0.{k + 1}",)))
        table.upsert_slice(eps(ep(f"10.244.1.{k + 1}", "node-b"), service=f"s{k}"))
    table.build()
    table.commit()
    renderer = Renderer(NftablesSettings())
    renderer.parts = 4
    merged = Rendered(deferred={})
    for plan in table.plans():
        renderer.render(plan, merged)
    for k in range(4):
        vip = f"10.96.0.{k + 1}"
        part = f"v4-p{(k + 1) & 3}"
        assert merged.elements[f"frontends-lb-{part}"] == {f"{vip} . tcp . 80"}
        assert merged.elements[f"endpoints-count-1-{part}"] == {f"{vip} . tcp . 80"}
        assert merged.endpoint_elements(f"endpoints-0-{part}") == {
            f"{vip} . tcp . 80 : 10.244.1.{k + 1} . 8080"
        }
    chains = renderer.shared.chains({"lb-v4-1", "lb-v4-2"})
    assert chains["lb-v4"] == (
        "ip daddr & 0.0.0.3 vmap { 0.0.0.0 : goto lb-v4-p0, 0.0.0.1 : goto lb-v4-p1,"
        " 0.0.0.2 : goto lb-v4-p2, 0.0.0.3 : goto lb-v4-p3 }",
    )
    assert chains["lb-v4-p2"][0] == (
        "ip daddr . meta l4proto . th dport @endpoints-count-1-v4-p2 goto lb-pick-0-v4"
    )
    assert chains["lb-pick-1-v4"][3] == (
        "ip daddr & 0.0.0.3 == 0.0.0.3 dnat ip to ip daddr . meta l4proto . th dport"
        " map @endpoints-1-v4-p3"
    )
    # NodePorts are few (a port range): theirs stay whole.
    assert "npc-v4-p0" not in chains
    sets = renderer.shared.sets({"lb-v4-2", "npc-v4-1"})
    assert {n for n in sets if n.startswith("endpoints-")} == {
        f"endpoints-{what}-v4-p{k}" for what in ("count-2", "0", "1") for k in range(4)
    }
    assert "nodeport-endpoints-0-v4" in sets
