"""The shared chains every service port of a kind goes through, and the counts they
dispatch on.

A frontend is sent to a shared chain by the set of its service's kind (`frontends-lb-v4`,
...: skeleton.py), never by a verdict element: adding a goto or jump element makes the
kernel re-validate every chain it leads to (milliseconds at 30k services on 6.18, seconds on
6.1, which does not remember a chain it validated). What changes with endpoints is data:

- a counting chain (`lb`, `xl`, `npc`, `npl`) holds one rule per endpoint count N, which
  matches the frontends in the set `MAP-count-N-vF` and picks `numgen random mod N`;
- the pick chain `KIND-pick-I-vF` DNATs by the frontend in the map `MAP-I-vF`, which holds
  the I-th endpoint of every frontend with more than I (MAP: `endpoints`, `local-endpoints`,
  `nodeport-endpoints`, `nodeport-local-endpoints`).

An endpoint map per index keeps each map a fraction of the endpoints (the kernel dumps a
set in parts of ~700 elements, walking it from its start for each: reading one map of N
elements back costs N²), and its rules need no `typeof` declaration, which nft (1.0.6)
cannot add a rule for once read back from the kernel. ClientIP affinity records a
connection's endpoint in `arec-vF`, one rule per timeout, matching the affinity ids in
`affinity-timeout-T-vF`. A count or timeout in use is a "need" (KIND-vF-N); its rules, sets
and maps exist once made.

`lb`'s sets and maps hold every ClusterIP frontend: with the table split into parts
(parts.py) they are made per part (`endpoints-count-N-vF-pK`, `endpoints-I-vF-pK`), `lb-vF`
goes to the part's counting chain `lb-vF-pK`, and a pick chain DNATs by the map of the
destination's part.
"""

from __future__ import annotations

import re

from lace_proxy.dataplane.nftables import parts
from lace_proxy.dataplane.nftables.settings import NftablesSettings
from lace_proxy.dataplane.nftables.skeleton import (
    FAMILIES,
    Skeleton,
    addr_type,
    family_cidrs,
    ip_keyword,
)

#: The endpoint maps each counting chain DNATs from.
COUNTED = {
    "lb": "endpoints",
    "xl": "local-endpoints",
    "npc": "nodeport-endpoints",
    "npl": "nodeport-local-endpoints",
}
#: Counts 1..this have their rules, sets and maps in every full sync, so that an endpoint
#: change rarely needs a new one (a new one is made by the change, with nft).
PRECREATED_COUNTS = 16
#: What a plan needs besides its elements: KIND-vF-N, a count N of a counting chain (its rule,
#: the set of frontends with N endpoints, the endpoint maps 0..N-1), or arec-vF-T, affinity
#: of T seconds (its rule and the set of the affinity ids with that timeout).
NEED = re.compile(r"^(lb|xl|npc|npl|arec)-v([46])-([0-9]+)$")
_MAPS = "|".join(COUNTED.values())
#: The sets that stand for a need: MAP-count-N-vF (-pK: a part's), affinity-timeout-T-vF.
NEED_SET = re.compile(rf"^(?:({_MAPS})-count|affinity-timeout)-([0-9]+)-v([46])(?:-p[0-9]+)?$")
#: The endpoint maps by index: MAP-I-vF, and MAP-I-vF-pK a part's.
ENDPOINT_MAP = re.compile(rf"^({_MAPS})-([0-9]+)-v([46])(?:-p([0-9]+))?$")


