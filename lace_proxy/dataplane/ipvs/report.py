"""`lace-proxy kernel`'s report: what IPVS holds, and how it differs from the table.

It sits beside the IPVS backend because it reads the kernel through the backend
(`IpvsBackend.inspect`) and judges a difference by the backend's own rules (`Wanted`,
`IpvsBackend.owns`): the diff is what the proxy's next full sync would change.
"""

from __future__ import annotations

import errno
import ipaddress
from collections.abc import Sequence
from concurrent.futures import BrokenExecutor
from typing import TYPE_CHECKING, Any

from pyroute2.netlink.exceptions import NetlinkError

from lace_proxy.dataplane.ipvs import (
    IpvsBackend,
    KernelView,
    RealServer,
    Target,
    VirtualServer,
    Wanted,
    addresses_of,
)

if TYPE_CHECKING:
    from lace_proxy.config import ProxyConfig
    from lace_proxy.table import Plan

IPVS_UNAVAILABLE = "IPVS is not available on this kernel (is the ip_vs module loaded?)"


class IpvsUnreadable(Exception):
    """IPVS cannot be read here (no ip_vs, not root, no such namespace); the message says why."""


def _vs_text(vs: VirtualServer) -> str:
    return f"{vs.protocol}  {_host_port(vs.address, vs.port)}"


