"""UDP conntrack cleanup: flows must follow endpoint changes, as kube-proxy ensures.

A UDP "connection" lives in conntrack until it idles out, and keeps its DNAT decision for
that long: a client that keeps sending would keep reaching a removed endpoint, and one that
was rejected while a service had no endpoints would keep bypassing the new ones. After a
sync, the entries of UDP endpoints that stopped serving (removed, or `serving: false`), and
of UDP services that just got endpoints, are deleted (`conntrack -D`, conntrack-tools; argv
only, addresses already validated); those leaving an endpoint are listed first, so that a
reply still in flight reaches its client (rescue.py). As kube-proxy's reconciler, an
endpoint that is still serving keeps its flows whatever the traffic policies, topology or
terminating state say (a plan's standby backends): a terminating pod keeps a UDP flow, as
it keeps a TCP connection, until it is removed. IPVS mode deletes the listed flows' entries
itself, over netlink (`delete_requests`), around its real servers' deletion (ipvs/backend.py).
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
import struct
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from lace_proxy.dataplane import netlink
from lace_proxy.dataplane.netns import netns_prefix
from lace_proxy.table import Changeset, Plan

log = logging.getLogger(__name__)

Filter = tuple[str, ...]  # conntrack -D arguments after "-p udp"


@dataclass
class StaleFlows:
    """The conntrack deletions a sync calls for: flows translated to an endpoint that stopped
    serving (`moved`: listed first, for rescue.py), and flows to a frontend that has just
    become served which were never translated (`untranslated`: rejected while it had no
    endpoints; their reply tuple is the frontend itself). A flow another proxy translated
    before a switch-over keeps its endpoint, as kube-proxy's reconciler keeps it."""

    moved: list[Filter] = field(default_factory=list)
    untranslated: list[Filter] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.moved or self.untranslated)


@dataclass(frozen=True)
class UdpFlow:
    """A UDP conntrack entry's tuples, as `conntrack -L` prints them (addresses validated)."""

    family: int
    client: str
    client_port: int
    frontend: str
    frontend_port: int
    pod: str
    pod_port: int
    reply_dst: str
    reply_dst_port: int
    #: Seen both ways more than once: a flow that goes on (a stream), not a lone query.
    assured: bool = False


#: A tuple field of `conntrack -L` output, and the order a tuple prints them in.
_FIELD = re.compile(r"\b(src|dst|sport|dport)=(\S+)")
_TUPLE = ("src", "dst", "sport", "dport")
#: The flags of a filter that name the frontend, not the endpoint.
_FRONTEND = ("--orig-dst", "--orig-port-dst")


def parse_flows(text: str) -> list[UdpFlow]:
    """The UDP entries of `conntrack -L -p udp` output: original tuple, then reply tuple."""
    flows = []
    for line in text.splitlines():
        fields = _FIELD.findall(line)
        if not line.startswith("udp") or [k for k, _ in fields[:8]] != [*_TUPLE, *_TUPLE]:
            continue
        v = [value for _, value in fields[:8]]
        for i in (0, 1, 4, 5):
            v[i] = ipaddress.ip_address(v[i]).compressed
        family = 6 if ":" in v[0] else 4
        flows.append(
            UdpFlow(
                family,
                *(v[0], int(v[2]), v[1], int(v[3]), v[4], int(v[6]), v[5], int(v[7])),
                assured="[ASSURED]" in line,
            )
        )
    return flows


def _endpoints(plan: Plan | None) -> set[tuple[str, int]]:
    """The endpoints whose flows a plan keeps: those it uses and those on standby."""
    if plan is None:
        return set()
    backends = (*plan.cluster_backends, *plan.local_backends, *plan.standby_backends)
    return {(b.ip, b.port) for b in backends}


def _served(plan: Plan | None) -> bool:
    return plan is not None and plan.internal_verdict != "reject"


def stale_udp_filters(changes: Changeset) -> StaleFlows:
    """The conntrack deletions a changeset calls for (UDP service ports only)."""
    out = StaleFlows()
    pairs: Iterable[tuple[Plan | None, Plan | None]] = (
        *((old, None) for old in changes.removed),
        *((None, new) for new in changes.added),
        *changes.updated,
    )
    for old, new in pairs:
        plan = old or new
        if plan is None or plan.protocol != "UDP":
            continue
        family = ("-f", "ipv6") if plan.family == 6 else ()
        addresses = _addresses(plan)
        for ip, port in sorted(_endpoints(old) - _endpoints(new)):
            reply = ("--reply-src", ip, "--reply-port-src", str(port))
            for address in addresses:
                out.moved.append(
                    (*family, "--orig-dst", address, "--orig-port-dst", str(plan.port), *reply)
                )
            if plan.node_port:
                out.moved.append((*family, "--orig-port-dst", str(plan.node_port), *reply))
        if new is not None and _served(new) and not _served(old):
            out.untranslated += _untranslated(family, addresses, plan.port, plan.node_port)
    return out


