"""UDP conntrack cleanup: flows must follow endpoint changes, as kube-proxy ensures.

A UDP "connection" lives in conntrack until it idles out, and keeps its DNAT decision for
that long: a client that keeps sending would keep reaching a removed endpoint, and one that
was rejected while a service had no endpoints would keep bypassing the new ones. After a
sync, the entries of UDP endpoints that stopped serving (removed, or `serving: false`), and
of UDP services that just got endpoints, are deleted (`conntrack -D`, conntrack-tools; argv
only, addresses already validated). As kube-proxy's reconciler, an endpoint that is still
serving keeps its flows whatever the traffic policies, topology or terminating state say
(a plan's standby backends): a terminating pod keeps a UDP flow, as it keeps a TCP
connection, until it is removed.
"""

from __future__ import annotations

import ipaddress
import logging
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from lace_proxy.dataplane.nft import netns_prefix
from lace_proxy.table import Changeset

log = logging.getLogger(__name__)

Filter = tuple[str, ...]  # conntrack -D arguments after "-p udp"


def _endpoints(plan: Any | None) -> set[tuple[str, int]]:
    """The endpoints whose flows a plan keeps: those it uses and those on standby."""
    if plan is None:
        return set()
    backends = (*plan.cluster_backends, *plan.local_backends, *plan.standby_backends)
    return {(b.ip, b.port) for b in backends}


def _served(plan: Any | None) -> bool:
    return plan is not None and plan.internal_verdict != "reject"


def stale_udp_filters(changes: Changeset) -> Iterator[Filter]:
    """The conntrack deletions a changeset calls for (UDP service ports only)."""
    pairs: Iterable[tuple[Any | None, Any | None]] = (
        *((old, None) for old in changes.removed),
        *((None, new) for new in changes.added),
        *changes.updated,
    )
    for old, new in pairs:
        plan = old or new
        if plan.protocol != "UDP":
            continue
        family = ("-f", "ipv6") if plan.family == 6 else ()
        addresses = _addresses(plan)
        for ip, port in sorted(_endpoints(old) - _endpoints(new)):
            for address in addresses:
                yield (
                    *family,
                    "--orig-dst",
                    address,
                    "--orig-port-dst",
                    str(plan.port),
                    "--reply-src",
                    ip,
                    "--reply-port-src",
                    str(port),
                )
            if plan.node_port:
                yield (
                    *family,
                    "--orig-port-dst",
                    str(plan.node_port),
                    "--reply-src",
                    ip,
                    "--reply-port-src",
                    str(port),
                )
        if new is not None and _served(new) and not _served(old):
            # Flows rejected while there were no endpoints would never be translated.
            for address in addresses:
                yield (*family, "--orig-dst", address, "--orig-port-dst", str(plan.port))
            if plan.node_port:
                yield (*family, "--orig-port-dst", str(plan.node_port))


#: Endpoint maps of the nftables table, by the frontend kind their keys start with.
_ENDPOINT_MAPS = {
    "endpoints": "address",
    "local-endpoints": "address",
    "nodeport-endpoints": "nodeport",
    "nodeport-local-endpoints": "nodeport",
}


def stale_udp_filters_by_elements(
    diff: Mapping[str, tuple[set[str], set[str]]], plans: Iterable[Any] = ()
) -> Iterator[Filter]:
    """The conntrack deletions a full sync's element diff calls for, when what was
    programmed before is known from the kernel (after a restart) rather than a changeset:
    UDP flows translated to an endpoint a frontend no longer has (unless the endpoint is on
    standby in `plans`: still serving), and flows to a frontend that has just become served
    (they were left untranslated)."""
    standby = _standby_pairs(plans)
    for fam in (4, 6):
        family = ("-f", "ipv6") if fam == 6 else ()
        for prefix, kind in _ENDPOINT_MAPS.items():
            gone, new = diff.get(f"{prefix}-v{fam}", (set(), set()))
            for frontend, endpoint in sorted(_pairs(gone) - _pairs(new) - standby):
                parts = frontend.split(" . ")
                if "udp" not in parts:
                    continue
                ip, _, port = endpoint.partition(" . ")
                reply = ("--reply-src", ip, "--reply-port-src", port)
                if kind == "nodeport":
                    yield (*family, "--orig-port-dst", parts[1], *reply)
                else:
                    yield (*family, "--orig-dst", parts[0], "--orig-port-dst", parts[2], *reply)
        for container, kind in (("service-ips", "address"), ("service-nodeports", "nodeport")):
            gone, new = diff.get(f"{container}-v{fam}", (set(), set()))
            before = {e.partition(" : ")[0] for e in gone}
            for key in sorted({e.partition(" : ")[0] for e in new} - before):
                parts = key.split(" . ")
                if "udp" not in parts:
                    continue
                if kind == "nodeport":
                    yield (*family, "--orig-port-dst", parts[1])
                else:
                    yield (*family, "--orig-dst", parts[0], "--orig-port-dst", parts[2])


def _standby_pairs(plans: Iterable[Any]) -> set[tuple[str, str]]:
    """(frontend, endpoint) as the endpoint maps spell them, for every UDP plan's standby
    endpoints: `ADDRESS . udp . PORT` (and `udp . NODEPORT`), `IP . PORT`."""
    out = set()
    for plan in plans:
        if plan.protocol != "UDP" or not plan.standby_backends:
            continue
        frontends = [f"{a} . udp . {plan.port}" for a in _addresses(plan)]
        if plan.node_port:
            frontends.append(f"udp . {plan.node_port}")
        for b in plan.standby_backends:
            out.update((frontend, f"{b.ip} . {b.port}") for frontend in frontends)
    return out


def _addresses(plan: Any) -> tuple[str, ...]:
    return (plan.cluster_ip, *plan.external_ips, *plan.lb_ips)


def _pairs(elements: Iterable[str]) -> set[tuple[str, str]]:
    """(frontend, endpoint) of endpoint-map elements `FRONTEND . INDEX : IP . PORT`."""
    out = set()
    for element in elements:
        key, _, endpoint = element.partition(" : ")
        out.add((key.rpartition(" . ")[0], endpoint))
    return out


class Conntrack:
    """Deletes conntrack entries, in this network namespace or a named one."""

    def __init__(self, netns: str | None = None, binary: str = "conntrack") -> None:
        self._prefix = netns_prefix(netns)
        self._binary = binary

    def delete_udp(self, filters: Iterable[Filter]) -> int:
        """Run each deletion; returns how many ran. Failures are logged, never raised:
        a leftover entry only delays convergence until it idles out."""
        count = 0
        for args in filters:
            for value in args[1::2]:  # every flag's value: addresses and ports only
                if not value.isdigit() and value != "ipv6":
                    ipaddress.ip_address(value)
            proc = subprocess.run(
                [*self._prefix, self._binary, "-D", "-p", "udp", *args],
                capture_output=True,
                text=True,
                check=False,
            )
            # Exit 1 with "0 flow entries" means there was nothing to delete.
            if proc.returncode not in (0, 1):
                log.warning("conntrack -D %s failed: %s", " ".join(args), proc.stderr.strip())
            count += 1
        return count
