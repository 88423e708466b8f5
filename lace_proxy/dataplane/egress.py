"""Pod egress SNAT in nftables: a table of its own, `lace-proxy-egress`.

    set pod-sources-v4    the pod CIDRs (clusterCIDR and the Lace pod networks' prefixes):
                          whose traffic is source-NATed
    set no-snat-v4        destinations left alone: the pod CIDRs and nonMasqueradeCIDRs
    map route-sources-v4  destination range -> the preferred source of its route
    chain postrouting     nat, priority srcnat + 10:
        ip saddr @pod-sources-v4 ip daddr != @no-snat-v4 snat ip to ip daddr map @route-sources-v4
        ip saddr @pod-sources-v4 ip daddr != @no-snat-v4 masquerade

(and the same for IPv6). A destination whose route has no source address lacks an element:
the map lookup fails, the `snat` rule does not apply, and `masquerade` lets the kernel pick
the outgoing interface's address (a NAT statement ends the chain, so only misses get there).
Service traffic that lace-proxy's own table masquerades (srcnat) is translated there first;
a connection is translated once, so this table only sees the rest.

The table is small (one element per route): every change rewrites it whole in one atomic
transaction. Established connections keep the source they were given (conntrack holds it);
new ones take the new route's.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from lace_proxy.dataplane.nft import Nft, Transaction
from lace_proxy.dataplane.nftables import TABLE_NAME

FAMILIES = (4, 6)
Ranges = dict[int, list[tuple[str, str, str]]]  # family -> [(first, last, source)]


@dataclass(frozen=True)
class EgressSettings:
    """lace.egress: whose traffic is source-NATed, and which destinations are left alone."""

    table: str = "lace-proxy-egress"
    pod_cidrs: tuple[str, ...] = ()
    non_masquerade_cidrs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not TABLE_NAME.match(self.table):
            raise ValueError(f"invalid nftables table name {self.table!r}")
        for cidr in (*self.pod_cidrs, *self.non_masquerade_cidrs):
            ipaddress.ip_network(cidr, strict=False)


class EgressSnat:
    """Programs the egress table from source ranges; never decides them."""

    def __init__(self, settings: EgressSettings, nft: Nft) -> None:
        self.settings = settings
        self.nft = nft

    def render(self, ranges: Ranges, pod_networks: Sequence[str] = ()) -> list[str]:
        """The whole table, for `nft -f`; `pod_networks` are the Lace pod networks' prefixes,
        pods as much as clusterCIDR's."""
        t = self.settings.table
        lines = [f"table inet {t} {{"]
        for fam in FAMILIES:
            v, at = f"v{fam}", f"ipv{fam}_addr"
            pods = _cidrs((*self.settings.pod_cidrs, *pod_networks), fam)
            keep = _cidrs((*pods, *self.settings.non_masquerade_cidrs), fam)
            spans = [
                f"{a}-{b} : {s}" if a != b else f"{a} : {s}" for a, b, s in ranges.get(fam, [])
            ]
            interval = f"type {at}; flags interval;"
            lines += [
                f"  set pod-sources-{v} {{ {interval} auto-merge;{_elements(pods)} }}",
                f"  set no-snat-{v} {{ {interval} auto-merge;{_elements(keep)} }}",
                f"  map route-sources-{v} {{ type {at} : {at}; flags interval;"
                f"{_elements(spans)} }}",
            ]
        lines += [
            "  chain postrouting {",
            "    type nat hook postrouting priority srcnat + 10; policy accept;",
        ]
        for fam in FAMILIES:
            v, ip = f"v{fam}", ("ip" if fam == 4 else "ip6")
            match = f"{ip} saddr @pod-sources-{v} {ip} daddr != @no-snat-{v}"
            lines.append(f"    {match} snat {ip} to {ip} daddr map @route-sources-{v}")
            lines.append(f"    {match} masquerade")  # no range: the kernel's own choice
        lines += ["  }", "}"]
        return lines

    def apply(self, ranges: Ranges, pod_networks: Sequence[str] = ()) -> None:
        """Replace the table atomically (raises NftError and changes nothing if refused)."""
        t = self.settings.table
        tx = Transaction()
        tx.extend([f"table inet {t} {{ }}", f"delete table inet {t}"])
        tx.extend(self.render(ranges, pod_networks))
        self.nft.apply(tx)

    def cleanup(self) -> bool:
        """Delete the table; True if it was there."""
        return self.nft.delete_table("inet", self.settings.table)


def _cidrs(cidrs: Sequence[str], family: int) -> list[str]:
    nets = (ipaddress.ip_network(c, strict=False) for c in cidrs)
    return [str(n) for n in nets if n.version == family]


def _elements(items: Sequence[str]) -> str:
    return f" elements = {{ {', '.join(items)} }};" if items else ""