def _untranslated(
    family: Filter, addresses: Iterable[str], port: int | str, node_port: int | str | None
) -> list[Filter]:
    """Flows to these frontends that were never translated: the reply comes from the address
    (or NodePort) the client sent to."""
    out = [
        (*family, "--orig-dst", a, "--orig-port-dst", str(port), "--reply-src", a)
        for a in addresses
    ]
    if node_port:
        out.append((*family, "--orig-port-dst", str(node_port), "--reply-port-src", str(node_port)))
    return out


#: Endpoint maps of the nftables table, by the frontend kind their keys start with.
#: The nftables table's endpoint maps, one per index: MAP-I-vF (nftables/shared.py), -pK a
#: part's (nftables/parts.py).
_ENDPOINT_MAP = re.compile(r"^((?:nodeport-)?(?:local-)?endpoints)-[0-9]+-v([46])(?:-p\d+)?$")
#: Its sets of the frontends with N endpoints: MAP-count-N-vF(-pK).
_COUNT_SET = re.compile(r"^(?:nodeport-)?(?:local-)?endpoints-count-[0-9]+-v([46])(?:-p\d+)?$")


def stale_udp_filters_by_elements(
    diff: Mapping[str, tuple[set[str], set[str]]], plans: Iterable[Plan] = ()
) -> StaleFlows:
    """The conntrack deletions a full sync's element diff calls for, when what was
    programmed before is known from the kernel (after a restart) rather than a changeset:
    UDP flows translated to an endpoint a frontend no longer has (unless the endpoint is on
    standby in `plans`: still serving), and untranslated flows to a frontend that has just
    become served."""
    out = StaleFlows()
    standby = _standby_pairs(plans)
    for fam in (4, 6):
        family = ("-f", "ipv6") if fam == 6 else ()
        # (frontend, endpoint) pairs by map, whatever their index (which shifts as others go).
        gone: dict[str, set[tuple[str, str]]] = {}
        new: dict[str, set[tuple[str, str]]] = {}
        for container, (before, after) in diff.items():
            match = _ENDPOINT_MAP.match(container)
            if match is not None and match[2] == str(fam):
                gone.setdefault(match[1], set()).update(_pairs(before))
                new.setdefault(match[1], set()).update(_pairs(after))
        stale = set().union(*(pairs - new[m] for m, pairs in gone.items())) - standby
        for frontend, endpoint in sorted(stale):
            parts = frontend.split(" . ")
            if "udp" not in parts:
                continue
            ip, _, port = endpoint.partition(" . ")
            reply = ("--reply-src", ip, "--reply-port-src", port)
            if len(parts) == 2:  # a NodePort: protocol . port
                out.moved.append((*family, "--orig-port-dst", parts[1], *reply))
            else:
                out.moved.append(
                    (*family, "--orig-dst", parts[0], "--orig-port-dst", parts[2], *reply)
                )
        before, now = _served_frontends(diff, fam)
        for key in sorted(now - before):
            parts = key.split(" . ")
            if "udp" not in parts:
                continue
            if len(parts) == 2:  # a NodePort: protocol . port
                out.untranslated += _untranslated(family, (), 0, parts[1])
            else:
                out.untranslated += _untranslated(family, (parts[0],), parts[2], None)
    return out


def _served_frontends(
    diff: Mapping[str, tuple[set[str], set[str]]], fam: int
) -> tuple[set[str], set[str]]:
    """The frontends a full sync's diff shows served before (gone) and now (new): in a count
    set (those of several sets only ever move between them), or sent to a per-service chain."""
    before: set[str] = set()
    now: set[str] = set()
    for container, (gone, new) in diff.items():
        match = _COUNT_SET.match(container)
        if match is not None and match[1] == str(fam):
            before |= gone
            now |= new
    for container in (f"service-ips-v{fam}", f"service-nodeports-v{fam}"):
        gone, new = diff.get(container, (set(), set()))
        before |= {e.partition(" : ")[0] for e in gone}
        now |= {e.partition(" : ")[0] for e in new}
    return before, now


def _standby_pairs(plans: Iterable[Plan]) -> set[tuple[str, str]]:
    """(frontend, endpoint) as the endpoint maps spell them, for every UDP plan's standby
    endpoints: `ADDRESS . udp . PORT` (and `udp . NODEPORT`), `IP . PORT`."""
    out: set[tuple[str, str]] = set()
    for plan in plans:
        if plan.protocol != "UDP" or not plan.standby_backends:
            continue
        frontends = [f"{a} . udp . {plan.port}" for a in _addresses(plan)]
        if plan.node_port:
            frontends.append(f"udp . {plan.node_port}")
        for b in plan.standby_backends:
            out.update((frontend, f"{b.ip} . {b.port}") for frontend in frontends)
    return out


def _addresses(plan: Plan) -> tuple[str, ...]:
    return (plan.cluster_ip, *plan.external_ips, *plan.lb_ips)


