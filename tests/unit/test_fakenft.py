"""The fake nft refuses what the kernel refuses and applies a batch whole or not at all, so
that the unit tests built on it (test_nftables_backend.py) mean something;
tests/netns/test_fakenft_kernel.py holds it against a real kernel."""

from __future__ import annotations

import pytest

from lace_proxy.dataplane.nftables.kernel import KernelState
from lace_proxy.dataplane.nftables.transaction import NftError, Transaction
from testkit.fakenft import FakeNft

T = "inet t"
SETUP = (
    f"add table {T}",
    f"add chain {T} target",
    f"add chain {T} jumper",
    f"add set {T} dests {{ type ipv4_addr; }}",
    f"add rule {T} jumper ip daddr @dests jump target",
    f"add map {T} dispatch {{ type ipv4_addr : verdict; }}",
    f"add element {T} dispatch {{ 10.0.0.1 : goto target }}",
)


def nft() -> FakeNft:
    fake = FakeNft()
    fake.apply(Transaction(list(SETUP)))
    return fake


def refused(fake: FakeNft, *commands: str) -> str:
    """The error of a batch the fake must refuse; the table is left as it was."""
    before = fake.table_objects("inet", "t"), fake.list_table_text("inet", "t")
    with pytest.raises(NftError) as info:
        fake.apply(Transaction(list(commands)))
    after = fake.table_objects("inet", "t"), fake.list_table_text("inet", "t")
    assert before[0] == after[0]
    assert before[1] is not None and after[1] is not None
    assert before[1].elements("dispatch") == after[1].elements("dispatch")
    return info.value.stderr


def test_a_batch_applies_whole_or_not_at_all() -> None:
    fake = nft()
    error = refused(fake, f"add element {T} dests {{ 10.0.0.9 }}", f"flush chain {T} missing")
    assert "No such file or directory" in error and "flush chain inet t missing" in error
    assert fake.list_table_text("inet", "t").elements("dests") == []  # type: ignore[union-attr]
    assert len(fake.refused) == 1 and len(fake.applied) == 1


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        (f"delete element {T} dests {{ 10.0.0.9 }}", "No such file or directory"),
        (f"add element {T} dispatch {{ 10.0.0.1 : drop }}", "File exists"),
        (f"add element {T} dispatch {{ 10.0.0.2 : goto nowhere }}", "No such file or directory"),
        (f"add rule {T} target ip saddr @nothing drop", "No such file or directory"),
        (f"delete chain {T} target", "Device or resource busy"),  # jumped to
        (f"delete set {T} dests", "Device or resource busy"),  # looked up
        (f"delete map {T} dests", "No such file or directory"),  # a set, not a map
        (f"add rule {T} target goto nowhere", "No such file or directory"),
    ],
)
def test_it_refuses_what_the_kernel_refuses(command: str, reason: str) -> None:
    assert reason in refused(nft(), command)


def test_the_same_element_again_is_no_error_and_deletions_go_by_name_and_key() -> None:
    fake = nft()
    fake.apply(
        Transaction(
            [
                f"add element {T} dispatch {{ 10.0.0.1 : goto target }}",
                f"delete element {T} dispatch {{ 10.0.0.1 }}",
                f"delete chain {T} jumper",  # its rule goes with it
                f"delete chain {T} target",
            ]
        )
    )
    state = KernelState.read(fake, "inet", "t", elements=True)
    assert state is not None
    state.load(state.containers)
    assert state.chains == {}
    assert state.elements == {"dests": set(), "dispatch": set()}


def test_it_reads_back_as_nft_lists() -> None:
    fake = FakeNft()
    fake.apply(
        Transaction(
            [
                "table inet t {",
                "  set cidrs { type ipv4_addr; flags interval; elements = { 10.0.0.0/8 }; }",
                "  chain base {",
                "    type filter hook input priority 0; policy accept;",
                "    ip saddr @cidrs jump helper",
                "  }",
                "  chain helper {",
                "  }",
                "}",
                f'add chain {T} helper {{ comment "kept"; }}',
                f'add rule {T} helper accept comment "r:1"',
            ]
        )
    )
    state = KernelState.read(fake, "inet", "t", elements=True)
    assert state is not None
    state.load(state.containers)
    assert state.rules == {"base": [None], "helper": ["r:1"]}
    assert state.comments == {"helper": "kept"}  # read over netlink, comments included
    assert fake.tables[("inet", "t")].chains["helper"].comment == "kept"
    assert state.containers == {"cidrs": "set"}
    assert state.elements == {"cidrs": {"10.0.0.0/8"}}
    assert fake.delete_table("inet", "t") and not fake.delete_table("inet", "t")
    assert fake.table_objects("inet", "t") is None


def test_it_refuses_on_demand() -> None:
    fake = nft()
    fake.refuse_next("Operation not permitted")
    with pytest.raises(NftError, match="Operation not permitted"):
        fake.apply(Transaction([f"add element {T} dests {{ 10.0.0.9 }}"]))
    fake.apply(Transaction([f"add element {T} dests {{ 10.0.0.9 }}"]))
    assert [len(fake.refused), len(fake.applied)] == [1, 2]
