"""The nftables table's fixed part: what it holds whatever the plans.

Base chains hook into netfilter (filter at priority -110, before conntrack's NAT; nat at
dstnat and srcnat; the UDP reply rescue at raw and srcnat, with its maps: declared here,
filled by lace_proxy.dataplane.rescue, which says how they translate) and jump to helper
chains. Those look frontends up in the maps and sets the plans fill (declared here,
empty): the `frontends-*` and `nodeports-*` sets send a service's frontends to the shared
chains of their kind, which DNAT (shared.py: their rules, and the sets and maps of endpoint
counts, are made as counts are used); `service-ips` and `service-nodeports` send the rare
per-service chains' frontends,
`no-endpoint-*` reject or drop what has no endpoint, `firewall-*` hold
loadBalancerSourceRanges, `controlled-*` and the network model's chains decide access.

The skeleton depends on the settings alone, and under nodePortAddresses "primary" on the
node's own addresses too; the backend marks a table with a hash of it, so that a table made
by another version or configuration is rewritten (NftablesBackend._skeleton).
"""

from __future__ import annotations

import ipaddress

from lace_proxy.dataplane.nftables import parts
from lace_proxy.dataplane.nftables.settings import NftablesSettings

FAMILIES = (4, 6)
#: Entries of the ClientIP affinity maps: (client, service port's id) -> endpoint.
AFFINITY_SIZE = 1 << 20
#: Chains the network model fills (see Renderer.render_networks); empty without it.
ACCESS_CHAINS = ("access", "host-access", "unproxied")
#: The shared chains (shared.py fills them), declared here since the skeleton's rules go to
#: them: lb / npc DNAT to a frontend's (NodePort's) endpoints by their count; ext / np
#: masquerade, then lb / npc; xl / npl are externalTrafficPolicy Local's; alb / aext / anp:
#: the same with ClientIP affinity; arec records affinity (by timeout).
SHARED_KINDS = ("lb", "ext", "npc", "np", "xl", "npl", "alb", "aext", "anp", "arec")
SHARED_CHAINS = tuple(f"{kind}-v{fam}" for fam in FAMILIES for kind in SHARED_KINDS)
#: The kinds a frontend (an address . protocol . port) or a NodePort is sent to: the sets
#: `frontends-KIND-vF` and `nodeports-KIND-vF` hold them, one rule each sends them on. Sets,
#: not a verdict map's elements: the kernel re-validates every chain a jump element leads
#: to when one is added (at 30k frontends, seconds on a 6.1 kernel), a rule's once.
FRONTEND_KINDS = ("lb", "ext", "xl", "alb", "aext")
NODEPORT_KINDS = ("np", "npl", "anp")
#: Where a frontend without (local) endpoints is refused, by verdict: the filter chains
#: reject or drop what these sets hold. Sets, not verdict maps: adding a jump or goto element
#: makes the kernel re-validate the whole table, and these change with endpoints.
VERDICTS = ("reject", "drop")
NO_ENDPOINT_SETS = tuple(
    f"{what}-{verdict}"
    for what in ("no-endpoint", "no-local-endpoint", "no-endpoint-nodeport")
    for verdict in VERDICTS
)
#: What a connection the network model does not allow gets: an ICMP error no other part of
#: the proxy sends (no endpoints is port-unreachable), so it is told apart on the wire.
DENY = "reject with icmpx admin-prohibited"
#: How long a moved UDP flow's old endpoint can still answer (lace_proxy.dataplane.rescue):
#: longer than any reply in flight. Its maps' element timeout.
RESCUE_SECONDS = 5
RESCUE_KINDS = ("daddr", "dport", "sport", "saddr")
RESCUE_CONTAINERS = tuple(f"rescue-{kind}-v{fam}" for fam in FAMILIES for kind in RESCUE_KINDS)


def ip_keyword(family: int) -> str:
    """nft's keyword for the family's header: `ip` or `ip6`."""
    return "ip" if family == 4 else "ip6"


