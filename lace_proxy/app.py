"""The composition root: where a `ProxyConfig` becomes sources, proxier, dataplane, health
and metrics, wired together.

`run` builds and runs the proxy; `computed_proxier` and `listed_proxier` build the same
proxier for the commands that only inspect (never synced: nothing reaches the kernel), so
every command derives its settings exactly as `run` does. The CLI parses flags and calls in
here from the handlers that need it: this module imports everything a proxy always needs, so
nothing that only builds the parser imports it. The API source (the Kubernetes client) and
the BGP speaker are imported where they are chosen: a proxy on a manifest folder, or without
BGP, starts without loading them (a third of the start-up's imports).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from lace_proxy import __version__, implementation
from lace_proxy.config import ProxyConfig
from lace_proxy.dataplane.base import Dataplane
from lace_proxy.dataplane.conntrack import Conntrack
from lace_proxy.dataplane.egress_snat import EgressSettings, EgressSnat
from lace_proxy.dataplane.ipvs import IpvsBackend, IpvsSettings
from lace_proxy.dataplane.nft import Nft
from lace_proxy.dataplane.nftables.backend import NftablesBackend
from lace_proxy.dataplane.nftables.settings import NftablesSettings
from lace_proxy.dataplane.routes import PolicyRoutes, RoutingSettings
from lace_proxy.egress.controller import EgressController
from lace_proxy.health import ProxierHealth, ProxyServers, ServiceHealthServers
from lace_proxy.metrics import ProxyMetrics
from lace_proxy.migration import remove_kube_proxy
from lace_proxy.model import (
    EndpointSlice,
    LaceObject,
    Node,
    Rejections,
    Service,
    ServiceCIDR,
    ValidationError,
)
from lace_proxy.proxier import Proxier
from lace_proxy.sources import ChangeHandler
from lace_proxy.sources.files import SOURCE_NAME as FILES
from lace_proxy.sources.files import ManifestSource
from lace_proxy.state_socket import StateServer
from lace_proxy.table import ServiceTable

if TYPE_CHECKING:
    from lace_proxy.bgp.announcer import Announcer
    from lace_proxy.sources.kube import KubeSource

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


def dataplane(cfg: ProxyConfig, metrics: ProxyMetrics | None = None) -> Dataplane:
    """The backend for the configured mode (IPVS mode keeps nftables, without translation)."""
    moved = None if metrics is None else metrics.record_udp_flows_moved
    nft = NftablesBackend(nftables_settings(cfg), Nft(), Conntrack(), udp_flows_moved=moved)
    return nft if cfg.mode != "ipvs" else IpvsBackend(ipvs_settings(cfg), nft)


def ipvs_settings(cfg: ProxyConfig) -> IpvsSettings:
    """The IPVS backend's view of the configuration (ipvs.*, lace.ipvs)."""
    c = cfg.ipvs
    return IpvsSettings(
        scheduler=c.scheduler,
        strict_arp=c.strict_arp,
        exclude_cidrs=tuple(str(n) for n in c.exclude_cidrs),
        tcp_timeout=round(c.tcp_timeout),
        tcp_fin_timeout=round(c.tcp_fin_timeout),
        udp_timeout=round(c.udp_timeout),
        local_routes=cfg.lace.ipvs.service_addresses == "localRoutes",
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


def bgp_announcer(cfg: ProxyConfig, metrics: ProxyMetrics) -> Announcer | None:
    """The BGP announcer with its speaker (BIRD), or None (lace.bgp.enabled false)."""
    if not cfg.lace.bgp.enabled:
        return None
    from lace_proxy.bgp.announcer import Announcer
    from lace_proxy.bgp.speaker import Speaker

    cidrs = tuple(str(n) for n in cfg.lace.service_cidrs)
    return Announcer(Speaker(cfg.lace.bgp), cidrs, metrics)


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


def manifests_path(cfg: ProxyConfig) -> Path:
    """The manifest folder (lace.manifests); none, or a missing one, ends the command."""
    if not cfg.lace.manifests:
        raise SystemExit(
            "lace-proxy: give --manifests DIR (a folder of Service, EndpointSlice "
            "and Node manifests)"
        )
    path = Path(cfg.lace.manifests)
    if not path.exists():
        raise SystemExit(f"lace-proxy: manifests: no such file or folder: {path}")
    return path


def run(
    cfg: ProxyConfig,
    *,
    kubeconfig: str | None,
    master: str | None,
    poll_interval: float,
    cleanup_kube_proxy: bool,
) -> int:
    """Serve the manifest folder, or else the API, until SIGINT/SIGTERM (`lace-proxy run`)."""
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
        name, where = FILES, str(manifests_path(cfg))
    else:
        from lace_proxy.sources import kube

        kubeconfig = kubeconfig or cfg.client_connection.kubeconfig
        name, where = kube.SOURCE_NAME, master or kubeconfig or "in-cluster config"
    egress = egress_controller(cfg, metrics)
    announcer = bgp_announcer(cfg, metrics)
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
        takeover=_take_over_from_kube_proxy if cleanup_kube_proxy else None,
        announce=announcer.sync if announcer is not None else None,
    )
    state = StateServer(cfg.lace.state_socket, proxier) if cfg.lace.state_socket else None
    if name == FILES:
        source = ManifestSource(where, proxier, rejections, interval=poll_interval)
    else:
        connection = kube.ApiConnection(kubeconfig, master)
        try:  # a bad kubeconfig is told before anything starts
            asyncio.run(connection.configuration())
        except kube.ApiConfigError as exc:
            raise SystemExit(f"lace-proxy: {exc}") from exc
        source = kube.KubeSource(
            connection,
            proxier,
            cfg.hostname_override,
            rejections,
            metrics=metrics.source_event,
            on_contact=health.source_contact,
        )
    proxier.describe_source(name, source.waiting)
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
            if announcer is not None:  # routers keep the routes while lace-proxy restarts
                await loop.run_in_executor(None, announcer.stop)
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


