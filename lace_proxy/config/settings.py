"""The validated configuration: `ProxyConfig` and its sections, with kube-proxy's defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from lace_proxy.config.bgp import LaceBgpConfig
from lace_proxy.config.schema import SCHEMA, IPNetwork, render

UPSTREAM_API_VERSION = "kubeproxy.config.k8s.io/v1alpha1"
LACE_API_VERSION = "lace-proxy.lace-cni.io/v1alpha1"
KIND = "KubeProxyConfiguration"


@dataclass(frozen=True, slots=True)
class DetectLocalConfig:
    """detectLocal: the interfaces pod traffic comes from, for the interface-based modes."""

    bridge_interface: str = ""
    interface_name_prefix: str = ""


@dataclass(frozen=True, slots=True)
class NFTablesConfig:
    """nftables: settings for mode nftables, with kube-proxy's defaults."""

    masquerade_all: bool = False
    masquerade_bit: int = 14
    min_sync_period: float = 1.0
    sync_period: float = 30.0


@dataclass(frozen=True, slots=True)
class IPTablesConfig:
    """iptables: kube-proxy takes masqueradeAll and masqueradeBit from here in every mode but
    nftables, IPVS mode included; so does lace-proxy. The rest belongs to kube-proxy's iptables
    mode, which lace-proxy does not have: accepted, warned about when set, unused."""

    masquerade_all: bool = False
    masquerade_bit: int = 14
    localhost_node_ports: bool = True
    min_sync_period: float = 1.0
    sync_period: float = 30.0


#: iptables fields only kube-proxy's iptables mode reads (warned about when set).
IPTABLES_MODE_ONLY = ("localhostNodePorts", "minSyncPeriod", "syncPeriod")


@dataclass(frozen=True, slots=True)
class IPVSConfig:
    """ipvs: settings for mode ipvs; a 0 timeout keeps the kernel's value, as in kube-proxy."""

    scheduler: str = "rr"
    sync_period: float = 30.0
    min_sync_period: float = 1.0
    strict_arp: bool = False
    tcp_timeout: float = 0.0
    tcp_fin_timeout: float = 0.0
    udp_timeout: float = 0.0
    exclude_cidrs: tuple[IPNetwork, ...] = ()


@dataclass(frozen=True, slots=True)
class ClientConnectionConfig:
    """clientConnection: how to reach the API server (kubeadm writes a kubeconfig path)."""

    kubeconfig: str | None = None
    accept_content_types: str | None = None
    content_type: str | None = None
    qps: float = 5.0
    burst: int = 10


@dataclass(frozen=True, slots=True)
class ConntrackConfig:
    """conntrack: sysctls kube-proxy tunes; 0 leaves the kernel's value (maxPerCore 0 also
    ignores `min`)."""

    max_per_core: int = 32768
    min: int = 131072
    tcp_established_timeout: float = 86400.0
    tcp_close_wait_timeout: float = 3600.0
    tcp_be_liberal: bool = False
    udp_timeout: float = 0.0
    udp_stream_timeout: float = 0.0


@dataclass(frozen=True, slots=True)
class LaceNFTablesConfig:
    """lace.nftables: the nftables table lace-proxy owns (kube-proxy's is "kube-proxy")."""

    table: str = "lace-proxy"
    family: str = "inet"


@dataclass(frozen=True, slots=True)
class LaceRoutingConfig:
    """lace.routing: the policy rule and table steering the node's service traffic.

    The rules at `priority` and the routing table `table` are lace-proxy's; pick values no
    other agent on the node uses.
    """

    table: int = 1450
    priority: int = 1450


@dataclass(frozen=True, slots=True)
class LaceIPVSConfig:
    """lace.ipvs: how IPVS mode makes the node accept service addresses (IPVS takes packets
    to local addresses). `interface` (the default, as kube-proxy's kube-ipvs0): each is an
    address of the dummy interface lace-ipvs0. `localRoutes`: each is a `local` route in the
    local routing table (on lo, scope host, protocol 145: `ip route show table local proto
    145`), which the kernel adds and deletes at a cost that does not grow with their number,
    where an interface's addresses cost the square of it. Switching between restarts moves
    every address over and removes the other way's."""

    service_addresses: str = "interface"


