"""Longest-prefix match flattened into disjoint address ranges, as nftables interval maps
need them (they refuse overlapping elements).

`covered` is the plain membership test both the renderer and `explain` ask.

Every prefix's bounds split the address space into pieces no prefix boundary crosses, so one
lookup per piece answers for all of it; neighbouring pieces with the same answer merge. Used
for the network model's source classification and for the egress SNAT map.
"""

from __future__ import annotations

import ipaddress
import itertools
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def disjoint_ranges(
    family: int, prefixes: Iterable[IPNetwork], answer: Callable[[str], T | None]
) -> list[tuple[str, str, T]]:
    """(first, last, answer) for every piece of `family`'s space that `answer` (asked with the
    piece's first address) answers; pieces answered None are left out."""
    make = ipaddress.IPv4Address if family == 4 else ipaddress.IPv6Address
    bounds: set[int] = set()
    for net in prefixes:
        if net.version == family:
            bounds.update((int(net.network_address), int(net.broadcast_address) + 1))
    pieces: list[list[Any]] = []
    for start, end in itertools.pairwise(sorted(bounds)):
        value = answer(str(make(start)))
        if value is None:
            continue
        if pieces and pieces[-1][2] == value and pieces[-1][1] == start - 1:
            pieces[-1][1] = end - 1
        else:
            pieces.append([start, end - 1, value])
    return [(str(make(a)), str(make(b)), v) for a, b, v in pieces]


def covered(address: str, cidrs: Iterable[str]) -> bool:
    """Whether `address` lies in one of `cidrs` (of its own family)."""
    ip = ipaddress.ip_address(address)
    nets = (ipaddress.ip_network(c, strict=False) for c in cidrs)
    return any(n.version == ip.version and ip in n for n in nets)
