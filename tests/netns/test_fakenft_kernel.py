"""The fake nft of the unit tests (testkit/fakenft.py) against the kernel: the transactions
the proxy sent to a real node leave the fake's model reading back as the kernel does, and
the kernel refuses what the fake refuses. What the unit tests conclude on the fake holds."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from lace_proxy.dataplane.nft import Nft
from lace_proxy.dataplane.nftables.backend import NftablesBackend
from lace_proxy.dataplane.nftables.kernel import KernelState, canonical
from lace_proxy.dataplane.nftables.transaction import NftError, Transaction
from lace_proxy.demo.testbed import CLIENT4, Testbed
from testkit.fakenft import FakeNft

from .proxykit import LB4, VIP4, VIP6, Harness, RecordingNft, endpoints, service

pytestmark = pytest.mark.netns


def meaning(state: KernelState) -> tuple[object, ...]:
    """A read-back with its elements by meaning (nft prints some its own way)."""
    elements = {c: {canonical(e) for e in values} for c, values in state.elements.items()}
    return state.chains, state.comments, state.rules, state.containers, elements


def test_the_fake_holds_what_the_kernel_holds_after_the_same_transactions(
    make_testbed: Callable[..., Testbed], tmp_path: Path
) -> None:
    tb = make_testbed(pods=3)
    harness = Harness(tb, tmp_path / "m")
    recorder = RecordingNft(tb.node.ns.name)
    harness.nft.nft = recorder
    pods = tb.pods
    sticky = {"sessionAffinity": "ClientIP"}
    harness.write("web", service("web", [VIP4, VIP6]), endpoints("web", pods))
    harness.write(
        "edge",
        service(
            "edge",
            ["10.96.0.11"],
            type="LoadBalancer",
            node_port=30081,
            loadBalancerSourceRanges=[f"{CLIENT4}/32"],
            externalTrafficPolicy="Local",
            status={"loadBalancer": {"ingress": [{"ip": LB4}]}},
        ),
        endpoints("edge", pods[:2]),
    )
    harness.write(
        "sticky",
        service("sticky", ["10.96.0.13", "fd00:96::13"], **sticky),
        endpoints("sticky", pods),
        endpoints("sticky", pods, v6=True),
    )
    harness.write("empty", service("empty", ["10.96.0.15"]))
    harness.sync()
    # Endpoints leave (elements go, per-endpoint chains and sets are deleted), a service goes.
    harness.write("web", service("web", [VIP4, VIP6]), endpoints("web", pods[:1]))
    harness.write(
        "sticky",
        service("sticky", ["10.96.0.13", "fd00:96::13"], **sticky),
        endpoints("sticky", pods[1:2], v6=True),
    )
    harness.remove("empty")
    harness.sync()
    # The first sync's skeleton and its elements (an empty kernel), then the update.
    assert len(recorder.applied) == 3
    fake = FakeNft()
    for tx in recorder.applied:
        fake.apply(tx)
    kernel = harness.nft.read_back()
    model = NftablesBackend(harness.nft.settings, fake).read_back()
    assert kernel is not None and model is not None
    assert meaning(model) == meaning(kernel)


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ("delete element inet t dests { 10.0.0.9 }", "No such file or directory"),
        ("add element inet t dispatch { 10.0.0.1 : drop }", "File exists"),
        ("add element inet t dispatch { 10.0.0.1 : goto target }", None),  # the same again
        ("add element inet t dispatch { 10.0.0.2 : goto nowhere }", "No such file or directory"),
        ("add rule inet t target ip saddr @nothing drop", "No such file or directory"),
        ("add rule inet t target goto nowhere", "No such file or directory"),
        ("delete chain inet t jumper", None),  # its rule goes with it
        ("delete chain inet t target", "Device or resource busy"),  # jumped to
        ("delete set inet t dests", "Device or resource busy"),  # looked up
    ],
)
def test_the_kernel_refuses_what_the_fake_refuses(
    session_testbed: Testbed, command: str, reason: str | None
) -> None:
    setup = Transaction(
        [
            "add table inet t",
            "add chain inet t target",
            "add chain inet t jumper",
            "add set inet t dests { type ipv4_addr; }",
            "add rule inet t jumper ip daddr @dests jump target",
            "add map inet t dispatch { type ipv4_addr : verdict; }",
            "add element inet t dispatch { 10.0.0.1 : goto target }",
        ]
    )
    real, fake = Nft(session_testbed.node.ns.name), FakeNft()
    try:
        for nft in (real, fake):
            nft.apply(setup)
            if reason is None:
                nft.apply(Transaction([command]))
                continue
            with pytest.raises(NftError) as info:
                nft.apply(Transaction([command]))
            assert reason in info.value.stderr, (nft, info.value.stderr)
    finally:
        real.delete_table("inet", "t")
