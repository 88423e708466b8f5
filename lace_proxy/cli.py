"""The `lace-proxy` command: run the proxy, inspect its table and kernel state, clean up."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import errno
import ipaddress
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from concurrent.futures import BrokenExecutor
from pathlib import Path
from typing import Any

import yaml
from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netns import NETNS_RUN_DIR

from lace_proxy import __version__, implementation, inventory, state_socket
from lace_proxy.config import ConfigError, ProxyConfig, add_config_flags, config_from_args
from lace_proxy.dataplane.conntrack import Conntrack
from lace_proxy.dataplane.egress import EgressSettings, EgressSnat
from lace_proxy.dataplane.ipvs import (
    IpvsBackend,
    IpvsSettings,
    KernelView,
    RealServer,
    Target,
    VirtualServer,
    Wanted,
    addresses_of,
)
from lace_proxy.dataplane.nft import Nft, NftError, netns_prefix
from lace_proxy.dataplane.nftables import NftablesBackend, NftablesSettings
from lace_proxy.dataplane.routes import PolicyRoutes, RoutingSettings
from lace_proxy.doctor import (
    EgressReport,
    EgressSettingsView,
    NodeReport,
    NodeSettingsView,
    diagnose_egress,
    diagnose_node,
    read_node_facts,
)
from lace_proxy.egress.controller import EgressController
from lace_proxy.egress.routing import read_snapshot
from lace_proxy.explain import (
    Explanation,
    KernelCheck,
    NodeFacts,
    QueryError,
    State,
    check_kernel,
    explain,
    parse_query,
)
from lace_proxy.health import ProxierHealth, ProxyServers, ServiceHealthServers
from lace_proxy.metrics import ProxyMetrics
from lace_proxy.migration import remove_kube_proxy
from lace_proxy.model import EndpointSlice, LaceObject, Node, Rejections, Service, ServiceCIDR
from lace_proxy.model.load import LoadResult, load_manifests
from lace_proxy.networks import NetworkView
from lace_proxy.networks.graph import NetworkGraph
from lace_proxy.proxier import Proxier
from lace_proxy.sources.files import SOURCE_NAME as FILES
from lace_proxy.sources.files import ManifestSource
from lace_proxy.sources.kube import SOURCE_NAME as KUBE
from lace_proxy.sources.kube import ApiConfigError, ApiConnection, KubeSource
from lace_proxy.state_socket import StateServer
from lace_proxy.table import ServiceTable
from lace_proxy.table.changeset import backend_state

log = logging.getLogger("lace_proxy")


def nftables_settings(cfg: ProxyConfig) -> NftablesSettings:
    """The nftables backend's view of the configuration."""
    primary = cfg.node_port_addresses == "primary"
    node_ports = () if primary else tuple(str(n) for n in cfg.node_port_addresses)
    cluster = (
        tuple(str(n) for n in cfg.cluster_cidr) if cfg.detect_local_mode == "ClusterCIDR" else ()
    )
    return NftablesSettings(
        table=cfg.lace.nftables.table,
        masquerade_all=cfg.masquerade_all,
        masquerade_bit=cfg.masquerade_bit,
        cluster_cidrs=cluster,
        node_port_cidrs=node_ports,
        node_port_primary=primary,
        service_cidrs=tuple(str(n) for n in cfg.lace.service_cidrs),
        pod_interface_prefix=cfg.detect_local.interface_name_prefix,
        translate=cfg.mode != "ipvs",  # IPVS translates in IPVS mode
    )


def dataplane(
    cfg: ProxyConfig, metrics: ProxyMetrics | None = None
) -> NftablesBackend | IpvsBackend:
    """The backend for the configured mode (IPVS mode keeps nftables, without translation)."""
    moved = None if metrics is None else metrics.record_udp_flows_moved
    nft = NftablesBackend(nftables_settings(cfg), Nft(), Conntrack(), udp_flows_moved=moved)
    return nft if cfg.mode != "ipvs" else IpvsBackend(ipvs_settings(cfg), nft)


def ipvs_settings(cfg: ProxyConfig) -> IpvsSettings:
    """The IPVS backend's view of the configuration (ipvs.*)."""
    c = cfg.ipvs
    return IpvsSettings(
        scheduler=c.scheduler,
        strict_arp=c.strict_arp,
        exclude_cidrs=tuple(str(n) for n in c.exclude_cidrs),
        tcp_timeout=round(c.tcp_timeout),
        tcp_fin_timeout=round(c.tcp_fin_timeout),
        udp_timeout=round(c.udp_timeout),
    )


def egress_settings(cfg: ProxyConfig) -> EgressSettings:
    """The egress SNAT's view of the configuration (lace.egress; pods: clusterCIDR; pod
    interfaces: detectLocal.interfaceNamePrefix)."""
    return EgressSettings(
        table=cfg.lace.egress.table,
        pod_cidrs=tuple(str(n) for n in cfg.cluster_cidr),
        non_masquerade_cidrs=tuple(str(n) for n in cfg.lace.egress.non_masquerade_cidrs),
        pod_interface_prefix=cfg.detect_local.interface_name_prefix,
    )


def egress_controller(cfg: ProxyConfig, metrics: ProxyMetrics) -> EgressController | None:
    """The controller following routes into the egress table, or None (off)."""
    if not cfg.lace.egress.enabled:
        log.info("egress SNAT: off (lace.egress.enabled false)")
        return None
    if not cfg.cluster_cidr:
        log.info("egress SNAT: pods are the Lace pod networks' prefixes (no clusterCIDR)")
    snat = EgressSnat(egress_settings(cfg), Nft())
    return EgressController(snat, metrics=metrics, resync=cfg.sync_period)


def routing_settings(cfg: ProxyConfig) -> RoutingSettings:
    """The policy routes' view of the configuration."""
    return RoutingSettings(
        table=cfg.lace.routing.table,
        priority=cfg.lace.routing.priority,
        service_cidrs=tuple(str(n) for n in cfg.lace.service_cidrs),
    )


def _manifests(cfg: ProxyConfig) -> Path:
    if not cfg.lace.manifests:
        raise SystemExit(
            "lace-proxy: give --manifests DIR (a folder of Service, EndpointSlice "
            "and Node manifests)"
        )
    path = Path(cfg.lace.manifests)
    if not path.exists():
        raise SystemExit(f"lace-proxy: manifests: no such file or folder: {path}")
    return path


