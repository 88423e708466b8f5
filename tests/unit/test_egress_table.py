"""The egress table as rendered for `nft -f` (loaded into a real kernel and checked on traffic
in tests/netns/test_egress.py): service traffic and pod interfaces come first and only valid
names get in."""

from __future__ import annotations

import pytest

from lace_proxy.dataplane.egress_snat import EgressSettings, EgressSnat
from lace_proxy.dataplane.nft import Nft

RANGES = {4: [("0.0.0.0", "255.255.255.255", "10.250.0.11")]}


def postrouting(snat: EgressSnat, interfaces: tuple[str, ...] = ()) -> list[str]:
    lines = [line.strip() for line in snat.render(RANGES, (), interfaces)]
    return lines[lines.index("chain postrouting {") + 2 : -2]


def test_service_traffic_and_pod_interfaces_return_before_any_translation() -> None:
    """A DNATed connection (a Service's, which the proxy sent to its endpoint) is the proxy's
    to masquerade, as kube-proxy's: the first rule leaves it, whatever interface it takes."""
    snat = EgressSnat(
        EgressSettings(pod_cidrs=("10.251.0.0/16",), pod_interface_prefix="cali"), Nft()
    )
    rules = postrouting(snat, ("veth2", "cni0", "veth2"))
    assert rules[:3] == [
        "ct status dnat return",
        'oifname "cali*" return',
        'oifname { "cni0", "veth2" } return',
    ]
    ends = ["@route-sources-v4", "masquerade", "@route-sources-v6", "masquerade"]
    assert [r.split()[-1] for r in rules[3:]] == ends
    # Neither known: no interface is exempt, every rule but the services' translates.
    bare = postrouting(EgressSnat(EgressSettings(), Nft()))
    assert bare[0] == "ct status dnat return"
    assert all("oifname" not in r and "return" not in r for r in bare[1:])


@pytest.mark.parametrize("name", ['a"b', "v*", "eth0 x", "a;b", "", "x" * 16, "va1\n"])
def test_names_nft_cannot_take_never_reach_a_rule(name: str) -> None:
    with pytest.raises(ValueError, match="not usable in nftables rules"):
        EgressSnat(EgressSettings(), Nft()).render(RANGES, (), (name,))
    with pytest.raises(ValueError, match="interface prefix"):
        EgressSettings(pod_interface_prefix=name or "@")