@dataclass(frozen=True, slots=True)
class LaceEgressConfig:
    """lace.egress: pod traffic leaving the cluster is source-NATed to the preferred source of
    the node's route to it (DESIGN.md §4). Pods are the sources in clusterCIDR or a Lace pod
    network; destinations among them or in nonMasqueradeCIDRs are left alone, and so is
    service traffic (DNATed: the proxy's masquerade rules decide, as kube-proxy's). Turn it off
    where the CNI does it. `routablePrefixes` are the source addresses the far ends can route
    back to (only `lace-proxy doctor egress` reads them)."""

    enabled: bool = True
    table: str = "lace-proxy-egress"
    non_masquerade_cidrs: tuple[IPNetwork, ...] = ()
    routable_prefixes: tuple[IPNetwork, ...] = ()


@dataclass(frozen=True, slots=True)
class LaceConfig:
    """lace: lace-proxy's own settings, which kube-proxy has no field for."""

    manifests: str | None = None  # a path of Service/EndpointSlice manifests to serve
    nftables: LaceNFTablesConfig = field(default_factory=LaceNFTablesConfig)
    service_cidrs: tuple[IPNetwork, ...] = ()
    routing: LaceRoutingConfig = field(default_factory=LaceRoutingConfig)
    ipvs: LaceIPVSConfig = field(default_factory=LaceIPVSConfig)
    egress: LaceEgressConfig = field(default_factory=LaceEgressConfig)
    # Where the running proxy answers `lace-proxy services`/`endpoints` (read-only, root
    # only); "" serves nothing.
    state_socket: str = "/run/lace-proxy/state.sock"
    bgp: LaceBgpConfig = field(default_factory=LaceBgpConfig)


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    """The validated configuration; masquerade_all and the sync periods are `mode`'s."""

    hostname_override: str  # the node name: lowercased, the machine's hostname by default
    bind_address: str = "0.0.0.0"
    healthz_bind_address: str = "0.0.0.0:10256"  # "[::]:10256" when bind_address is IPv6
    metrics_bind_address: str = "127.0.0.1:10249"  # "[::1]:10249" when bind_address is IPv6
    cluster_cidr: tuple[IPNetwork, ...] = ()
    detect_local_mode: str = "ClusterCIDR"
    detect_local: DetectLocalConfig = field(default_factory=DetectLocalConfig)
    node_port_addresses: tuple[IPNetwork, ...] | Literal["primary"] = ()  # (): all local IPs
    mode: str = "nftables"
    masquerade_all: bool = False
    sync_period: float = 30.0
    min_sync_period: float = 1.0
    iptables: IPTablesConfig = field(default_factory=IPTablesConfig)
    nftables: NFTablesConfig = field(default_factory=NFTablesConfig)
    ipvs: IPVSConfig = field(default_factory=IPVSConfig)
    conntrack: ConntrackConfig = field(default_factory=ConntrackConfig)
    client_connection: ClientConnectionConfig = field(default_factory=ClientConnectionConfig)
    lace: LaceConfig = field(default_factory=LaceConfig)

    @property
    def masquerade_bit(self) -> int:
        """The packet-mark bit for masquerade in effect: IPVS mode's is iptables.masqueradeBit,
        as in kube-proxy (whose IPVS mode masquerades with iptables)."""
        return self.iptables.masquerade_bit if self.mode == "ipvs" else self.nftables.masquerade_bit

    def to_dict(self) -> dict[str, object]:
        """The configuration as a complete lace-proxy file (camelCase), e.g. to print it."""
        return {"apiVersion": LACE_API_VERSION, "kind": KIND, **render(self, SCHEMA)}
