"""Our nftables table as the kernel holds it, read back for a full sync, adoption and the CLI.

The structure (chains, their rules' hash comments, maps and sets) is read in milliseconds
over netlink, dumps of our table's objects without their elements; elements are read over
netlink too (GETSETELEM dumps, parsed by the
codec into the renderer's text), one map or set at a time and only when asked for, since
at 30k services the maps hold about half a million of them. Some elements come back spelled
otherwise than rendered (an interval as a prefix or a range, and from nft's listing, which
the CLI reads for the packet path's own state, a mark in decimal): `canonical` gives an
element's meaning whichever way it is spelled, and each rule carries a hash of the text it
was added with (`rule_hash`), so that a chain's rules are compared without parsing nft's
rendering of them.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from lace_proxy.dataplane.nft import ElementSource, Nft
from lace_proxy.dataplane.nftables.skeleton import FAMILIES

#: Where adopting a previous process's affinity ids reads them.
AFFINITY_IDS = tuple(f"affinity{k}-ids-v{f}" for f in FAMILIES for k in ("", "-nodeport"))


def rule_hash(rule: str) -> str:
    """The comment a rule is added with: a hash of its text as rendered."""
    return "r:" + hashlib.blake2b(rule.encode(), digest_size=6).hexdigest()


def canonical(element: str) -> tuple[tuple[object, ...], ...]:
    """An element's meaning, whichever way nft or the renderer spells it."""
    return tuple(
        tuple(_canonical_token(token) for token in side.split(" . "))
        for side in element.split(" : ", 1)
    )


def _canonical_token(token: str) -> object:
    try:
        return int(token, 0)
    except ValueError:
        pass
    try:
        if "/" in token:
            net = ipaddress.ip_network(token, strict=False)
            return (int(net.network_address), int(net.broadcast_address))
        first, sep, last = token.partition("-")
        if sep:
            return (int(ipaddress.ip_address(first)), int(ipaddress.ip_address(last)))
        address = int(ipaddress.ip_address(token))
        return (address, address)
    except ValueError:
        return token


@dataclass
class KernelState:
    """Our table as the kernel reports it: chains (with rule counts and each rule's hash
    comment), maps and sets with their kind, and their elements in the renderer's text."""

    chains: dict[str, int]
    comments: dict[str, str]
    elements: dict[str, set[str]]
    rules: dict[str, list[str | None]] = field(default_factory=dict)
    containers: dict[str, str] = field(default_factory=dict)  # name -> "map" | "set"
    # Where `elements` are read from, when asked for.
    listing: ElementSource | None = field(default=None, compare=False, repr=False)

    @classmethod
    def read(cls, nft: Nft, family: str, table: str, *, elements: bool) -> KernelState | None:
        """The table as the kernel holds it (None if absent); with `elements`, where its
        maps' and sets' elements are read from (`load`)."""
        raw = nft.table_objects(family, table)
        if raw is None:
            return None
        state = cls.from_json(raw)
        if elements:
            state.listing = nft.table_elements(family, table)
        return state

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> KernelState:
        """The structure from nft's JSON objects; no elements yet."""
        comments: dict[str, str] = {}
        elements: dict[str, set[str]] = {}
        rules: dict[str, list[str | None]] = {}
        containers: dict[str, str] = {}
        for item in raw.get("nftables", []):
            if "chain" in item:
                rules.setdefault(item["chain"]["name"], [])
                if "comment" in item["chain"]:
                    comments[item["chain"]["name"]] = item["chain"]["comment"]
            elif "rule" in item:
                rules.setdefault(item["rule"]["chain"], []).append(item["rule"].get("comment"))
            elif "map" in item or "set" in item:
                kind = "map" if "map" in item else "set"
                obj = item[kind]
                containers[obj["name"]] = kind  # elements: read one by one (read, load)
        chains = {name: len(r) for name, r in rules.items()}
        return cls(chains, comments, elements, rules, containers)

    def load(self, containers: Iterable[str]) -> None:
        """Read these containers' elements (those the kernel has)."""
        for name in containers:
            if name in self.containers and self.listing is not None:
                self.elements[name] = set(self.listing.elements(name))

    def affinity_ids(self) -> dict[str, int]:
        """The affinity ids a previous process programmed, by frontend (clusterIP, external
        and NodePort keys); the maps they are in are loaded."""
        self.load(AFFINITY_IDS)
        out: dict[str, int] = {}
        for container in AFFINITY_IDS:
            for element in self.elements.get(container, ()):
                key, _, value = element.partition(" : ")
                try:
                    out[key] = int(value, 0)
                except ValueError:
                    continue
        return out