def addr_type(family: int) -> str:
    """nft's type of the family's addresses."""
    return "ipv4_addr" if family == 4 else "ipv6_addr"


def family_cidrs(cidrs: tuple[str, ...], family: int) -> list[str]:
    """The CIDRs of one family, normalised (host bits cleared)."""
    nets = (ipaddress.ip_network(c, strict=False) for c in cidrs)
    return [str(n) for n in nets if n.version == family]


def rescue_maps(family: int) -> list[str]:
    """The UDP reply rescue's four maps of the family (keyed by a rescued reply's tuple)."""
    at = addr_type(family)
    key = f"{at} . inet_service . {at} . inet_service"
    values = {"daddr": at, "dport": "inet_service", "sport": "inet_service", "saddr": at}
    return [
        f"  map rescue-{kind}-v{family} {{ type {key} : {values[kind]};"
        f" flags timeout; timeout {RESCUE_SECONDS}s; }}"
        for kind in RESCUE_KINDS
    ]


def rescue_chains() -> list[str]:
    """The base chains that translate a rescued reply by those maps."""
    pre, post = [], []
    for fam in FAMILIES:
        ip, v = ip_keyword(fam), f"v{fam}"
        key = f"{ip} saddr . udp sport . {ip} daddr . udp dport"
        pre.append(
            f"    {ip} daddr set {key} map @rescue-daddr-{v}"
            f" udp dport set {key} map @rescue-dport-{v} notrack"
        )
        post.append(
            f"    ct state untracked udp sport set {key} map @rescue-sport-{v}"
            f" {ip} saddr set {key} map @rescue-saddr-{v}"
        )
    return [
        "  chain rescue-prerouting {",
        "    type filter hook prerouting priority raw; policy accept;",
        *pre,
        "  }",
        "  chain rescue-postrouting {",
        "    type filter hook postrouting priority srcnat; policy accept;",
        *post,
        "  }",
        "  chain rescue-input {",
        "    type filter hook input priority 100; policy accept;",
        *post,
        "  }",
    ]


