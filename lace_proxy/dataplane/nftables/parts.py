"""The table's biggest sets and maps split into parts by the frontend's address, so that none
grows past a size the kernel reads back in linear time.

The kernel dumps a set's elements in parts of at most 32 KiB (~700 elements) and walks the set
from its start for each (nft_rhash_walk skips what it sent before), so reading a set of N
elements back costs N² (one endpoint map: 10k elements 2 ms, 30k 13 ms, 100k 144 ms, 150k
314 ms). Every verified full sync and a restart's adoption read every set back; at 100k
Services a dozen sets of 100-125k elements made the adoption's kernel time grow 47 times for
10 times the Services.

So the containers every ClusterIP frontend is in (`cluster-ips`, `frontends-lb`, and the
`endpoints` count sets and maps that DNAT) are split into P parts, P a power of two chosen
from the number of service ports (`parts_for`): a frontend is in part `address & (P-1)` (the
address's low bits; ClusterIPs are allocated at random, so parts fill evenly). With one part
the names and rules are the unsplit ones. A part's name is the container's with `-pK`
appended; a rule that looks one up is guarded by `ip daddr & P-1 == K` (`guard`), and the
counting chain `lb-vF` dispatches to a chain per part (`lb-vF-pK`) by a verdict map on the
same bits. P is part of the table's skeleton: a change of P rewrites the table in one
transaction (hitless: conntrack keeps established connections' translations).
"""

from __future__ import annotations

from collections.abc import Iterable

#: Service ports a part is made for: the biggest sets hold ~1.25 elements a service port
#: (a ClusterIP's, plus external addresses'), so a part stays near 20k elements, where a dump
#: costs ~0.25 µs an element (10k: 0.2 µs; 100k: 1.4 µs).
PART_SIZE = 16384
#: P never exceeds this (the guard reads one byte of the address).
MAX_PARTS = 256


def parts_for(ports: int, current: int = 1, size: int = PART_SIZE) -> int:
    """The parts for `ports` service ports: doubled while a part would hold more than `size`,
    halved only below a quarter of that (a table near a boundary is not rewritten back and
    forth)."""
    parts = max(1, current)
    while ports > size * parts and parts < MAX_PARTS:
        parts *= 2
    while parts > 1 and ports < size * parts // 4:
        parts //= 2
    return parts


def part_of(address: str, parts: int) -> int:
    """The part of a frontend's address: its low bits, as the guard reads them (the last
    byte; an IPv6 address's last group, or a mapped IPv4 address's last octet)."""
    if parts == 1:
        return 0
    last = address.rpartition(":")[2]
    if "." in last:  # IPv4, or an IPv6 address ending in one
        return int(last.rpartition(".")[2]) & (parts - 1)
    return (int(last, 16) if last else 0) & (parts - 1)


def tag(family: int, part: int | None) -> str:
    """The suffix of a container of the family and part: `vF`, or `vF-pK` (part None: not
    split)."""
    return f"v{family}" if part is None else f"v{family}-p{part}"


def tags(family: int, parts: int) -> list[str]:
    """Every suffix of a split container of the family: one per part."""
    return [tag(family, None if parts == 1 else k) for k in range(parts)]


def _mask(family: int, value: int) -> str:
    """`value` in the address's last byte, as an address."""
    return f"0.0.0.{value}" if family == 4 else f"::{value:x}"


def guard(family: int, part: int, parts: int) -> str:
    """The match that selects the part's destinations (empty with one part)."""
    if parts == 1:
        return ""
    ip = "ip" if family == 4 else "ip6"
    return f"{ip} daddr & {_mask(family, parts - 1)} == {_mask(family, part)} "


def dispatch(family: int, parts: int, chains: Iterable[str]) -> str:
    """A verdict map that goes to the chain of the destination's part (`chains` by part)."""
    ip = "ip" if family == 4 else "ip6"
    targets = ", ".join(f"{_mask(family, k)} : goto {c}" for k, c in enumerate(chains))
    return f"{ip} daddr & {_mask(family, parts - 1)} vmap {{ {targets} }}"


def count(containers: Iterable[str]) -> int:
    """The parts a table read back was made with: those of its IPv4 ClusterIP set."""
    return sum(1 for name in containers if name.startswith("cluster-ips-v4-p")) or 1


def holders(container: str, present: Iterable[str]) -> list[str]:
    """The names `container` (unsplit) goes by among `present`: itself or its parts."""
    prefix = f"{container}-p"
    return [
        name
        for name in present
        if name == container or (name.startswith(prefix) and name[len(prefix) :].isdigit())
    ]