class SharedChains:
    """Renders the shared chains and the sets and maps of their counts, for the needs in
    use."""

    def __init__(self, settings: NftablesSettings, skeleton: Skeleton) -> None:
        self.s = settings
        self.skeleton = skeleton  # whose `parts` lb's sets and maps are split into
        # Per family: whether lace.clusterCIDRs has any (the renderer asks too).
        self.has_cluster_cidrs = {
            f: bool(family_cidrs(settings.cluster_cidrs, f)) for f in FAMILIES
        }

    def chains(self, needs: set[str]) -> dict[str, tuple[str, ...]]:
        """The shared chains' rules (skeleton.SHARED_KINDS), with a rule for each count and
        affinity timeout in `needs`, and the pick chains of the counts."""
        counts = _counts(needs)
        out: dict[str, tuple[str, ...]] = {}
        for fam in FAMILIES:
            out.update(self._chains(fam, counts))
        return out

    def _chains(
        self, fam: int, counts: dict[tuple[str, int], list[int]]
    ) -> dict[str, tuple[str, ...]]:
        """One family's shared chains (see chains and skeleton.SHARED_KINDS)."""
        ip, v = ip_keyword(fam), f"v{fam}"
        lookup = f"{ip} daddr . meta l4proto . th dport"
        np_lookup = "meta l4proto . th dport"
        guard = f"meta nfproto ipv{fam} "
        keys = {"lb": (lookup, ""), "xl": (lookup, guard), "npc": (np_lookup, guard)}
        keys["npl"] = (np_lookup, guard)
        out: dict[str, tuple[str, ...]] = {}
        # A counting chain's rules, by its name: KIND-vF, and lb-vF-pK of each part.
        dispatch: dict[str, tuple[str, ...]] = {}
        count = self.skeleton.parts
        tags = parts.tags(fam, count)
        for kind, m in COUNTED.items():
            key, prefix = keys[kind]
            numbers = counts.get((kind, fam), []) if self.s.translate else []
            suffixes = tags if kind == "lb" else [v]
            for t in suffixes:
                dispatch[f"{kind}-{t}"] = tuple(
                    f"{prefix}{key} @{m}-count-{n}-{t} {_pick(kind, n, v)}" for n in numbers
                )
            for i in range(max(numbers, default=0)):
                out[f"{kind}-pick-{i}-{v}"] = tuple(
                    f"{prefix}{parts.guard(fam, k, len(suffixes))}dnat {ip} to {key}"
                    f" map @{m}-{i}-{t}"
                    for k, t in enumerate(suffixes)
                )
        if count == 1:
            out[f"lb-{v}"] = dispatch[f"lb-{v}"]
        else:  # to the counting chain of the destination's part
            out[f"lb-{v}"] = (parts.dispatch(fam, count, (f"lb-{t}" for t in tags)),)
            out.update((f"lb-{t}", dispatch[f"lb-{t}"]) for t in tags)

        def affinity(kind: str) -> tuple[str, ...]:
            ids = (
                f"{lookup} map @affinity-ids-{v}"
                if kind == "alb"
                else f"{np_lookup} map @affinity-nodeport-ids-{v}"
            )
            remembered = f"{ip} saddr . ct mark map @affinity-{v}"
            rules = ["jump mark-for-masquerade"] if kind == "anp" else []
            rules.append(f"ct mark set {ids}")
            rules += [f"meta l4proto {p} dnat {ip} to {remembered}" for p in ("tcp", "udp", "sctp")]
            rules.append(f"goto {'lb' if kind == 'alb' else 'npc'}-{v}")
            return tuple(rules)

        def local_policy(kind: str) -> tuple[str, ...]:
            """externalTrafficPolicy Local: pods and the node itself are routed to every
            endpoint (the *cluster-route maps), other sources to the local ones."""
            route = (
                f"{lookup} @cluster-route-{v} goto lb-{v}"
                if kind == "xl"
                else f"{np_lookup} @nodeport-cluster-route-{v} goto npc-{v}"
            )
            rules = []
            if self.has_cluster_cidrs[fam]:
                rules.append(f"{ip} saddr @cluster-cidrs-{v} {route}")
            rules.append("fib saddr type local jump mark-for-masquerade")
            rules.append(f"fib saddr type local {route}")
            return (*rules, *dispatch[f"{kind}-{v}"])

        out[f"npc-{v}"] = dispatch[f"npc-{v}"]
        out[f"ext-{v}"] = ("jump mark-for-masquerade", f"goto lb-{v}")
        out[f"np-{v}"] = ("jump mark-for-masquerade", f"goto npc-{v}")
        out[f"xl-{v}"] = local_policy("xl")
        out[f"npl-{v}"] = local_policy("npl")
        out[f"alb-{v}"] = affinity("alb")
        out[f"anp-{v}"] = affinity("anp")
        out[f"aext-{v}"] = ("jump mark-for-masquerade", f"goto alb-{v}")
        record = f"{ip} saddr . ct mark timeout {{t}}s : {ip} daddr . th dport"
        out[f"arec-{v}"] = tuple(
            f"ct mark @affinity-timeout-{t}-{v} update @affinity-{v} {{ {record.format(t=t)} }}"
            for t in sorted(counts.get(("arec", fam), ()))
        )
        return out

    def sets(self, needs: set[str]) -> dict[str, str]:
        """The sets and maps of the counts and affinity timeouts in `needs` (see NEED), per
        part for `lb`: a spec with a ` : ` is a map's."""
        out: dict[str, str] = {}
        for (kind, fam), numbers in _counts(needs).items():
            v = f"v{fam}"
            if kind == "arec":
                out.update((f"affinity-timeout-{t}-{v}", "type mark;") for t in numbers)
                continue
            m = COUNTED[kind]
            key = (
                "inet_proto . inet_service"
                if kind in ("npc", "npl")
                else f"{addr_type(fam)} . inet_proto . inet_service"
            )
            target = f"{addr_type(fam)} . inet_service"
            for t in parts.tags(fam, self.skeleton.parts) if kind == "lb" else [v]:
                out.update((f"{m}-count-{n}-{t}", f"type {key};") for n in numbers)
                out.update((f"{m}-{i}-{t}", f"type {key} : {target};") for i in range(max(numbers)))
        return out

    @staticmethod
    def precreated() -> set[str]:
        """The counts every full sync makes, so that changes rarely need a new one."""
        return {
            f"{kind}-v{fam}-{n}"
            for fam in FAMILIES
            for kind in COUNTED
            for n in range(1, PRECREATED_COUNTS + 1)
        }


def _counts(needs: set[str]) -> dict[tuple[str, int], list[int]]:
    """The needs by (kind, family): their counts (or timeouts), in order."""
    out: dict[tuple[str, int], list[int]] = {}
    for need in needs:
        match = NEED.match(need)
        if match is not None:
            out.setdefault((match[1], int(match[2])), []).append(int(match[3]))
    for numbers in out.values():
        numbers.sort()
    return out


def _pick(kind: str, count: int, v: str) -> str:
    """A counting rule's choice among `count` endpoints: uniformly at random, by index."""
    if count == 1:
        return f"goto {kind}-pick-0-{v}"
    targets = ", ".join(f"{i} : goto {kind}-pick-{i}-{v}" for i in range(count))
    return f"numgen random mod {count} vmap {{ {targets} }}"


def need_of(container: str) -> str | None:
    """The need (see NEED) a set of ours stands for, if it is such a set: a full sync keeps the
    counts and timeouts the kernel has rules for, as `apply` keeps those it made."""
    match = NEED_SET.match(container)
    if match is None:
        return None
    kind = next((k for k, m in COUNTED.items() if m == match[1]), "arec")
    return f"{kind}-v{match[3]}-{match[2]}"