class Skeleton:
    """Renders the table's fixed part; `Renderer` adds what plans and the layout make."""

    def __init__(self, settings: NftablesSettings) -> None:
        self.s = settings
        # The node's InternalIPs: its NodePort addresses under node_port_primary, and
        # whether loadBalancerSourceRanges let the node in.
        self.node_addresses: tuple[str, ...] = ()
        # The parts the biggest containers are split into (parts.py; the shared chains' too):
        # the backend sets it before a full sync renders.
        self.parts = 1

    def split(self, family: int) -> list[tuple[str, str]]:
        """(guard, suffix) of each part of the split containers: ("", "vF") unsplit."""
        return [
            (parts.guard(family, k, self.parts), t)
            for k, t in enumerate(parts.tags(family, self.parts))
        ]

    def base(self) -> list[str]:
        """The table's fixed skeleton: base chains, helper chains, maps and sets."""
        t = self.s.table
        mark = 1 << self.s.masquerade_bit
        # A hairpin pair after nftables' own DNAT; under IPVS (whose translation nftables
        # does not see as DNAT) the pair alone, as kube-proxy's IPVS mode does.
        dnatted = "ct status dnat " if self.s.translate else ""
        lines = [f"table inet {t} {{"]
        for fam in FAMILIES:
            v = f"v{fam}"
            ip = ip_keyword(fam)
            at = addr_type(fam)
            lines += [
                f"  set cluster-route-{v} {{ type {at} . inet_proto . inet_service; }}",
                f"  map affinity-ids-{v} {{ type {at} . inet_proto . inet_service : mark; }}",
                f"  map affinity-nodeport-ids-{v} {{ type inet_proto . inet_service : mark; }}",
                f"  map affinity-{v} {{ type {at} . mark : {at} . inet_service;"
                f" flags dynamic,timeout; size {AFFINITY_SIZE}; }}",
                f"  set nodeport-cluster-route-{v} {{ type inet_proto . inet_service; }}",
                *(
                    f"  set frontends-{kind}-{t} {{ type {at} . inet_proto . inet_service; }}"
                    for kind in FRONTEND_KINDS
                    for _, t in (self.split(fam) if kind == "lb" else [("", v)])
                ),
                *(
                    f"  set nodeports-{kind}-{v} {{ type inet_proto . inet_service; }}"
                    for kind in NODEPORT_KINDS
                ),
            ]
            lines += [
                f"  map service-ips-{v} {{ type {at} . inet_proto . inet_service : verdict; }}",
                *(
                    f"  set {name}-{v} {{ type {at} . inet_proto . inet_service; }}"
                    for name in NO_ENDPOINT_SETS[:4]
                ),
                *(
                    f"  set {name}-{v} {{ type inet_proto . inet_service; }}"
                    for name in NO_ENDPOINT_SETS[4:]
                ),
                f"  set firewall-ips-{v} {{ type {at} . inet_proto . inet_service; }}",
                f"  set firewall-allow-{v} {{ typeof {ip} daddr . meta l4proto . th dport"
                f" . {ip} saddr; flags interval; }}",
                f"  map service-nodeports-{v} {{ type inet_proto . inet_service : verdict; }}",
                *(f"  set cluster-ips-{t} {{ type {at}; }}" for _, t in self.split(fam)),
                f"  set hairpin-{v} {{ typeof {ip} saddr . {ip} daddr; }}",
                f"  set cluster-cidrs-{v} {{ type {at}; flags interval; "
                f"{self._elements(fam, self.s.cluster_cidrs)}}}",
                f"  set nodeport-cidrs-{v} {{ type {at}; flags interval; "
                f"{self._elements(fam, self._nodeport_cidrs())}}}",
                # IPVS mode: the frontends on the dummy interface, and its addresses.
                f"  set service-ports-{v} {{ type {at} . inet_proto . inet_service; }}",
                f"  set ipvs-addresses-{v} {{ type {at}; }}",
                f"  set service-cidrs-{v} {{ type {at}; flags interval; "
                f"{self._elements(fam, self.s.service_cidrs)}}}",
                f"  set clusterip-ranges-{v} {{ type {at}; flags interval; }}",
                f"  set controlled-{v} {{ type {at} . inet_proto . inet_service; }}",
                f"  set controlled-nodeports-{v} {{ type inet_proto . inet_service; }}",
                f"  map source-networks-{v} {{ type {at} : verdict; flags interval; }}",
                f"  set host-unpeered-{v} {{ type {at}; flags interval; }}",
                f"  set local-pod-cidrs-{v} {{ type {at}; flags interval; }}",
                *rescue_maps(fam),
            ]
        lines += [
            "  chain mark-for-masquerade {",
            f"    meta mark set meta mark | {mark:#x}",
            "  }",
            "  chain masquerading {",
            f"    {dnatted}ip saddr . ip daddr @hairpin-v4 jump mark-for-masquerade",
            f"    {dnatted}ip6 saddr . ip6 daddr @hairpin-v6 jump mark-for-masquerade",
            f"    meta mark & {mark:#x} == 0 return",
            f"    meta mark set meta mark ^ {mark:#x}",
            "    masquerade fully-random",
            "  }",
            "  chain reject-chain {",
            "    reject",
            "  }",
            "  chain services {",
        ]
        for fam in FAMILIES:
            ip, v = ip_keyword(fam), f"v{fam}"
            to_masquerade = "" if self.s.masquerade_all else f"{ip} saddr != @cluster-cidrs-{v} "
            if self.s.masquerade_all or family_cidrs(self.s.cluster_cidrs, fam):
                lines += [
                    f"    {g}{ip} daddr @cluster-ips-{t} {to_masquerade}jump mark-for-masquerade"
                    for g, t in self.split(fam)
                ]
            lookup = f"{ip} daddr . meta l4proto . th dport"
            lines += [
                f"    {g}{lookup} @frontends-{k}-{t} goto {k}-{v}"
                for k in FRONTEND_KINDS
                for g, t in (self.split(fam) if k == "lb" else [("", v)])
            ]
            lines.append(f"    {lookup} vmap @service-ips-{v}")  # per-service chains (rare)
            np_lookup = f"{self.nodeport_match(fam)} meta l4proto . th dport"
            lines += [f"    {np_lookup} @nodeports-{k}-{v} goto {k}-{v}" for k in NODEPORT_KINDS]
            lines.append(f"    {np_lookup} vmap @service-nodeports-{v}")
        for chain, what in (
            ("service-endpoints-check", "no-endpoint"),
            ("external-endpoints-check", "no-local-endpoint"),
            ("nodeport-endpoints-check", "no-endpoint-nodeport"),
        ):
            lines += ["  }", f"  chain {chain} {{"]
            for fam in FAMILIES:
                match = (
                    f"{self.nodeport_match(fam)} meta l4proto . th dport"
                    if what == "no-endpoint-nodeport"
                    else f"{ip_keyword(fam)} daddr . meta l4proto . th dport"
                )
                lines += [f"    {match} @{what}-{verdict}-v{fam} {verdict}" for verdict in VERDICTS]
        lines += ["  }", "  chain firewall-check {"]
        for fam in FAMILIES:
            ip, v = ip_keyword(fam), f"v{fam}"
            lines.append(
                f"    {ip} daddr . meta l4proto . th dport @firewall-ips-{v}"
                f" {ip} daddr . meta l4proto . th dport . {ip} saddr != @firewall-allow-{v} drop"
            )
        lines += ["  }", "  chain deny {"]
        for fam in FAMILIES:
            ip, v = ip_keyword(fam), f"v{fam}"
            lines.append(f"    {ip} daddr . meta l4proto . th dport @controlled-{v} {DENY}")
            lines.append(
                f"    {self.nodeport_match(fam)} meta l4proto . th dport"
                f" @controlled-nodeports-{v} {DENY}"
            )
        lines += ["  }"]
        for name in (*ACCESS_CHAINS, *SHARED_CHAINS):
            lines += [f"  chain {name} {{", "  }"]
        if not self.s.translate:
            # Under IPVS the service addresses are the node's own: anything but a service
            # port must not reach the node's sockets (as kube-proxy's KUBE-IPVS-FILTER).
            lines += ["  chain ipvs-ports-check {"]
            for fam in FAMILIES:
                ip, v = ip_keyword(fam), f"v{fam}"
                lines.append(
                    f"    {ip} daddr @ipvs-addresses-{v} {ip} daddr . meta l4proto . th dport"
                    f" != @service-ports-{v} goto reject-chain"
                )
            lines += ["  }"]
        lines += ["  chain cluster-ips-check {"]
        for fam in FAMILIES:
            ip, v = ip_keyword(fam), f"v{fam}"
            # A ClusterIP answers only on its service ports: anything else is refused; an
            # address of the service CIDRs that no Service holds is dropped.
            lines += [
                f"    {g}{ip} daddr @cluster-ips-{t} goto reject-chain" for g, t in self.split(fam)
            ]
            lines.append(f"    {ip} daddr @clusterip-ranges-{v} drop")
        lines += [
            "  }",
            "  chain filter-prerouting {",
            "    type filter hook prerouting priority -110; policy accept;",
            "    ct state new jump access",
            "    ct state new jump firewall-check",
            "  }",
            "  chain filter-input {",
            "    type filter hook input priority -110; policy accept;",
            "    ct state new jump nodeport-endpoints-check",
            "    ct state new jump service-endpoints-check",
            "    ct state new jump external-endpoints-check",
            *(() if self.s.translate else ("    ct state new jump ipvs-ports-check",)),
            "  }",
            "  chain filter-forward {",
            "    type filter hook forward priority -110; policy accept;",
            "    ct state new jump service-endpoints-check",
            "    ct state new jump external-endpoints-check",
            "    ct state new jump cluster-ips-check",
            "  }",
            "  chain filter-output {",
            "    type filter hook output priority -110; policy accept;",
            "    ct state new jump unproxied",
            # The node's own connections (IPVS also sends what it forwards through output).
            "    ct state new fib saddr type local jump host-access",
            "    ct state new jump service-endpoints-check",
            "    ct state new jump firewall-check",
            "  }",
            "  chain filter-output-post-dnat {",
            "    type filter hook output priority -90; policy accept;",
            "    ct state new jump unproxied",
            "    ct state new jump cluster-ips-check",
            "  }",
            "  chain nat-prerouting {",
            "    type nat hook prerouting priority dstnat; policy accept;",
            "    jump services",
            "  }",
            "  chain nat-output {",
            "    type nat hook output priority -100; policy accept;",
            "    jump unproxied",
            "    jump services",
            "  }",
            "  chain nat-postrouting {",
            "    type nat hook postrouting priority srcnat; policy accept;",
            # Remember the endpoint of a ClientIP-affinity connection (before masquerade
            # rewrites the client's address).
            "    meta nfproto ipv4 ct status dnat ct mark != 0 jump arec-v4",
            "    meta nfproto ipv6 ct status dnat ct mark != 0 jump arec-v6",
            "    jump masquerading",
            "  }",
            *rescue_chains(),
            "}",
        ]
        return lines

    def base_chains(self) -> set[str]:
        """The chains base() declares."""
        return set(self.base_rule_counts())

    def base_rule_counts(self) -> dict[str, int]:
        """The chains base() declares, with the number of rules in each."""
        counts: dict[str, int] = {}
        chain = None
        for line in self.base():
            if line.startswith("  chain "):
                chain = line.split()[1]
                counts[chain] = 0
            elif line == "  }":
                chain = None
            elif chain is not None and not line.lstrip().startswith("type "):
                counts[chain] += 1
        return counts

    def base_containers(self) -> set[str]:
        """The maps and sets base() declares."""
        return {line.split()[1] for line in self.base() if line.startswith(("  map ", "  set "))}

    def base_elements(self) -> dict[str, set[str]]:
        """The elements base() declares with its sets (the configured CIDRs)."""
        out: dict[str, set[str]] = {}
        for fam in FAMILIES:
            for name, cidrs in (
                ("cluster-cidrs", self.s.cluster_cidrs),
                ("nodeport-cidrs", self._nodeport_cidrs()),
                ("service-cidrs", self.s.service_cidrs),
            ):
                out[f"{name}-v{fam}"] = set(family_cidrs(cidrs, fam))
        return out

    def _nodeport_cidrs(self) -> tuple[str, ...]:
        if self.s.node_port_primary:
            return tuple(f"{a}/{32 if ':' not in a else 128}" for a in self.node_addresses)
        return self.s.node_port_cidrs

    def _elements(self, family: int, cidrs: tuple[str, ...]) -> str:
        mine = family_cidrs(cidrs, family)
        return f"elements = {{ {', '.join(mine)} }}; " if mine else ""

    def nodeport_match(self, family: int) -> str:
        """The match of a packet to a NodePort: a local address, not loopback, and under
        nodePortAddresses one of the NodePort addresses."""
        ip = ip_keyword(family)
        loopback = "127.0.0.0/8" if family == 4 else "::1"
        match = f"meta nfproto ipv{family} fib daddr type local {ip} daddr != {loopback}"
        if self.s.node_port_cidrs or self.s.node_port_primary:
            match += f" {ip} daddr @nodeport-cidrs-v{family}"
        return match