def _host_port(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _vs_order(vs: VirtualServer) -> tuple[str, int, int, int]:
    ip = ipaddress.ip_address(vs.address)
    return (vs.protocol, ip.version, int(ip), vs.port)


def _ipvs_desired(
    plans: Sequence[Plan], node_addresses: Sequence[str], scheduler: str
) -> tuple[dict[VirtualServer, Target], dict[VirtualServer, list[str]], set[str]]:
    """What a full sync would program (IPVS mode's own `Wanted`, on the node addresses the
    backend read from the kernel), each virtual service's service ports for the SERVICE
    column (the one it serves first), and the service addresses the node would hold."""
    wanted = Wanted(node_addresses, scheduler)
    label: dict[str, str] = {}
    refs: set[str] = set()
    for plan in plans:
        wanted.add(plan)
        label[plan.id] = f"{plan.service}:{plan.port_name}" if plan.port_name else plan.service
        refs |= addresses_of(plan)
    desired = wanted.desired()
    labels = {vs: list(dict.fromkeys(label[p] for p in wanted.plans(vs))) for vs in desired}
    return desired, labels, refs


def read_ipvs(backend: IpvsBackend) -> KernelView:
    """The backend's kernel view; kernel errors become `IpvsUnreadable` with a clear message."""
    try:
        return backend.inspect()
    except (NetlinkError, OSError) as exc:  # pyroute2's (links, addresses), or IPVS's socket
        code = exc.code if isinstance(exc, NetlinkError) else exc.errno
        if code == errno.ENOENT:  # no IPVS generic-netlink family
            raise IpvsUnreadable(IPVS_UNAVAILABLE) from exc
        if code in (errno.EPERM, errno.EACCES):
            raise IpvsUnreadable("reading IPVS needs root (CAP_NET_ADMIN)") from exc
        raise IpvsUnreadable(f"cannot read IPVS: {exc}") from exc
    except BrokenExecutor as exc:  # the kernel thread could not enter the namespace
        raise IpvsUnreadable(f"cannot enter network namespace {backend.netns}") from exc


def _server_doc(address: str, port: int, **more: object) -> dict[str, object]:
    return {"address": address, "port": port, **more}


def _ipvs_report(
    backend: IpvsBackend,
    view: KernelView,
    desired: dict[VirtualServer, Target],
    labels: dict[VirtualServer, list[str]],
    refs: set[str],
) -> dict[str, Any]:
    """What IPVS holds and how it differs from the table, as the JSON document.

    A difference is what the proxy's next full sync would change: a virtual service missing,
    one of ours that is not desired (ours by the backend's rule: on a service address, held
    or desired, or a NodePort on a node address), a different scheduler or persistence, a real
    server missing, serving but not desired, or desired but at weight 0. A real server at
    weight 0 that is not desired is draining, as the proxy leaves it: listed, not a
    difference."""
    local = set(view.service_addresses) | refs
    services = []
    for vs in sorted(view.services, key=_vs_order):
        target = view.services[vs]
        services.append(
            {
                "protocol": vs.protocol,
                "address": vs.address,
                "port": vs.port,
                "scheduler": target.scheduler,
                "persistence": target.persistence,
                "service": ",".join(labels[vs]) if vs in labels else None,
                "ours": backend.owns(vs, local, view.node_addresses),
                "realServers": [
                    _server_doc(
                        r.address,
                        r.port,
                        forward=r.forward,
                        weight=r.weight,
                        activeConns=r.active,
                        inactiveConns=r.inactive,
                    )
                    for r in sorted(view.real_servers[vs], key=_rs_order)
                ],
            }
        )
    missing, unexpected, different, draining = [], [], [], []
    for vs in sorted(set(desired) | set(view.services), key=_vs_order):
        key = {"protocol": vs.protocol, "address": vs.address, "port": vs.port}
        label = ",".join(labels[vs]) if vs in labels else None
        want, have = desired.get(vs), view.services.get(vs)
        if want is None:
            if have is not None and backend.owns(vs, local, view.node_addresses):
                unexpected.append(
                    {
                        **key,
                        "scheduler": have.scheduler,
                        "persistence": have.persistence,
                        "realServers": [
                            _server_doc(r.address, r.port, weight=r.weight)
                            for r in sorted(view.real_servers[vs], key=_rs_order)
                        ],
                    }
                )
            continue
        if have is None:
            missing.append(
                {
                    **key,
                    "service": label,
                    "scheduler": want.scheduler,
                    "persistence": want.persistence,
                    "realServers": [
                        _server_doc(*s) for s in sorted(want.servers, key=_server_order)
                    ],
                }
            )
            continue
        weights = {(r.address, r.port): r for r in view.real_servers[vs]}
        change: dict[str, Any] = {}
        if have.scheduler != want.scheduler:
            change["scheduler"] = {"kernel": have.scheduler, "table": want.scheduler}
        if have.persistence != want.persistence:
            change["persistence"] = {"kernel": have.persistence, "table": want.persistence}
        absent = sorted(
            (s for s in want.servers - have.servers if s not in weights), key=_server_order
        )
        zero = sorted((s for s in want.servers - have.servers if s in weights), key=_server_order)
        extra = sorted(have.servers - want.servers, key=_server_order)
        if absent:
            change["missingRealServers"] = [_server_doc(*s) for s in absent]
        if extra:
            change["unexpectedRealServers"] = [
                _server_doc(*s, weight=weights[s].weight) for s in extra
            ]
        if zero:
            change["zeroWeightRealServers"] = [_server_doc(*s) for s in zero]
        if change:
            different.append({**key, "service": label, **change})
        for s in sorted(set(weights) - have.servers - want.servers, key=_server_order):
            r = weights[s]
            draining.append(
                {
                    **key,
                    "service": label,
                    "realServer": _server_doc(
                        r.address, r.port, activeConns=r.active, inactiveConns=r.inactive
                    ),
                }
            )
    return {
        "nodeAddresses": list(view.node_addresses),
        "services": services,
        "diff": {
            "missing": missing,
            "unexpected": unexpected,
            "different": different,
            "draining": draining,
        },
        "inSync": not (missing or unexpected or different),
    }


def _server_order(server: tuple[str, int]) -> tuple[int, int, int]:
    ip = ipaddress.ip_address(server[0])
    return (ip.version, int(ip), server[1])


def _rs_order(r: RealServer) -> tuple[int, int, int]:
    return _server_order((r.address, r.port))


def ipvs_text(doc: dict[str, Any]) -> str:
    """`ipvsadm -Ln`'s layout with a SERVICE column, then the diff and a verdict line."""

    def vs_of(item: dict[str, Any]) -> str:
        return _vs_text(VirtualServer(item["protocol"], item["address"], item["port"]))

    def flags(item: dict[str, Any]) -> str:
        persistent = f" persistent {item['persistence']}" if item["persistence"] else ""
        return f"{vs_of(item)} {item['scheduler']}{persistent}"

    where = f"network namespace {doc['netns']}" if doc["netns"] else "this host"
    nodes = ", ".join(doc["nodeAddresses"]) or "none"
    header = "Prot LocalAddress:Port Scheduler Flags"
    heads = [flags(s) for s in doc["services"]]
    width = max([len(header), *map(len, heads)]) + 2
    out = [
        f"IP Virtual Server of {where}; node {doc['node']}, NodePorts on {nodes}",
        f"{header.ljust(width)}SERVICE",
        "  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn",
    ]
    for item, head in zip(doc["services"], heads, strict=True):
        name = item["service"] or ("-" if item["ours"] else "(foreign)")
        out.append(f"{head.ljust(width)}{name}")
        for r in item["realServers"]:
            line = (
                f"  -> {_host_port(r['address'], r['port']):<28} {r['forward']:<7} "
                f"{r['weight']:<6} {r['activeConns']:<10} {r['inactiveConns']}"
            )
            out.append(line)
    diff = doc["diff"]
    out.append("")
    out.append("Against the table (what a full sync would change):")
    rows: list[tuple[str, str, str]] = []
    details: list[list[str]] = []
    for item in diff["missing"]:
        rows.append(("missing", flags(item), item["service"] or ""))
        details.append([f"-> {_host_port(s['address'], s['port'])}" for s in item["realServers"]])
    for item in diff["unexpected"]:
        rows.append(("unexpected", flags(item), ""))
        details.append([])
    for item in diff["different"]:
        rows.append(("different", vs_of(item), item["service"] or ""))
        lines = []
        if "scheduler" in item:
            was, want = item["scheduler"]["kernel"], item["scheduler"]["table"]
            lines.append(f"scheduler {was} in the kernel, {want} in the table")
        if "persistence" in item:
            was, want = (
                f"{t} s" if t else "none"
                for t in (item["persistence"]["kernel"], item["persistence"]["table"])
            )
            lines.append(f"persistence {was} in the kernel, {want} in the table")
        for s in item.get("missingRealServers", ()):
            lines.append(f"-> {_host_port(s['address'], s['port'])}  missing")
        for s in item.get("unexpectedRealServers", ()):
            where_rs = _host_port(s["address"], s["port"])
            lines.append(f"-> {where_rs}  unexpected (weight {s['weight']})")
        for s in item.get("zeroWeightRealServers", ()):
            where_rs = _host_port(s["address"], s["port"])
            lines.append(f"-> {where_rs}  at weight 0, but in the table")
        details.append(lines)
    if rows:
        col = max(len(r[1]) for r in rows) + 2
        for (kind, what, name), lines in zip(rows, details, strict=True):
            out.append(f"  {kind:<11} {what.ljust(col)}{name}".rstrip())
            out.extend(f"{'':14}{line}" for line in lines)
    else:
        out.append("  no difference")
    for item in diff["draining"]:
        r = item["realServer"]
        out.append(
            f"  draining    {vs_of(item)} -> {_host_port(r['address'], r['port'])}  "
            f"({r['activeConns']} active, {r['inactiveConns']} inactive; not a difference)"
        )
    count = len(diff["missing"]) + len(diff["unexpected"]) + len(diff["different"])
    if doc["inSync"]:
        ours = sum(1 for s in doc["services"] if s["service"])
        out.append(f"in sync: IPVS holds the table's {ours} virtual service{'s' * (ours != 1)}")
    else:
        out.append(f"not in sync: {count} virtual service{'s differ' if count > 1 else ' differs'}")
    return "\n".join(out)


def kernel_document(
    cfg: ProxyConfig, backend: IpvsBackend, plans: Sequence[Plan], view: KernelView
) -> dict[str, Any]:
    """What `kernel` reports: the kernel's view listed, and its diff against the plans."""
    desired, labels, refs = _ipvs_desired(plans, view.node_addresses, backend.settings.scheduler)
    return {
        "node": cfg.hostname_override,
        "netns": backend.netns,
        **_ipvs_report(backend, view, desired, labels, refs),
    }