def _pairs(elements: Iterable[str]) -> set[tuple[str, str]]:
    """(frontend, endpoint) of endpoint-map elements `FRONTEND : IP . PORT`."""
    out = set()
    for element in elements:
        key, _, endpoint = element.partition(" : ")
        out.add((key, endpoint))
    return out


#: ctnetlink: its subsystem, the delete command, and the attributes of an original tuple.
_CT_DELETE = (1 << 8) | 2  # NFNL_SUBSYS_CTNETLINK, IPCTNL_MSG_CT_DELETE
_NLM_F_REQUEST = 1
_CTA_TUPLE_ORIG, _CTA_TUPLE_IP, _CTA_TUPLE_PROTO = 1, 1, 2
_CTA_PROTO_NUM, _CTA_PROTO_SRC_PORT, _CTA_PROTO_DST_PORT = 1, 2, 3


def _attr(kind: int, payload: bytes) -> bytes:
    """A netlink attribute, padded to 4 bytes."""
    size = 4 + len(payload)
    return struct.pack("=HH", size, kind) + payload + bytes(-size % 4)


def delete_request(flow: UdpFlow, sequence: int) -> bytes:
    """The ctnetlink request that deletes a UDP flow's entry by its original tuple; the
    kernel answers only if it fails (ENOENT: already gone)."""
    family = socket.AF_INET6 if flow.family == 6 else socket.AF_INET
    src, dst = (3, 4) if flow.family == 6 else (1, 2)  # CTA_IP_V6_SRC/DST, CTA_IP_V4_SRC/DST
    addresses = _attr(src, ipaddress.ip_address(flow.client).packed) + _attr(
        dst, ipaddress.ip_address(flow.frontend).packed
    )
    proto = (
        _attr(_CTA_PROTO_NUM, bytes([socket.IPPROTO_UDP]))
        + _attr(_CTA_PROTO_SRC_PORT, struct.pack("!H", flow.client_port))
        + _attr(_CTA_PROTO_DST_PORT, struct.pack("!H", flow.frontend_port))
    )
    body = struct.pack("=BBH", family, 0, 0) + _attr(
        _CTA_TUPLE_ORIG, _attr(_CTA_TUPLE_IP, addresses) + _attr(_CTA_TUPLE_PROTO, proto)
    )
    return netlink.header(16 + len(body), _CT_DELETE, _NLM_F_REQUEST, sequence) + body


def delete_requests(flows: Iterable[UdpFlow], first: int) -> list[bytes]:
    """Deletion requests for these flows, numbered from `first`, joined into `send`-sized
    buffers (netlink.send_together)."""
    return netlink.chunks(delete_request(f, first + i) for i, f in enumerate(flows))


class Conntrack:
    """Lists and deletes UDP conntrack entries, in this network namespace or a named one."""

    def __init__(self, netns: str | None = None, binary: str = "conntrack") -> None:
        self._prefix = netns_prefix(netns)
        self._binary = binary

    def list_udp(self, filters: Iterable[Filter]) -> list[UdpFlow]:
        """The entries these filters of moved flows select: one listing per endpoint
        (`--reply-src`), narrowed to the filters' frontends. A failure is logged and lists
        nothing."""
        frontends: dict[Filter, set[tuple[str | None, int]]] = {}
        for args in filters:
            flags = dict(zip(args[::2], args[1::2], strict=True))
            endpoint = tuple(a for k, v in flags.items() if k not in _FRONTEND for a in (k, v))
            address = flags.get("--orig-dst")
            frontend = None if address is None else ipaddress.ip_address(address).compressed
            frontends.setdefault(endpoint, set()).add((frontend, int(flags["--orig-port-dst"])))
        flows: list[UdpFlow] = []
        for endpoint, wanted in frontends.items():
            proc = self._run("-L", endpoint)
            if proc.returncode != 0:
                log.warning("conntrack -L %s failed: %s", " ".join(endpoint), proc.stderr.strip())
                continue
            flows.extend(
                f
                for f in parse_flows(proc.stdout)
                if {(f.frontend, f.frontend_port), (None, f.frontend_port)} & wanted
            )
        return flows

    def delete_udp(self, filters: Iterable[Filter]) -> int:
        """Run each deletion; returns how many ran. Failures are logged, never raised:
        a leftover entry only delays convergence until it idles out."""
        count = 0
        for args in filters:
            proc = self._run("-D", args)
            # Exit 1 with "0 flow entries" means there was nothing to delete.
            if proc.returncode not in (0, 1):
                log.warning("conntrack -D %s failed: %s", " ".join(args), proc.stderr.strip())
            count += 1
        return count

    def _run(self, action: str, args: Filter) -> subprocess.CompletedProcess[str]:
        for value in args[1::2]:  # every flag's value: addresses and ports only
            if not value.isdigit() and value != "ipv6":
                ipaddress.ip_address(value)
        return subprocess.run(
            [*self._prefix, self._binary, action, "-p", "udp", *args],
            capture_output=True,
            text=True,
            check=False,
        )
