"""The question `explain` answers: one new connection (`Query`, from the command line's
SRC and DST), and the state it is answered from (`State`, `NodeFacts`)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lace_proxy.dataplane.nftables.settings import NftablesSettings

if TYPE_CHECKING:
    from lace_proxy.proxier import Proxier

NODE = "node"
PROTOCOLS = ("TCP", "UDP", "SCTP")


class QueryError(ValueError):
    """Unusable SRC or DST on the command line (exit code 2)."""


@dataclass(frozen=True)
class Query:
    """One new connection: SRC (an address, or NODE for the node's own traffic) to DST."""

    source: str
    destination: str
    port: int
    protocol: str = "TCP"

    @property
    def from_node(self) -> bool:
        return self.source == NODE

    @property
    def family(self) -> int:
        return ipaddress.ip_address(self.destination).version

    def __str__(self) -> str:
        dst = f"[{self.destination}]" if self.family == 6 else self.destination
        return f"{self.source} -> {dst}:{self.port}/{self.protocol}"


def _address(text: str, what: str) -> str:
    """A canonical IP address (brackets allowed around IPv6), else QueryError."""
    raw = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        return str(ipaddress.ip_address(raw))
    except ValueError:
        raise QueryError(f"{what} {text!r} is not an IP address") from None


def parse_query(source: str, destination: str) -> Query:
    """SRC (an IP or `node`) and DST (`IP:PORT[/PROTO]`, IPv6 as `[IP]:PORT`), validated."""
    src = NODE if source.lower() == NODE else _address(source, "SRC")
    rest, slash, proto = destination.partition("/")
    protocol = proto.upper() if slash else "TCP"
    if protocol not in PROTOCOLS:
        raise QueryError(f"DST {destination!r}: protocol {proto!r} is not TCP, UDP or SCTP")
    if rest.startswith("["):
        host, sep, port_text = rest[1:].partition("]:")
        if not sep:
            raise QueryError(f"DST {destination!r}: write an IPv6 destination as [IP]:PORT")
    else:
        host, sep, port_text = rest.rpartition(":")
        if not sep:
            raise QueryError(f"DST {destination!r} has no port: write IP:PORT[/PROTO]")
        if ":" in host:
            raise QueryError(f"DST {destination!r}: write an IPv6 destination as [IP]:PORT")
    dst = _address(host, "DST address")
    if not (port_text.isascii() and port_text.isdigit()) or not 1 <= int(port_text) <= 65535:
        raise QueryError(f"DST {destination!r}: port {port_text!r} is not in 1-65535")
    if src != NODE and ipaddress.ip_address(src).version != ipaddress.ip_address(dst).version:
        raise QueryError(f"SRC {source} and DST {dst} are of different IP families")
    return Query(src, dst, int(port_text), protocol)


@dataclass(frozen=True)
class NodeFacts:
    """What explain needs to know of a node: where its NodePorts answer.

    Its podCIDRs reach explain through the proxier (they are part of the kernel's layout).
    """

    name: str
    addresses: tuple[str, ...] = ()  # every address of the node (NodePorts answer there)
    internal_ips: tuple[str, ...] = ()  # InternalIPs: nodePortAddresses "primary", routes


@dataclass(frozen=True)
class State:
    """Everything `explain` reads: the proxier's computed state and what the kernel is given.

    `proxier` is a Proxier whose table has been built and committed (`plans()` are what the
    dataplane would program). `rejections` are the objects validation refused while loading.
    """

    proxier: Proxier
    settings: NftablesSettings
    node: NodeFacts
    other_nodes: tuple[NodeFacts, ...] = ()
    rejections: tuple[str, ...] = ()