def cmd_run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    table = ServiceTable(cfg.hostname_override)
    metrics = ProxyMetrics(mode=cfg.mode)
    backend = dataplane(cfg, metrics)
    rejections = Rejections(on_reject=lambda e: metrics.record_rejection(e.kind, e.code))
    health = ProxierHealth(cfg.sync_period, metrics)
    service_health = ServiceHealthServers(health, metrics)
    servers = ProxyServers(
        health,
        metrics,
        healthz_address=cfg.healthz_bind_address,
        metrics_address=cfg.metrics_bind_address,
        proxy_mode=cfg.mode,
    )
    source: ManifestSource | KubeSource
    if cfg.lace.manifests:
        name, where = FILES, str(_manifests(cfg))
    else:
        kubeconfig = args.kubeconfig or cfg.client_connection.kubeconfig
        name, where = KUBE, args.master or kubeconfig or "in-cluster config"
    egress = egress_controller(cfg, metrics)
    proxier = Proxier(
        table,
        backend,
        sources=[name],
        min_sync_period=cfg.min_sync_period,
        sync_period=cfg.sync_period,
        metrics=metrics,
        health=health,
        service_health=service_health,
        routes=PolicyRoutes(routing_settings(cfg)),
        pod_networks=egress.set_pod_networks if egress is not None else None,
        node_pod_cidrs=egress.set_node_pod_cidrs if egress is not None else None,
        takeover=_take_over_from_kube_proxy if args.cleanup_kube_proxy else None,
    )
    state = StateServer(cfg.lace.state_socket, proxier) if cfg.lace.state_socket else None
    if name == FILES:
        source = ManifestSource(where, proxier, rejections, interval=args.poll_interval)
    else:
        connection = ApiConnection(kubeconfig, args.master)
        try:  # a bad kubeconfig is told before anything starts
            asyncio.run(connection.configuration())
        except ApiConfigError as exc:
            raise SystemExit(f"lace-proxy: {exc}") from exc
        source = KubeSource(
            connection,
            proxier,
            cfg.hostname_override,
            rejections,
            metrics=metrics.source_event,
            on_contact=health.source_contact,
        )
    log.info(
        "lace-proxy %s (%s table) on node %s, mode %s, source %s (%s)",
        __version__,
        implementation(),
        cfg.hostname_override,
        cfg.mode,
        name,
        where,
    )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await servers.start()
        if state is not None:
            await state.start()
        if egress is not None:
            await loop.run_in_executor(None, egress.start)
        try:
            await asyncio.gather(source.run(stop), proxier.run(stop))
        finally:
            if egress is not None:
                egress.stop()
            await service_health.stop()
            if state is not None:
                await state.stop()
            await servers.stop()

    import uvloop

    uvloop.run(main())
    log.info("stopped; the kernel keeps the last programmed state (use `cleanup` to remove it)")
    return 0


def _take_over_from_kube_proxy() -> None:
    """kube-proxy's leftovers go, now that lace-proxy's rules serve (run --cleanup-kube-proxy)."""
    report = remove_kube_proxy()
    for line in report.removed:
        log.info("kube-proxy's leftovers: removed %s", line)
    for line in report.failed:
        log.error("kube-proxy's leftovers: could not remove %s", line)


def _backend_rows(backends: Sequence[Any]) -> str:
    if not backends:
        return "-"
    parts = []
    for b in backends:
        state = "ready" if b.ready else ("terminating" if b.terminating else "not-ready")
        where = "local" if b.local else "remote"
        host = f"[{b.ip}]" if ":" in b.ip else b.ip
        parts.append(f"{host}:{b.port} ({state},{where})")
    return " ".join(parts)