class SourceError(Exception):
    """The API gave no complete state (unreachable, or a bad kubeconfig); the message says why."""


def computed_proxier(
    cfg: ProxyConfig,
    backend: Dataplane | None = None,
    *,
    on_reject: Callable[[ValidationError], None],
    nodes: dict[str, Node] | None = None,
) -> Proxier:
    """A proxier fed from the manifest folder, with its table built and committed; it is never
    synced, so nothing reaches the kernel. The backend defaults to nftables (as `table`
    shows it); `nodes`, if given, receives every Node object delivered (explain needs all
    their addresses, which the proxier does not keep)."""
    table = ServiceTable(cfg.hostname_override)
    backend = backend if backend is not None else NftablesBackend(nftables_settings(cfg))
    proxier = Proxier(table, backend, sources=[FILES])
    handler: ChangeHandler = proxier if nodes is None else _NodeRecorder(proxier, nodes)
    ManifestSource(manifests_path(cfg), handler, Rejections(on_reject=on_reject)).poll()
    table.build()
    table.commit()
    return proxier


def listed_proxier(
    cfg: ProxyConfig,
    kubeconfig: str | None,
    master: str | None,
    timeout: float,
    *,
    on_reject: Callable[[ValidationError], None],
) -> Proxier:
    """A proxier fed from one complete list of the API, its table built and committed, never
    synced; `SourceError` if the lists do not arrive within `timeout` seconds."""
    from lace_proxy.sources import kube

    table = ServiceTable(cfg.hostname_override)
    proxier = Proxier(table, NftablesBackend(nftables_settings(cfg)), sources=[kube.SOURCE_NAME])
    rejections = Rejections(on_reject=on_reject)
    server = kube.ApiConnection(kubeconfig or cfg.client_connection.kubeconfig, master)
    source = kube.KubeSource(server, proxier, cfg.hostname_override, rejections)

    async def listed() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(source.run(stop))
        try:
            async with asyncio.timeout(timeout):
                while not proxier.ready:
                    if task.done():  # the client could not be configured
                        task.result()
                    await asyncio.sleep(0.05)
        except TimeoutError:
            raise SourceError(
                f"{server.describe()}: no complete list of services and endpoint slices "
                f"within {timeout:g} s (is the API server reachable?)"
            ) from None
        except kube.ApiConfigError as exc:
            raise SourceError(str(exc)) from exc
        finally:
            stop.set()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(listed())
    table.build()
    table.commit()
    return proxier


class _NodeRecorder:
    """Hands every change to the proxier and keeps the Node objects on the side.

    The proxier keeps only what the kernel needs of its own Node; explain also needs every
    address of it (NodePorts answer on all of them) and the other nodes' (their NodePorts).
    """

    def __init__(self, proxier: Proxier, nodes: dict[str, Node]) -> None:
        self.proxier = proxier
        self.nodes = nodes

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
