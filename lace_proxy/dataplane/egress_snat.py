"""Pod egress SNAT in nftables: a table of its own, `lace-proxy-egress`.

    set pod-sources-v4    the pod CIDRs (clusterCIDR and the Lace pod networks' prefixes):
                          whose traffic is source-NATed
    set no-snat-v4        destinations left alone: the pod CIDRs and nonMasqueradeCIDRs
    map route-sources-v4  destination range -> the preferred source of its route
    chain postrouting     nat, priority srcnat + 10:
        ct status dnat return                   service traffic: the proxy's to masquerade
        oifname "cali*" return                  detectLocal.interfaceNamePrefix
        oifname { "cni0", "veth1a2b" } return   interfaces routing a pod prefix on-link
        ip saddr @pod-sources-v4 ip daddr != @no-snat-v4 snat ip to ip daddr map @route-sources-v4
        ip saddr @pod-sources-v4 ip daddr != @no-snat-v4 masquerade

(and the same for IPv6). A destination whose route has no source address lacks an element:
the map lookup fails, the `snat` rule does not apply, and `masquerade` lets the kernel pick
the outgoing interface's address (a NAT statement ends the chain, so only misses get there).
Service traffic is not egress: a connection that was DNATed on this node (a pod's to a
ClusterIP, an external or load-balancer IP, a NodePort, which the proxy sent to an endpoint)
is left alone, whatever its endpoint. Whether it is masqueraded is the proxy's decision, as
kube-proxy's nftables mode makes it (lace-proxy's own table, at srcnat: off-cluster sources,
hairpin, masqueradeAll): a pod reaching a ClusterIP whose endpoint lies outside clusterCIDR
(another node's address, a host beyond the uplink) keeps its source there, as under
kube-proxy, while the same pod reaching that address directly is translated here. (IPVS
mode translates in IPVS, which conntrack does not mark as a DNAT: there this table still
translates such a connection.)

Only traffic that leaves the node is translated: a packet whose output interface is a pod
interface goes to a pod of this node (e.g. one with an address outside every pod prefix,
common with IPv6 and second networks, reached by its address), which must see the client pod,
not the node. The destination sets cannot tell (such an address is in none of them); the
output interface can, and matching it in postrouting follows what the kernel routed, policy
rules included. Pod interfaces are those `pod_interface_prefix` names plus those the
controller derives from the routing table, with no configuration and as soon as a new pod's
route is there (`RoutingSnapshot.pod_interfaces`): interfaces with an on-link route inside a
pod prefix (clusterCIDR, the Lace pod networks', the node's podCIDRs). Not any route into one:
other nodes' pods are routed through the uplink or a tunnel, via a gateway; and not an
interface that also has a gateway route, an uplink that pods share on a flat network. With
neither, no interface is a pod's and every pod packet to a destination outside the sets is
translated (service traffic aside), so a local pod outside the pod prefixes sees the node's
address: translating too much keeps egress working, too little would send pod addresses out.
Names reach the rules only if `nft_interface_name` accepts them.

The table is small (one element per route): every change rewrites it whole in one atomic
transaction. Established connections keep the source they were given (conntrack holds it);
new ones take the new route's.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from lace_proxy.dataplane.nft import Nft
from lace_proxy.dataplane.nftables.settings import IFNAME_PREFIX, TABLE_NAME
from lace_proxy.dataplane.nftables.transaction import Transaction

FAMILIES = (4, 6)
Ranges = dict[int, list[tuple[str, str, str]]]  # family -> [(first, last, source)]


@dataclass(frozen=True)
class EgressSettings:
    """lace.egress: whose traffic is source-NATed, and which destinations are left alone;
    `pod_interface_prefix` (detectLocal.interfaceNamePrefix) names pod interfaces."""

    table: str = "lace-proxy-egress"
    pod_cidrs: tuple[str, ...] = ()
    non_masquerade_cidrs: tuple[str, ...] = ()
    pod_interface_prefix: str = ""

    def __post_init__(self) -> None:
        if not TABLE_NAME.match(self.table):
            raise ValueError(f"invalid nftables table name {self.table!r}")
        prefix = self.pod_interface_prefix
        if prefix and not nft_interface_name(prefix):
            raise ValueError(
                f"interface prefix {prefix!r}: only letters, digits, '.', '_' and '-' "
                "(at most 15) can be used in nftables rules"
            )
        for cidr in (*self.pod_cidrs, *self.non_masquerade_cidrs):
            ipaddress.ip_network(cidr, strict=False)


class EgressSnat:
    """Programs the egress table from source ranges; never decides them."""

    def __init__(self, settings: EgressSettings, nft: Nft) -> None:
        self.settings = settings
        self.nft = nft

    def render(
        self,
        ranges: Ranges,
        pod_networks: Sequence[str] = (),
        pod_interfaces: Sequence[str] = (),
    ) -> list[str]:
        """The whole table, for `nft -f`; `pod_networks` are the Lace pod networks' prefixes,
        pods as much as clusterCIDR's; `pod_interfaces` the names of pod interfaces besides
        the prefix's (ValueError if one cannot be written into a rule as it is)."""
        bad = [name for name in pod_interfaces if not nft_interface_name(name)]
        if bad:
            raise ValueError(f"interface names not usable in nftables rules: {bad}")
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
            # Service traffic (DNATed here): masqueraded or not by the proxy's rules, as
            # kube-proxy's; never this table's.
            "    ct status dnat return",
        ]
        # Out by a pod interface: to a pod of this node, which keeps seeing the pod's source.
        if self.settings.pod_interface_prefix:
            lines.append(f'    oifname "{self.settings.pod_interface_prefix}*" return')
        if pod_interfaces:
            names = ", ".join(f'"{name}"' for name in sorted(set(pod_interfaces)))
            lines.append(f"    oifname {{ {names} }} return")
        for fam in FAMILIES:
            v, ip = f"v{fam}", ("ip" if fam == 4 else "ip6")
            match = f"{ip} saddr @pod-sources-{v} {ip} daddr != @no-snat-{v}"
            lines.append(f"    {match} snat {ip} to {ip} daddr map @route-sources-{v}")
            lines.append(f"    {match} masquerade")  # no range: the kernel's own choice
        lines += ["  }", "}"]
        return lines

    def apply(
        self,
        ranges: Ranges,
        pod_networks: Sequence[str] = (),
        pod_interfaces: Sequence[str] = (),
    ) -> None:
        """Replace the table atomically (raises NftError and changes nothing if refused)."""
        t = self.settings.table
        tx = Transaction()
        tx.extend([f"table inet {t} {{ }}", f"delete table inet {t}"])
        tx.extend(self.render(ranges, pod_networks, pod_interfaces))
        self.nft.apply(tx)

    def cleanup(self) -> bool:
        """Delete the table; True if it was there."""
        return self.nft.delete_table("inet", self.settings.table)


def nft_interface_name(name: str) -> bool:
    """Whether `name` can go into an nftables rule as a quoted interface name (or prefix):
    the characters the kernel allows are wider (quotes, `*`, `@`, ...)."""
    return IFNAME_PREFIX.fullmatch(name) is not None


def _cidrs(cidrs: Sequence[str], family: int) -> list[str]:
    nets = (ipaddress.ip_network(c, strict=False) for c in cidrs)
    return [str(n) for n in nets if n.version == family]


def _elements(items: Sequence[str]) -> str:
    return f" elements = {{ {', '.join(items)} }};" if items else ""