def cmd_table(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    # The proxy's own change tracker computes the table (network model included); it is
    # never synced, so nothing reaches the kernel.
    table = ServiceTable(cfg.hostname_override)
    proxier = Proxier(table, NftablesBackend(nftables_settings(cfg)), sources=[FILES])
    rejections = Rejections(on_reject=lambda e: print(f"rejected: {e}", file=sys.stderr))
    ManifestSource(_manifests(cfg), proxier, rejections).poll()
    table.build()
    table.commit()
    networks = proxier.networks
    rows = []
    for plan in sorted(table.plans(), key=lambda p: p.id):
        for f in plan.frontends():
            address = f.address if f.address is not None else "*"
            if ":" in address:
                address = f"[{address}]"
            rows.append(
                {
                    "service": plan.service,
                    "port": plan.port_name,
                    "kind": f.kind,
                    "family": f"IPv{f.family}",
                    "frontend": f"{address}:{f.port}/{f.protocol}",
                    "action": f.verdict or "forward",
                    "affinity": f.affinity_timeout,
                    "masquerade": f.masquerade,
                    "network": _network_of(networks, plan.service),
                    # The source networks that may reach it (None: no network model).
                    "reachableFrom": None if plan.access is None else list(plan.access.sources),
                    "backends": [backend_state(b) for b in f.backends],
                    "_text": _backend_rows(f.backends),
                }
            )
    excluded = {
        key: [{"address": a, "reason": r} for a, r in binding.excluded]
        for key, binding in sorted(networks.bindings.items())
        if binding.excluded
    }
    if args.output == "json":
        for row in rows:
            del row["_text"]
        doc = {"node": cfg.hostname_override, "frontends": rows, "excluded": excluded}
        json.dump(doc, sys.stdout, indent=2)
        print()
        return 0
    headers: tuple[str, ...] = ("SERVICE", "PORT", "KIND", "FRONTEND", "ACTION", "BACKENDS")
    lines = [
        (r["service"], r["port"] or "-", r["kind"], r["frontend"], r["action"], r["_text"])
        for r in rows
    ]
    if networks.enabled:
        headers = ("NETWORK", "FROM", *headers)
        lines = [
            (r["network"] or "-", ",".join(r["reachableFrom"] or ()) or "-", *line)
            for r, line in zip(rows, lines, strict=True)
        ]
    _print_columns(headers, lines)
    for key, items in excluded.items():
        for item in items:
            print(f"excluded: {key} endpoint {item['address']}: {item['reason']}")
    return 0


def _print_columns(headers: Sequence[str], lines: Sequence[Sequence[str]]) -> None:
    """Aligned columns; the last one runs free (lists of backends, reasons)."""
    widths = [max([len(h)] + [len(line[i]) for line in lines]) for i, h in enumerate(headers[:-1])]
    for line in [headers, *lines]:
        print("  ".join([*(c.ljust(w) for c, w in zip(line[:-1], widths, strict=True)), line[-1]]))


def _computed_proxier(args: argparse.Namespace, cfg: ProxyConfig) -> Proxier:
    """A proxier fed from the manifest folder, or from one complete list of the API, with its
    table built and committed; it is never synced, so nothing reaches the kernel."""
    table = ServiceTable(cfg.hostname_override)
    source_name = FILES if cfg.lace.manifests else KUBE
    proxier = Proxier(table, NftablesBackend(nftables_settings(cfg)), sources=[source_name])
    rejections = Rejections(on_reject=lambda e: print(f"rejected: {e}", file=sys.stderr))
    if cfg.lace.manifests:
        ManifestSource(_manifests(cfg), proxier, rejections).poll()
    else:
        server = ApiConnection(args.kubeconfig or cfg.client_connection.kubeconfig, args.master)
        source = KubeSource(server, proxier, cfg.hostname_override, rejections)

        async def listed() -> None:
            stop = asyncio.Event()
            task = asyncio.create_task(source.run(stop))
            try:
                async with asyncio.timeout(args.timeout):
                    while not proxier.ready:
                        if task.done():  # the client could not be configured
                            task.result()
                        await asyncio.sleep(0.05)
            except TimeoutError:
                raise _InputError(
                    f"{server.describe()}: no complete list of services and endpoint slices "
                    f"within {args.timeout:g} s (is the API server reachable?)"
                ) from None
            except ApiConfigError as exc:
                raise _InputError(str(exc)) from exc
            finally:
                stop.set()
                await asyncio.gather(task, return_exceptions=True)

        asyncio.run(listed())
    table.build()
    table.commit()
    return proxier


class _InputError(Exception):
    """A problem with what the user asked for; the message says which."""


_INVENTORY_COLUMNS = {
    "services": ("NAMESPACE", "NAME", "TYPE", "NETWORK", "FRONTENDS", "BACKENDS"),
    "endpoints": ("NAMESPACE", "SERVICE", "PORT", "ENDPOINT", "STATE", "NODE", "USED-BY", "WHY"),
}


def _service_line(doc: dict[str, Any]) -> tuple[str, ...]:
    frontends = list(dict.fromkeys(f"{f['frontend']}({f['kind']})" for f in doc["frontends"]))
    backends: dict[str, str] = {}
    for f in doc["frontends"]:
        for b in f["backends"]:
            backends.setdefault(b["endpoint"], b["state"])
    verdicts = sorted({f["action"] for f in doc["frontends"]} - {"forward"})
    if doc["skipped"]:
        shown = f"({doc['skipped']})"
    elif not doc["frontends"]:
        shown = "(no frontends: " + ("; ".join(doc["conflicts"]) or "nothing programmed") + ")"
    else:
        shown = " ".join(f"{e}({state})" for e, state in backends.items())
        if verdicts:  # some frontends reject or drop: all, or those left without backends
            shown += (
                f" ({','.join(verdicts)} where none)" if shown else f"none ({','.join(verdicts)})"
            )
    return (
        doc["namespace"],
        doc["name"],
        doc["type"],
        doc["network"] or "-",
        ",".join(frontends) or "-",
        shown,
    )


def _endpoint_line(doc: dict[str, Any]) -> tuple[str, ...]:
    return (
        doc["namespace"],
        doc["service"],
        f"{doc['port'] or '-'}/{doc['protocol']}",
        doc["endpoint"],
        doc["state"],
        doc["node"] or "-",
        ",".join(doc["usedBy"]) or "-",
        doc["excluded"] or "-",
    )


def cmd_inventory(args: argparse.Namespace) -> int:
    """`services` and `endpoints`: the running proxy's view, or one computed here."""
    what = args.command
    try:
        cfg = config_from_args(args)
        computed = bool(cfg.lace.manifests or args.kubeconfig or args.master)
        if computed:
            proxier = _computed_proxier(args, cfg)
            compute = state_socket.DOCUMENTS[what]
            doc = {"node": cfg.hostname_override, "ready": True, what: compute(proxier)}
        else:
            if not cfg.lace.state_socket:
                raise _InputError(
                    "no state socket configured (lace.stateSocket is empty): give "
                    "--state-socket PATH, or --kubeconfig/--manifests to compute the state"
                )
            try:
                doc = state_socket.fetch(cfg.lace.state_socket, what)
            except state_socket.StateUnavailable as exc:
                raise _InputError(
                    f"{exc}; give --kubeconfig FILE (or --manifests DIR) to compute it instead"
                ) from exc
    except _InputError as exc:
        print(f"lace-proxy {what}: {exc}", file=sys.stderr)
        return 2
    name_key = "name" if what == "services" else "service"
    doc[what] = inventory.select(doc[what], args.namespace, args.names, name_key)
    if args.output == "json":
        json.dump(doc, sys.stdout, indent=2)
        print()
    elif args.output == "yaml":
        yaml.safe_dump(doc, sys.stdout, sort_keys=False)
    else:
        if not doc["ready"]:
            print("note: the proxy has not yet received every initial list", file=sys.stderr)
        line = _service_line if what == "services" else _endpoint_line
        _print_columns(_INVENTORY_COLUMNS[what], [line(d) for d in doc[what]])
    return 0


def cmd_completion(args: argparse.Namespace) -> int:
    import shtab

    print(shtab.complete(build_parser(), shell=args.shell))
    return 0


def _network_of(networks: NetworkView, service_key: str) -> str | None:
    binding = networks.bindings.get(service_key)
    return binding.network if binding else None


class _NodeRecorder:
    """Hands every change to the proxier and keeps the Node objects on the side.

    The proxier keeps only what the kernel needs of its own Node; explain also needs every
    address of it (NodePorts answer on all of them) and the other nodes' (their NodePorts).
    """

    def __init__(self, proxier: Proxier) -> None:
        self.proxier = proxier
        self.nodes: dict[str, Node] = {}

    def service_upserted(self, svc: Service) -> None:
        self.proxier.service_upserted(svc)

    def service_deleted(self, key: str) -> None:
        self.proxier.service_deleted(key)

    def slice_upserted(self, sl: EndpointSlice) -> None:
        self.proxier.slice_upserted(sl)

    def slice_deleted(self, key: str) -> None:
        self.proxier.slice_deleted(key)

    def node_upserted(self, node: Node) -> None:
        self.nodes[node.name] = node
        self.proxier.node_upserted(node)

    def node_deleted(self, name: str) -> None:
        self.nodes.pop(name, None)
        self.proxier.node_deleted(name)

    def service_cidr_upserted(self, cidr: ServiceCIDR) -> None:
        self.proxier.service_cidr_upserted(cidr)

    def service_cidr_deleted(self, name: str) -> None:
        self.proxier.service_cidr_deleted(name)

    def lace_upserted(self, obj: LaceObject) -> None:
        self.proxier.lace_upserted(obj)

    def lace_deleted(self, kind: str, name: str) -> None:
        self.proxier.lace_deleted(kind, name)

    def synced(self, source: str) -> None:
        self.proxier.synced(source)


def _node_facts(node: Node | None, name: str, extra: Sequence[str] = ()) -> NodeFacts:
    """A node's addresses for explain: its Node object's, plus those given on the command line."""
    addresses = [a for _, a in node.addresses] if node else []
    internal = [a for kind, a in node.addresses if kind == "InternalIP"] if node else []
    return NodeFacts(
        name,
        tuple(dict.fromkeys([*addresses, *extra])),
        tuple(dict.fromkeys([*internal, *extra])),
    )


def _explain_kernel(
    args: argparse.Namespace, settings: NftablesSettings, result: Explanation
) -> Explanation:
    """Ask the kernel (this one, or --netns's) whether it agrees with the table's verdict.

    On by default for root when the table exists; --kernel or --netns insist (a missing table
    is then "not programmed"), --no-kernel skips it.
    """
    if args.kernel is False:
        return dataclasses.replace(result, kernel=KernelCheck("not checked", "--no-kernel"))
    insisted = args.kernel is True or args.netns is not None
    if not insisted and os.geteuid() != 0:
        detail = "not root (run as root, or give --kernel)"
        return dataclasses.replace(result, kernel=KernelCheck("not checked", detail))
    try:
        kernel = NftablesBackend(settings, Nft(args.netns)).read_back()
    except (NftError, OSError) as exc:
        detail = f"cannot read table inet {settings.table}: {exc}"
        return dataclasses.replace(result, kernel=KernelCheck("not checked", detail))
    if kernel is None and not insisted:
        detail = f"no table inet {settings.table} here (is lace-proxy running on this node?)"
        return dataclasses.replace(result, kernel=KernelCheck("not checked", detail))
    return check_kernel(result, kernel, settings.table)


def cmd_explain(args: argparse.Namespace) -> int:
    def bad(message: object) -> int:
        print(f"lace-proxy: explain: {message}", file=sys.stderr)
        return 2

    try:
        query = parse_query(args.source, args.destination)
        extra = [str(ipaddress.ip_address(a)) for a in args.node_address or ()]
        netns_prefix(args.netns)  # validates the name
    except QueryError as exc:
        return bad(exc)
    except ValueError as exc:  # --node-address, --netns
        return bad(exc)
    cfg = config_from_args(args)  # a ConfigError is exit code 2 (main)
    if not cfg.lace.manifests:
        return bad(
            "give --manifests DIR (a folder of Service, EndpointSlice, Node and Lace manifests)"
        )
    if not Path(cfg.lace.manifests).exists():
        return bad(f"manifests: no such file or folder: {cfg.lace.manifests}")
    if not args.verbose:  # what the proxy would log is in the answer (rejected, conditions)
        logging.getLogger("lace_proxy").setLevel(logging.ERROR)
    settings = nftables_settings(cfg)
    # As `table`: the proxy's own change tracker computes the state; nothing is synced.
    table = ServiceTable(cfg.hostname_override)
    proxier = Proxier(table, NftablesBackend(settings), sources=[FILES])
    recorder = _NodeRecorder(proxier)
    rejected: list[str] = []
    rejections = Rejections(on_reject=lambda e: rejected.append(str(e)))
    ManifestSource(Path(cfg.lace.manifests), recorder, rejections).poll()
    table.build()
    table.commit()
    name = cfg.hostname_override
    state = State(
        proxier,
        settings,
        _node_facts(recorder.nodes.get(name), name, extra),
        tuple(_node_facts(n, n.name) for n in recorder.nodes.values() if n.name != name),
        tuple(dict.fromkeys(rejected)),
    )
    result = _explain_kernel(args, settings, explain(state, query))
    if args.output == "json":
        json.dump(result.to_dict(), sys.stdout, indent=2)
        print()
    else:
        print(result.to_text())
    return result.exit_code


IPVS_UNAVAILABLE = "IPVS is not available on this kernel (is the ip_vs module loaded?)"


class _KernelInputError(Exception):
    """Bad input for `kernel`: exit code 2 with this message."""


def _vs_text(vs: VirtualServer) -> str:
    return f"{vs.protocol}  {_host_port(vs.address, vs.port)}"


def _host_port(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _vs_order(vs: VirtualServer) -> tuple[str, int, int, int]:
    ip = ipaddress.ip_address(vs.address)
    return (vs.protocol, ip.version, int(ip), vs.port)


def _ipvs_plans(args: argparse.Namespace, cfg: ProxyConfig) -> tuple[IpvsBackend, list[Any]]:
    """The IPVS backend as `run` would make it, reading --netns's kernel, and the table's
    plans as `table` computes them (the proxier's own change tracker, never synced)."""
    base = dataplane(cfg)  # the mode's settings, exactly as `run` derives them
    assert isinstance(base, IpvsBackend)
    backend = IpvsBackend(base.settings, base.nft, args.netns)
    table = ServiceTable(cfg.hostname_override)
    # The backend takes the Node's addresses from the proxier (nodePortAddresses: primary).
    proxier = Proxier(table, backend, sources=[FILES])
    rejections = Rejections(on_reject=lambda e: print(f"rejected: {e}", file=sys.stderr))
    ManifestSource(Path(cfg.lace.manifests), proxier, rejections).poll()
    table.build()
    table.commit()
    return backend, list(table.plans())


def _ipvs_desired(
    plans: Sequence[Any], node_addresses: Sequence[str], scheduler: str
) -> tuple[dict[VirtualServer, Target], dict[VirtualServer, list[str]], set[str]]:
    """What a full sync would program (IPVS mode's own `Wanted`, on the node addresses the
    backend read from the kernel), each virtual service's service ports for the SERVICE
    column (the one it serves first), and the addresses the dummy interface would hold."""
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


def _read_ipvs(backend: IpvsBackend) -> KernelView:
    """The backend's kernel view; kernel errors become input errors with a clear message."""
    try:
        return backend.inspect()
    except NetlinkError as exc:
        if exc.code == errno.ENOENT:  # no IPVS generic-netlink family
            raise _KernelInputError(IPVS_UNAVAILABLE) from exc
        if exc.code in (errno.EPERM, errno.EACCES):
            raise _KernelInputError("reading IPVS needs root (CAP_NET_ADMIN)") from exc
        raise _KernelInputError(f"cannot read IPVS: {exc}") from exc
    except BrokenExecutor as exc:  # the kernel thread could not enter the namespace
        raise _KernelInputError(f"cannot enter network namespace {backend.netns}") from exc


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
    one of ours that is not desired (ours by the backend's rule: on a dummy address, held or
    desired, or a NodePort on a node address), a different scheduler or persistence, a real
    server missing, serving but not desired, or desired but at weight 0. A real server at
    weight 0 that is not desired is draining, as the proxy leaves it: listed, not a
    difference."""
    dummy = set(view.dummy_addresses) | refs
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
                "ours": backend.owns(vs, dummy, view.node_addresses),
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
            if have is not None and backend.owns(vs, dummy, view.node_addresses):
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


def _ipvs_text(doc: dict[str, Any]) -> str:
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
    cfg: ProxyConfig, backend: IpvsBackend, plans: Sequence[Any], view: KernelView
) -> dict[str, Any]:
    """What `kernel` reports: the kernel's view listed, and its diff against the plans."""
    desired, labels, refs = _ipvs_desired(plans, view.node_addresses, backend.settings.scheduler)
    return {
        "node": cfg.hostname_override,
        "netns": backend.netns,
        **_ipvs_report(backend, view, desired, labels, refs),
    }


def _netns_problem(netns: str | None) -> str | None:
    """Why --netns is unusable (a bad name, or no such namespace: never create one), or None."""
    try:
        netns_prefix(netns)  # validates the name
    except ValueError as exc:
        return str(exc)
    if netns is not None and not Path(NETNS_RUN_DIR, netns).exists():
        return f"no network namespace {netns} (see `ip netns list`)"
    return None


def cmd_kernel(args: argparse.Namespace) -> int:
    def bad(message: object) -> int:
        print(f"lace-proxy: kernel: {message}", file=sys.stderr)
        return 2

    if (problem := _netns_problem(args.netns)) is not None:
        return bad(problem)
    cfg = config_from_args(args)  # a ConfigError is exit code 2 (main)
    if cfg.mode != "ipvs":
        return bad(
            f"the proxy mode is {cfg.mode}: it programs no IPVS, so there is nothing to "
            "show (give --proxy-mode ipvs or a --config with mode: ipvs; `lace-proxy "
            "explain` checks the nftables table)"
        )
    if not cfg.lace.manifests:
        return bad(
            "give --manifests DIR (a folder of Service, EndpointSlice, Node and Lace manifests)"
        )
    if not Path(cfg.lace.manifests).exists():
        return bad(f"manifests: no such file or folder: {cfg.lace.manifests}")
    if not args.verbose:  # the proxier's own logging is not the answer
        logging.getLogger("lace_proxy").setLevel(logging.ERROR)
    backend, plans = _ipvs_plans(args, cfg)
    try:
        view = _read_ipvs(backend)
    except _KernelInputError as exc:
        return bad(exc)
    doc = kernel_document(cfg, backend, plans, view)
    if args.output == "json":
        json.dump(doc, sys.stdout, indent=2)
        print()
    else:
        print(_ipvs_text(doc))
    return 0 if doc["inSync"] else 1


class _DoctorInputError(Exception):
    """Bad input for `doctor`: exit code 2 with this message."""


def _doctor_inputs(args: argparse.Namespace) -> tuple[ProxyConfig, LoadResult | None]:
    """The configuration and --manifests (if given) a doctor check reads."""
    if (problem := _netns_problem(args.netns)) is not None:
        raise _DoctorInputError(problem)
    try:
        cfg = config_from_args(args)
    except ConfigError as exc:
        raise _DoctorInputError(exc) from exc
    if not cfg.lace.manifests:
        return cfg, None
    try:
        return cfg, load_manifests(cfg.lace.manifests)
    except FileNotFoundError as exc:
        raise _DoctorInputError(f"manifests: no such file or folder: {cfg.lace.manifests}") from exc


def _doctor_output(report: EgressReport | NodeReport, output: str) -> int:
    if output == "json":
        json.dump(report.to_dict(), sys.stdout, indent=2)
        print()
    else:
        print(report.to_text())
    return report.exit_code


def cmd_doctor_egress(args: argparse.Namespace) -> int:
    def bad(message: object) -> int:
        print(f"lace-proxy: doctor egress: {message}", file=sys.stderr)
        return 2

    try:
        pod_ip, to_ip = ipaddress.ip_address(args.pod), ipaddress.ip_address(args.to)
        cfg, loaded = _doctor_inputs(args)
    except (ValueError, _DoctorInputError) as exc:
        return bad(exc)
    if pod_ip.version != to_ip.version:
        return bad(f"--pod {pod_ip} and --to {to_ip} are of different IP families")
    pod, to = str(pod_ip), str(to_ip)
    nodes: dict[str, list[str]] = {}
    pod_networks: list[str] = []
    node_pod_cidrs: tuple[str, ...] = ()
    if loaded is not None:
        nodes = {
            name: [a for _, a in node.addresses]
            for name, node in loaded.nodes.items()
            if name != cfg.hostname_override
        }
        if (this := loaded.nodes.get(cfg.hostname_override)) is not None:
            node_pod_cidrs = this.pod_cidrs
        layout = NetworkGraph(loaded.lace.values()).layout()
        pod_networks = [prefix for prefix, _ in layout.pod_prefixes]
    try:
        snat = egress_settings(cfg)  # as `run` programs it, plus the pod networks it is told
    except ValueError as exc:  # an interface prefix nft cannot take
        return bad(exc)
    view = EgressSettingsView(
        enabled=cfg.lace.egress.enabled,
        pod_cidrs=(*snat.pod_cidrs, *pod_networks),
        non_masquerade_cidrs=snat.non_masquerade_cidrs,
        routable_prefixes=tuple(str(n) for n in cfg.lace.egress.routable_prefixes),
        pod_interface_prefix=snat.pod_interface_prefix,
        node_pod_cidrs=node_pod_cidrs,
    )
    try:
        with IPRoute(**({"netns": args.netns} if args.netns else {})) as ipr:
            snapshot = read_snapshot(ipr)
    except (OSError, NetlinkError) as exc:
        return bad(f"cannot read the routing table: {exc}")
    return _doctor_output(diagnose_egress(snapshot, view, pod, to, nodes), args.output)


def cmd_doctor_node(args: argparse.Namespace) -> int:
    def bad(message: object) -> int:
        print(f"lace-proxy: doctor node: {message}", file=sys.stderr)
        return 2

    try:
        cfg, loaded = _doctor_inputs(args)
    except _DoctorInputError as exc:
        return bad(exc)
    published = {name: n.mtu for name, n in (loaded.nodes if loaded else {}).items() if n.mtu}
    view = NodeSettingsView(
        mode=cfg.mode,
        scheduler=cfg.ipvs.scheduler,
        pod_interface_prefix=cfg.detect_local.interface_name_prefix,
        node_mtus={n: m for n, m in published.items() if n != cfg.hostname_override},
        own_mtu=published.get(cfg.hostname_override),
    )
    try:
        facts = read_node_facts(Nft(args.netns), args.netns)
    except Exception as exc:  # e.g. not root: no setns, no netlink, no nft
        return bad(f"cannot read the node's state (run as root): {exc}")
    return _doctor_output(diagnose_node(facts, view), args.output)


def cmd_cleanup(args: argparse.Namespace) -> int:
    if args.kube_proxy:
        report = remove_kube_proxy()
        for line in report.removed:
            print(f"removed  {line}")
        for line in report.skipped:
            print(f"skipped  {line}")
        for line in report.failed:
            print(f"FAILED   {line}", file=sys.stderr)
        return 1 if report.failed else 0
    cfg = config_from_args(args)
    settings = nftables_settings(cfg)
    nft = NftablesBackend(settings, Nft())
    removed = nft.cleanup()
    print(f"nftables table inet {nft.table}: {'removed' if removed else 'not present'}")
    # IPVS leftovers go whatever the mode: a node may be switching from one to the other.
    untranslated = NftablesBackend(dataclasses.replace(settings, translate=False), Nft())
    ipvs = IpvsBackend(ipvs_settings(cfg), untranslated)
    try:
        count = ipvs.remove_ipvs()
        print(f"IPVS virtual services and interface {ipvs.settings.interface}: {count} removed")
    except Exception as exc:  # no ip_vs module: nothing of ours can be there
        print(f"IPVS: not available here ({exc})")
    egress = EgressSnat(egress_settings(cfg), Nft())
    removed = egress.cleanup()
    print(f"nftables table inet {egress.settings.table}: {'removed' if removed else 'not present'}")
    routing = routing_settings(cfg)
    count = PolicyRoutes(routing).cleanup()
    print(
        f"policy rules at priority {routing.priority} and routes in table {routing.table}:"
        f" {count} removed"
    )
    return 0


def cmd_sandbox(args: argparse.Namespace) -> int:
    from lace_proxy.demo.sandbox import example_manifests, run_demo

    if args.manifests is None:
        with example_manifests() as manifests:
            return run_demo(manifests, keep=args.keep, requests=args.requests)
    manifests = Path(args.manifests).resolve()
    if not manifests.exists():
        raise SystemExit(f"lace-proxy: sandbox: no such file or folder: {manifests}")
    return run_demo(manifests, keep=args.keep, requests=args.requests)


def cmd_version(args: argparse.Namespace) -> int:
    print(f"lace-proxy {__version__} ({implementation()} service table)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lace-proxy",
        description="A kube-proxy replacement: a compiled service table programming nftables.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser(
        "run",
        help="run the proxy",
        description="Serve the Services and EndpointSlices of the Kubernetes API (in-cluster "
        "config, --kubeconfig or --master), or of a manifest folder (--manifests), keeping "
        "this node's nftables table in step. Runs until SIGINT/SIGTERM; the kernel state "
        "stays in place after it stops.",
    )
    add_config_flags(run)
    run.add_argument(
        "--poll-interval",
        type=float,
        default=0.5,
        metavar="SECONDS",
        help="how often the manifest folder is checked for changes (default 0.5)",
    )
    run.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig for the Kubernetes API (without --manifests; default: the config's "
        "clientConnection.kubeconfig, else in-cluster)",
    )
    run.add_argument(
        "--master", metavar="URL", help="the API server's address, overriding the kubeconfig's"
    )
    run.add_argument(
        "--cleanup-kube-proxy",
        action="store_true",
        help="switching from kube-proxy: once the first sync is in the kernel, remove "
        "kube-proxy's leftovers as `cleanup --kube-proxy` does (its rules serve until then, "
        "so no new connection fails; stop kube-proxy first)",
    )
    run.set_defaults(func=cmd_run)

    table = sub.add_parser(
        "table",
        help="print the computed service table",
        description="Compute this node's service table from a manifest folder and print each "
        "frontend with its backends (state: ready/terminating, local/remote).",
    )
    add_config_flags(table)
    table.add_argument("-o", "--output", choices=("table", "json"), default="table")
    table.set_defaults(func=cmd_table)

    for what, summary, shows in (
        (
            "services",
            "list services: type, frontends, backends with state, bound network",
            "each service with its type, its Lace network, its frontends (ClusterIPs, "
            "NodePorts, ExternalIPs, LoadBalancer IPs) and the backends they forward to, "
            "with their state (ready, terminating, not-ready)",
        ),
        (
            "endpoints",
            "list endpoints: state, node, the traffic that uses each, or why none does",
            "every endpoint of every service port, as the EndpointSlices deliver it: its "
            "state, node, the traffic that uses it (cluster: ClusterIP; external: NodePort, "
            "ExternalIP, LoadBalancer) or why it is excluded (not ready, outside the "
            "service's network, another node's under a Local policy, topology hints, ...)",
        ),
    ):
        inv = sub.add_parser(
            what,
            help=summary,
            description=f"Show {shows}. By default the running proxy on this node answers, "
            "over its read-only state socket (lace.stateSocket; root only); with "
            "--kubeconfig/--master or --manifests the state is computed here instead, as "
            "the proxy would compute it for the node --hostname-override.",
        )
        inv.add_argument(
            "names", nargs="*", metavar="NAME", help="service NAME or NAMESPACE/NAME (default: all)"
        )
        inv.add_argument("-n", "--namespace", help="only services in this namespace")
        inv.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
        inv.add_argument(
            "--kubeconfig", metavar="FILE", help="compute the state from this cluster's API"
        )
        inv.add_argument("--master", metavar="URL", help="the API server's address")
        inv.add_argument(
            "--timeout",
            type=float,
            default=30.0,
            metavar="SECONDS",
            help="how long to wait for the API's complete lists (default 30)",
        )
        add_config_flags(inv)
        inv.set_defaults(func=cmd_inventory)

    explain_cmd = sub.add_parser(
        "explain",
        help="tell what happens to a new connection, and why",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Explain a new connection from SRC to DST under this node's table (computed from
--manifests, as `table` does, with the settings of --config: lace.serviceCIDRs,
nodePortAddresses, clusterCIDR) and the Lace network model:

  source       the source's network and why (host-local, a pod network by prefix, an
               external network by longest-prefix match, or no identity)
  destination  a ClusterIP/NodePort/ExternalIP/LoadBalancer frontend, a pod, or nothing
               of lace-proxy's
  bound to     the service's network, and why
  verdict/why  the policy that allows it, or what is missing (as an operator action)
  backends     the endpoints that may answer, or why none (excluded endpoints listed)
  condition    network-model conditions that bear on it; `rejected`: invalid objects
  kernel       whether the kernel's nftables sets agree (kernel agrees / kernel
               differs / not programmed)""",
        epilog="""examples:
  lace-proxy explain node 10.96.0.10:53/UDP --manifests DIR --config proxy.yaml
  lace-proxy explain 10.251.0.11 10.96.0.40:80 --manifests DIR --hostname-override node-a
  lace-proxy explain fd00:250::2 [fd00:250::1]:30080/TCP --manifests DIR -o json
  lace-proxy explain node 10.250.0.1:30080 --manifests DIR --node-address 10.250.0.1

exit codes:
  0  the connection goes through (allowed, or not lace-proxy's to decide)
  1  it would be refused, dropped, left unanswered or not proxied
  2  bad input (SRC, DST, options, configuration)""",
    )
    explain_cmd.add_argument(
        "source",
        metavar="SRC",
        help="where the connection comes from: an IP address (a pod, a client, another node), "
        "or `node` for traffic this node originates (hostNetwork pods included), e.g. "
        "10.251.0.11 or node",
    )
    explain_cmd.add_argument(
        "destination",
        metavar="DST",
        help="IP:PORT[/PROTO], PROTO one of TCP (default), UDP, SCTP; IPv6 in brackets, e.g. "
        "10.96.0.10:53/UDP or [fd00::1]:80/UDP",
    )
    add_config_flags(explain_cmd)
    explain_cmd.add_argument(
        "-o",
        "--output",
        choices=("text", "json"),
        default="text",
        help="text: aligned `label  value` lines (default); json: a stable document",
    )
    explain_cmd.add_argument(
        "--node-address",
        action="append",
        metavar="IP",
        help="an address of this node, where its NodePorts answer (repeatable; default: the "
        "addresses of the Node named --hostname-override in the manifests), e.g. 10.250.0.1",
    )
    explain_cmd.add_argument(
        "--kernel",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compare with the kernel's nftables table (default: on when run as root and the "
        "table exists); --no-kernel skips it",
    )
    explain_cmd.add_argument(
        "--netns",
        metavar="NAME",
        help="read the kernel of this named network namespace (implies --kernel), e.g. for "
        "a sandbox node",
    )
    explain_cmd.set_defaults(func=cmd_explain)

    kernel = sub.add_parser(
        "kernel",
        help="list what IPVS holds, with service names, and its diff against the table",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
List what IPVS holds on this node (this kernel, or --netns's) in the layout of
`ipvsadm -Ln`, with a SERVICE column (namespace/name:port) for the virtual services
the table explains, then its difference from the table (computed from --manifests as
`table` does, with the settings of --config; NodePorts on the node addresses the IPVS
backend reads from the kernel):

  missing     a virtual service the table wants that IPVS does not hold
  unexpected  one of lace-proxy's (on its dummy interface's addresses, or a NodePort
              on a node address) that the table does not want
  different   scheduler, persistence, or real servers: missing, unexpected (serving
              but not in the table), or in the table but at weight 0
  draining    a removed real server at weight 0 until its connections end: listed,
              not a difference

SERVICE is "-" for one of lace-proxy's the table does not explain, "(foreign)" for a
virtual service on other addresses: shown, never diffed. IPVS mode only (--proxy-mode
ipvs or mode: ipvs in --config); needs root.""",
        epilog="""examples:
  lace-proxy kernel --manifests DIR --proxy-mode ipvs --hostname-override node-a
  lace-proxy kernel --manifests DIR --config proxy.yaml --netns lp1a2b.N -o json

exit codes:
  0  IPVS holds what the table says
  1  it differs (missing, unexpected or different virtual services)
  2  bad input (options, configuration, manifests), nftables mode, or no IPVS here""",
    )
    add_config_flags(kernel)
    kernel.add_argument(
        "-o",
        "--output",
        choices=("text", "json"),
        default="text",
        help="text: ipvsadm's layout and the diff (default); json: the same as a document",
    )
    kernel.add_argument(
        "--netns",
        metavar="NAME",
        help="read the IPVS of this named network namespace, e.g. a sandbox node",
    )
    kernel.set_defaults(func=cmd_kernel)

    doctor = sub.add_parser(
        "doctor",
        help="find what breaks a pod's egress, or this node (doctor egress | node)",
        description="Diagnose this node: `doctor egress` for one pod's traffic out of the "
        "cluster, `doctor node` for the kernel, sysctls, MTUs and kube-proxy's leftovers.",
    )
    checks = doctor.add_subparsers(dest="check", metavar="CHECK", required=True)
    egress = checks.add_parser(
        "egress",
        help="the route, the source the far end sees, and why the return path may fail",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
For a new connection from a pod of this node to DEST, read this node's routing table (or
--netns's) as the egress SNAT does and tell:

  route        the route the node selects (main table, longest prefix, lowest metric)
  source       the address DEST will see: the route's preferred source when lace-proxy
               source-NATs it (a pod: in clusterCIDR or a Lace pod network of
               --manifests; a destination outside them and
               lace.egress.nonMasqueradeCIDRs, not routed out of a pod interface:
               detectLocal.interfaceNamePrefix or routing a pod prefix on-link),
               else the pod's own
  findings     no_route; dropped_by_route (a blackhole/unreachable/prohibit route);
               source_not_routable (outside lace.egress.routablePrefixes);
               next_hop_is_a_node (another cluster node forwards without re-sourcing;
               nodes from the Node objects in --manifests); mtu_mismatch (the pod's
               interface MTU above the path's); notes: not_a_pod_address,
               pod_not_on_this_node. Each says what to do.""",
        epilog="""examples:
  lace-proxy doctor egress --pod 10.251.1.11 --to 198.18.0.10 --config proxy.yaml
  lace-proxy doctor egress --pod 10.251.1.11 --to 203.0.113.10 --manifests DIR -o json

exit codes:
  0  the return path can work
  1  a problem was found (see findings)
  2  bad input (addresses, options, configuration)""",
    )
    egress.add_argument(
        "--pod", required=True, metavar="IP", help="the pod's address, e.g. 10.251.1.11"
    )
    egress.add_argument(
        "--to", required=True, metavar="DEST", help="the destination address, e.g. 198.18.0.10"
    )
    add_config_flags(egress)
    egress.add_argument(
        "-o", "--output", choices=("text", "json"), default="text", help="text (default) or json"
    )
    egress.add_argument(
        "--netns", metavar="NAME", help="read this named network namespace's routes"
    )
    egress.set_defaults(func=cmd_doctor_egress)
    node = checks.add_parser(
        "node",
        help="kernel features, sysctls, MTUs and kube-proxy's leftovers",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Check whether this node (or --netns's) is fit for lace-proxy in the configured mode:

  nftables         the nft binary answers (nf_tables loaded)
  conntrack        connection tracking present, and its table not nearly full
  ipvs             mode ipvs: IPVS loaded; note when the scheduler's module is not yet
  ip_forward       net.ipv4.ip_forward is 1; notes: strict rp_filter (asymmetric paths
                   dropped), route_localnet left on by kube-proxy
  mtu              pod interfaces (detectLocal.interfaceNamePrefix) not above the uplink's
                   MTU (the default route's interface); this node's and the other nodes'
                   published MTU (Node annotation lace-cni.io/mtu, from --manifests) equal
                   to it
  kube_proxy_*     kube-proxy's leftovers that would fight lace-proxy: its nftables
                   tables, its iptables chains (KUBE-*, as iptables-nft shows them), and
                   kube-ipvs0 with its IPVS services

Reads only; changes nothing.""",
        epilog="""examples:
  lace-proxy doctor node --config proxy.yaml
  lace-proxy doctor node --proxy-mode ipvs --manifests DIR -o json

exit codes:
  0  nothing wrong (notes may be listed)
  1  a problem was found
  2  bad input (options, configuration)""",
    )
    add_config_flags(node)
    node.add_argument(
        "-o", "--output", choices=("text", "json"), default="text", help="text (default) or json"
    )
    node.add_argument("--netns", metavar="NAME", help="check this named network namespace")
    node.set_defaults(func=cmd_doctor_node)

    cleanup = sub.add_parser(
        "cleanup",
        help="remove everything lace-proxy programmed (or, --kube-proxy, kube-proxy's leftovers)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Remove what lace-proxy made on this node: its nftables tables (services, egress
SNAT), its IPVS virtual services and lace-ipvs0 interface, and its policy rules and
routes (lace.routing.*). Run it after stopping the proxy; with --config, the names
in that file are the ones removed.

With --kube-proxy, remove kube-proxy's leftovers instead (stop kube-proxy first):
the jumps into its KUBE-* iptables chains and those chains (iptables-nft and
iptables-legacy, IPv4 and IPv6), its ipsets, its IPVS virtual services and
kube-ipvs0, and its nftables tables (ip/ip6 kube-proxy). kubelet's own chains
(KUBE-FIREWALL, KUBE-MARK-DROP, KUBE-KUBELET-CANARY) stay.

Established connections keep their conntrack NAT state either way: they go on to the
same endpoint until they close.""",
        epilog="exit codes: 0 done (or nothing to remove), 1 something could not be removed",
    )
    cleanup.add_argument(
        "--kube-proxy",
        action="store_true",
        help="remove kube-proxy's iptables chains, ipsets, IPVS services, kube-ipvs0 and "
        "nftables tables, not lace-proxy's",
    )
    add_config_flags(cleanup)
    cleanup.set_defaults(func=cmd_cleanup)

    sandbox = sub.add_parser(
        "sandbox",
        help="run the proxy in a network-namespace sandbox and show traffic (needs root)",
        description="Build network namespaces for a node, three pods with HTTP servers, a "
        "client and a router; run `lace-proxy run` on the node with a manifest folder; send "
        "requests from the client to each ClusterIP and NodePort and print which pod "
        "answered. Everything is removed on exit.",
    )
    sandbox.add_argument(
        "--manifests",
        metavar="DIR",
        help="the manifest folder to serve (default: the example folder shipped in the "
        "package, lace_proxy/demo/manifests)",
    )
    sandbox.add_argument("--requests", type=int, default=4, help="requests per frontend")
    sandbox.add_argument(
        "--keep", action="store_true", help="stay up after the requests, until Ctrl-C"
    )
    sandbox.set_defaults(func=cmd_sandbox)

    completion = sub.add_parser(
        "completion",
        help="print a shell completion script",
        description="Print a completion script for the shell, e.g. "
        "`lace-proxy completion bash > /etc/bash_completion.d/lace-proxy`.",
    )
    completion.add_argument("shell", choices=("bash", "zsh", "tcsh"))
    completion.set_defaults(func=cmd_completion)

    version = sub.add_parser("version", help="print the version and the active table twin")
    version.set_defaults(func=cmd_version)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `lace-proxy table | head` ends quietly
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"lace-proxy: {exc}", file=sys.stderr)
        return 2
    except NftError as exc:
        print(f"lace-proxy: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
