"""Configuration: a KubeProxyConfiguration YAML file, overridden by command-line flags.

The file is the one kube-proxy reads (``apiVersion: kubeproxy.config.k8s.io/v1alpha1``,
``kind: KubeProxyConfiguration``), so an existing kube-proxy ConfigMap works unchanged.
``apiVersion: lace-proxy.lace-cni.io/v1alpha1`` (same kind) names the same schema for files
written for lace-proxy, and is what ``to_dict`` emits; both accept every field below,
including the ``lace`` section of lace-proxy's own settings.

Rules:

* Upstream fields that do not apply to lace-proxy (`IGNORED_UPSTREAM_FIELDS`) are skipped with
  one logged warning. Any other unknown field, and any ill-typed value, is a `ConfigError`
  naming the source, the dotted field path, the value and the expected type.
* As in kube-proxy's defaulting, null and Go zero values mean "unset" ("" for strings with a
  default, 0s for sync periods, false for masqueradeAll): kubeadm writes them everywhere.
* Durations are Go duration strings ("30s", "1h2m3.5s"), parsed into float seconds; numbers
  are rejected because a bare 30 is ambiguous.
* syncPeriod, minSyncPeriod and masqueradeAll may be set at the top level (where kube-proxy's
  internal configuration keeps them) or in the sections where the v1alpha1 file has them, read
  as kube-proxy's v1alpha1 conversion reads them: in nftables mode from ``nftables``; in IPVS
  mode the sync periods from ``ipvs`` and masqueradeAll (and masqueradeBit) from ``iptables``.
  A top-level value fills every section that leaves the field unset, so a section value wins
  for its mode. Flags beat the file, so the order is: flag section > flag top level > file
  section > file top level > default. `ProxyConfig`'s top-level fields hold the values in
  effect for its `mode`.
"""

from __future__ import annotations

import argparse
import difflib
import ipaddress
import json
import logging
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final, Literal, TypeAlias, TypeVar

import yaml

from lace_proxy.model.service import IPVS_SCHEDULERS

log = logging.getLogger(__name__)

UPSTREAM_API_VERSION = "kubeproxy.config.k8s.io/v1alpha1"
LACE_API_VERSION = "lace-proxy.lace-cni.io/v1alpha1"
KIND = "KubeProxyConfiguration"

MODES = ("nftables", "ipvs")
DETECT_LOCAL_MODES = ("ClusterCIDR", "NodeCIDR", "InterfaceNamePrefix", "BridgeInterface")
#: The nodePortAddresses value that means "only the Node object's primary IPs" (kube-proxy 1.29+).
NODE_PORT_PRIMARY: Final = "primary"
NFTABLES_FAMILIES = ("inet", "ip", "ip6")

# Fields of kube-proxy's v1alpha1 KubeProxyConfiguration that mean nothing to lace-proxy. They
# are accepted (so a kube-proxy ConfigMap loads as is) and reported in one warning: the API
# connection, logging and feature gates are lace-proxy's own flags' business; oomScoreAdj,
# portRange, profiling and hidden metrics are not implemented; winkernel configures a mode
# lace-proxy does not have; configSyncPeriod is an informer resync lace-proxy does not do.
# (iptables is read: IPVS mode takes masqueradeAll and masqueradeBit from it, as kube-proxy.)
IGNORED_UPSTREAM_FIELDS = frozenset(
    {
        "bindAddressHardFail",
        "configSyncPeriod",
        "enableProfiling",
        "featureGates",
        "logging",
        "oomScoreAdj",
        "portRange",
        "showHiddenMetricsForVersion",
        "windowsRunAsService",
        "winkernel",
    }
)

IPNetwork: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network

_OVERRIDE_SOURCE = "override"
_TABLE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,30}")
_IFNAMSIZ = 16  # Linux interface names are at most 15 bytes plus NUL

_DURATION_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # MICRO SIGN, which Go prints
    "\u03bcs": 1_000,  # GREEK SMALL LETTER MU, which Go also accepts
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_DURATION_PART = r"([0-9]+\.?[0-9]*|\.[0-9]+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)"
_DURATION = re.compile(f"(?:{_DURATION_PART})+")
_DURATION_PARTS = re.compile(_DURATION_PART)
_MAX_DURATION_NS = 2**63 - 1  # Go's time.Duration is an int64 of nanoseconds
_NOT_A_DURATION = "not a duration (e.g. 30s, 1m)"


class ConfigError(ValueError):
    """A configuration problem, located as ``source: path: problem`` for the operator.

    `source` is the file, "override" (a `load_config` override), a flag or "flags"; `path` is the
    dotted camelCase field path ("" for whole-file problems).
    """

    def __init__(self, source: str, path: str, problem: str) -> None:
        self.source = source
        self.path = path
        self.problem = problem
        super().__init__(f"{source}: {path}: {problem}" if path else f"{source}: {problem}")


def parse_duration(text: str) -> float:
    """Parse a Go duration ("1h2m3.5s", "500ms", "0") into seconds, refusing negatives.

    Truncates to whole nanoseconds, like Go. Raises ValueError whose text completes the
    sentence "<value> is ...".
    """
    if text.startswith("-"):
        raise ValueError("a negative duration; durations must be 0s or more")
    if text == "0":
        return 0.0
    if not _DURATION.fullmatch(text):
        raise ValueError(_NOT_A_DURATION)
    total = sum(
        Fraction(number) * _DURATION_UNITS_NS[unit]
        for number, unit in _DURATION_PARTS.findall(text)
    )
    if total > _MAX_DURATION_NS:
        raise ValueError("longer than the longest Go duration (about 292 years)")
    return int(total) / 1e9


def format_duration(seconds: float) -> str:
    """Render seconds as Go's time.Duration.String() does ("1h0m0s", "1.5s", "500ms")."""
    if seconds < 0:
        raise ValueError(f"negative duration {seconds}")
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    if ns < 1_000:
        return f"{ns}ns"
    if ns < 1_000_000:
        return _decimal(ns, 1_000) + "\u00b5s"
    if ns < 1_000_000_000:
        return _decimal(ns, 1_000_000) + "ms"
    hours, ns = divmod(ns, 3_600_000_000_000)
    minutes, ns = divmod(ns, 60_000_000_000)
    text = _decimal(ns, 1_000_000_000) + "s"
    if hours or minutes:
        text = f"{minutes}m{text}"
    if hours:
        text = f"{hours}h{text}"
    return text


def _decimal(value: int, unit: int) -> str:
    """`value / unit` in decimal without trailing zeros; `unit` is a power of ten."""
    whole, rest = divmod(value, unit)
    if not rest:
        return str(whole)
    return f"{whole}.{rest:0{len(str(unit)) - 1}d}".rstrip("0")


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
class LaceEgressConfig:
    """lace.egress: pod traffic leaving the cluster is source-NATed to the preferred source of
    the node's route to it (DESIGN.md §4). Pods are the sources in clusterCIDR or a Lace pod
    network; destinations among them or in nonMasqueradeCIDRs are left alone. Turn it off
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
    egress: LaceEgressConfig = field(default_factory=LaceEgressConfig)
    # Where the running proxy answers `lace-proxy services`/`endpoints` (read-only, root
    # only); "" serves nothing.
    state_socket: str = "/run/lace-proxy/state.sock"


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
        return {"apiVersion": LACE_API_VERSION, "kind": KIND, **_render(self, _SCHEMA)}


class _Invalid(Exception):
    """A value's problem, before the caller adds where it is; `suffix` locates a list item."""

    def __init__(self, problem: str, suffix: str = "") -> None:
        super().__init__(problem)
        self.problem = problem
        self.suffix = suffix


def _show(value: object) -> str:
    """A value as the operator wrote it (JSON is also YAML), cut short if long."""
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def _bad(value: object, expected: str) -> _Invalid:
    return _Invalid(f"{_show(value)} is not {expected}")


def _identity(value: Any) -> object:
    return value


@dataclass(frozen=True, slots=True)
class _Field:
    """How to read a leaf field (None: unset) and how `to_dict` writes it back."""

    parse: Callable[[object], object | None]
    render: Callable[[Any], object] = _identity


_Schema: TypeAlias = Mapping[str, "_Field | _Schema"]


def _string(value: object) -> str:
    if not isinstance(value, str):
        raise _bad(value, "a string")
    return value


def _optional_string(value: object) -> str | None:
    return _string(value) or None


def _hostname(value: object) -> str | None:
    """Trimmed and lowercased, as kube-proxy derives the node name."""
    return _string(value).strip().lower() or None


def _boolean(value: object) -> bool:
    if not isinstance(value, bool):
        raise _bad(value, "a boolean (true or false)")
    return value


def _true_or_unset(value: object) -> bool | None:
    """For masqueradeAll, where false is Go's zero value and so cannot shadow a true."""
    return _boolean(value) or None


def _integer(low: int, high: int) -> Callable[[object], int]:
    def parse(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise _bad(value, f"an integer from {low} to {high}")
        return value

    return parse


def _rate(value: object) -> float | None:
    """qps/burst: a non-negative number; 0 means the default, as kubeadm writes it."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise _bad(value, "a non-negative number")
    return float(value) or None


def _duration(value: object) -> float:
    if not isinstance(value, str):
        raise _Invalid(f"{_show(value)} is {_NOT_A_DURATION}")
    try:
        return parse_duration(value)
    except ValueError as e:
        raise _Invalid(f"{_show(value)} is {e}") from None


def _sync_period(value: object) -> float | None:
    """0s is unset, as kube-proxy defaults it: kubeadm writes 0s into every mode section."""
    return _duration(value) or None


def _choice(choices: tuple[str, ...]) -> Callable[[object], str | None]:
    def parse(value: object) -> str | None:
        text = _string(value)
        if text and text not in choices:
            raise _bad(value, "one of " + ", ".join(choices))
        return text or None

    return parse


def _mode(value: object) -> str | None:
    text = _string(value)
    if text and text not in MODES:
        raise _Invalid(f"{_show(value)} is not supported: lace-proxy supports nftables and ipvs")
    return text or None


def _ip(value: object) -> str | None:
    text = _string(value)
    if not text:
        return None
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise _bad(value, "an IP address") from None


def _host_port(default_port: int) -> Callable[[object], str | None]:
    """IP:port (IPv6 in brackets); a bare IP gets `default_port`, as kube-proxy does."""

    def parse(value: object) -> str | None:
        text = _string(value)
        if not text:
            return None
        host, sep, port = text.rpartition(":")
        if not sep or (host.count(":") and not host.startswith("[")):
            host, port = text, str(default_port)  # a bare IPv4 or unbracketed IPv6 address
        try:
            ip = ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
        except ValueError:
            raise _bad(value, "an IP:port address (e.g. 0.0.0.0:10256)") from None
        if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            raise _bad(value, "an IP:port address with a port from 1 to 65535")
        return f"[{ip}]:{int(port)}" if ip.version == 6 else f"{ip}:{int(port)}"

    return parse


def _cidr(value: object) -> IPNetwork:
    """A CIDR with a prefix length; host bits are masked off, as Go's ParseCIDR does."""
    if not isinstance(value, str) or "/" not in value:
        raise _bad(value, "a CIDR (e.g. 10.244.0.0/16)")
    try:
        return ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise _bad(value, "a CIDR (e.g. 10.244.0.0/16)") from None


def _cidr_list(value: object) -> tuple[IPNetwork, ...]:
    if not isinstance(value, list):
        raise _bad(value, 'a list of CIDRs (e.g. ["10.96.0.0/12"])')
    networks = []
    for i, item in enumerate(value):
        try:
            networks.append(_cidr(item))
        except _Invalid as e:
            raise _Invalid(e.problem, f"[{i}]") from None
    return tuple(networks)


def _cluster_cidr(value: object) -> tuple[IPNetwork, ...]:
    """kube-proxy's comma-separated string: one CIDR, or an IPv4 and IPv6 dual-stack pair."""
    text = _string(value)
    networks = tuple(_cidr(part.strip()) for part in text.split(",")) if text else ()
    if len(networks) > 2 or (len(networks) == 2 and networks[0].version == networks[1].version):
        raise _bad(value, "one CIDR or a comma-separated IPv4,IPv6 pair")
    return networks


def _node_port_addresses(value: object) -> tuple[IPNetwork, ...] | Literal["primary"]:
    if value == [NODE_PORT_PRIMARY]:
        return NODE_PORT_PRIMARY
    if isinstance(value, list) and NODE_PORT_PRIMARY in value:
        raise _bad(value, f'a list of CIDRs or ["{NODE_PORT_PRIMARY}"] alone')
    return _cidr_list(value)


def _ifname(value: object) -> str:
    text = _string(value)
    if text and (
        len(text.encode()) >= _IFNAMSIZ
        or text in (".", "..")
        or any(c in "/:" or c.isspace() for c in text)
    ):
        raise _bad(value, "a network interface name (at most 15 bytes, no '/', ':' or spaces)")
    return text


def _routing_table(value: object) -> int:
    """A routing table of lace-proxy's own: not unspec (0), default, main or local (253-255)."""
    table = _integer(1, 2**31 - 1)(value)
    if table in (253, 254, 255):
        raise _bad(value, "a routing table other than the kernel's default/main/local (253-255)")
    return table


def _socket_path(value: object) -> str:
    """An absolute path short enough for AF_UNIX (107 bytes), or "" (no socket)."""
    text = _string(value)
    if text and (not text.startswith("/") or len(text.encode()) > 107):
        raise _bad(value, 'an absolute path of at most 107 bytes, or "" for none')
    return text


def _table_name(value: object) -> str:
    text = _string(value)
    if not _TABLE_NAME.fullmatch(text):
        raise _bad(value, "an nftables table name (a letter, then up to 30 of A-Z a-z 0-9 _ -)")
    return text


def _render_networks(networks: tuple[IPNetwork, ...]) -> list[str]:
    return [str(n) for n in networks]


def _render_node_port_addresses(value: tuple[IPNetwork, ...] | str) -> list[str]:
    return [value] if isinstance(value, str) else _render_networks(value)


_DURATION_FIELD = _Field(_duration, format_duration)
_SYNC_PERIOD_FIELD = _Field(_sync_period, format_duration)
_MASQUERADE_ALL_FIELD = _Field(_true_or_unset)
_CIDRS_FIELD = _Field(_cidr_list, _render_networks)

# Keys in the order `to_dict` writes them; leaves' attributes are the keys in snake_case.
_SCHEMA: _Schema = {
    "hostnameOverride": _Field(_hostname),
    "bindAddress": _Field(_ip),
    "healthzBindAddress": _Field(_host_port(10256)),
    "metricsBindAddress": _Field(_host_port(10249)),
    "clusterCIDR": _Field(_cluster_cidr, lambda nets: ",".join(map(str, nets))),
    "detectLocalMode": _Field(_choice(DETECT_LOCAL_MODES)),
    "detectLocal": {
        "bridgeInterface": _Field(_ifname),
        "interfaceNamePrefix": _Field(_ifname),
    },
    "nodePortAddresses": _Field(_node_port_addresses, _render_node_port_addresses),
    "mode": _Field(_mode),
    "masqueradeAll": _MASQUERADE_ALL_FIELD,
    "syncPeriod": _SYNC_PERIOD_FIELD,
    "minSyncPeriod": _SYNC_PERIOD_FIELD,
    "iptables": {
        "masqueradeAll": _MASQUERADE_ALL_FIELD,
        "masqueradeBit": _Field(_integer(0, 31)),
        "localhostNodePorts": _Field(_boolean),
        "minSyncPeriod": _SYNC_PERIOD_FIELD,
        "syncPeriod": _SYNC_PERIOD_FIELD,
    },
    "nftables": {
        "masqueradeAll": _MASQUERADE_ALL_FIELD,
        "masqueradeBit": _Field(_integer(0, 31)),
        "minSyncPeriod": _SYNC_PERIOD_FIELD,
        "syncPeriod": _SYNC_PERIOD_FIELD,
    },
    "ipvs": {
        "scheduler": _Field(_choice(IPVS_SCHEDULERS)),
        "syncPeriod": _SYNC_PERIOD_FIELD,
        "minSyncPeriod": _SYNC_PERIOD_FIELD,
        "strictARP": _Field(_boolean),
        "tcpTimeout": _DURATION_FIELD,
        "tcpFinTimeout": _DURATION_FIELD,
        "udpTimeout": _DURATION_FIELD,
        "excludeCIDRs": _CIDRS_FIELD,
    },
    "clientConnection": {
        "kubeconfig": _Field(_optional_string),
        "acceptContentTypes": _Field(_optional_string),
        "contentType": _Field(_optional_string),
        "qps": _Field(_rate),
        "burst": _Field(lambda v: None if (r := _rate(v)) is None else int(r)),
    },
    "conntrack": {
        "maxPerCore": _Field(_integer(0, 2**31 - 1)),
        "min": _Field(_integer(0, 2**31 - 1)),
        "tcpEstablishedTimeout": _DURATION_FIELD,
        "tcpCloseWaitTimeout": _DURATION_FIELD,
        "tcpBeLiberal": _Field(_boolean),
        "udpTimeout": _DURATION_FIELD,
        "udpStreamTimeout": _DURATION_FIELD,
    },
    "lace": {
        "manifests": _Field(_optional_string),
        "nftables": {
            "table": _Field(_table_name),
            "family": _Field(_choice(NFTABLES_FAMILIES)),
        },
        "serviceCIDRs": _CIDRS_FIELD,
        "routing": {
            "table": _Field(_routing_table),
            "priority": _Field(_integer(1, 32765)),
        },
        "egress": {
            "enabled": _Field(_boolean),
            "table": _Field(_table_name),
            "nonMasqueradeCIDRs": _CIDRS_FIELD,
            "routablePrefixes": _CIDRS_FIELD,
        },
        "stateSocket": _Field(_socket_path),
    },
}

# Top-level fields that fill the same field of these mode sections (see the module docstring).
_SHARED_FIELDS = {
    "syncPeriod": ("nftables", "ipvs"),
    "minSyncPeriod": ("nftables", "ipvs"),
    "masqueradeAll": ("nftables", "iptables"),
}

_T = TypeVar("_T")


def _snake(key: str) -> str:
    """camelCase to snake_case, keeping acronyms whole: clusterCIDR -> cluster_cidr."""
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", key).lower()


def _render(obj: object, schema: _Schema) -> dict[str, object]:
    return {
        key: _render(getattr(obj, _snake(key)), spec)
        if isinstance(spec, Mapping)
        else spec.render(getattr(obj, _snake(key)))
        for key, spec in schema.items()
    }


def _parse(
    raw: Mapping[Any, object], schema: _Schema, source: str, prefix: str, ignored: list[str]
) -> dict[str, Any]:
    """Validate one layer (file or overrides) into {camelCase: value}, dropping unset fields.

    Top-level keys in IGNORED_UPSTREAM_FIELDS are appended to `ignored` instead.
    """
    out: dict[str, Any] = {}
    for key, value in raw.items():
        path = f"{prefix}{key}"
        spec = schema.get(key) if isinstance(key, str) else None
        if spec is None:
            if not prefix and key in IGNORED_UPSTREAM_FIELDS:
                ignored.append(key)
                continue
            raise ConfigError(source, path, _unknown_field(str(key), schema))
        if value is None:
            continue
        if isinstance(spec, Mapping):
            if not isinstance(value, Mapping):
                raise ConfigError(source, path, f"{_show(value)} is not a mapping")
            section = _parse(value, spec, source, f"{path}.", ignored)
            if section:
                out[key] = section
            continue
        try:
            parsed = spec.parse(value)
        except _Invalid as e:
            raise ConfigError(source, path + e.suffix, e.problem) from None
        if parsed is not None:
            out[key] = parsed
    return out


def _unknown_field(key: str, schema: _Schema) -> str:
    known = sorted(schema)
    close = difflib.get_close_matches(key, known, n=1)
    return "unknown field; " + (
        f"did you mean {close[0]}?" if close else f"known: {', '.join(known)}"
    )


def _fill_sections(layer: dict[str, Any]) -> None:
    """Copy a layer's top-level shared fields into its mode sections that leave them unset."""
    for key, sections in _SHARED_FIELDS.items():
        if key in layer:
            for section in sections:
                layer.setdefault(section, {}).setdefault(key, layer[key])


def _merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        merged[key] = _merge(merged.get(key, {}), value) if isinstance(value, dict) else value
    return merged


def _nest(overrides: Mapping[str, object]) -> dict[str, Any]:
    """{"nftables.syncPeriod": v} -> {"nftables": {"syncPeriod": v}}."""
    root: dict[str, Any] = {}
    for dotted, value in overrides.items():
        *parents, leaf = dotted.split(".")
        node = root
        for part in parents:
            child = node.get(part, {})
            if not isinstance(child, Mapping):
                raise ConfigError(_OVERRIDE_SOURCE, dotted, f"{part} is already set to a value")
            node[part] = child = dict(child)  # copied: never change the caller's mapping
            node = child
        if leaf in node:
            raise ConfigError(_OVERRIDE_SOURCE, dotted, "set twice")
        node[leaf] = value
    return root


def _read_file(path: str) -> Mapping[Any, object]:
    """The file's fields, after checking and removing apiVersion and kind."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(path, "", f"cannot read: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise ConfigError(path, "", f"not valid YAML: {e}") from e
    if not isinstance(doc, dict):
        raise ConfigError(path, "", f"expected a {KIND} mapping, got {_show(doc)}")
    doc = dict(doc)
    api_version = doc.pop("apiVersion", None)
    if api_version not in (UPSTREAM_API_VERSION, LACE_API_VERSION):
        expected = f"{UPSTREAM_API_VERSION} or {LACE_API_VERSION}"
        raise ConfigError(path, "apiVersion", f"{_show(api_version)} is not {expected}")
    kind = doc.pop("kind", None)
    if kind != KIND:
        raise ConfigError(path, "kind", f"{_show(kind)} is not {KIND}")
    return doc


def _layer(source: str, raw: Mapping[Any, object]) -> dict[str, Any]:
    """One source's validated fields, its top-level shared fields copied into its sections."""
    ignored: list[str] = []
    layer = _parse(raw, _SCHEMA, source, "", ignored)
    ignored += [f"iptables.{key}" for key in IPTABLES_MODE_ONLY if key in layer.get("iptables", {})]
    if ignored:
        log.warning(
            "%s: ignoring kube-proxy fields that do not apply to lace-proxy: %s",
            source,
            ", ".join(ignored),
        )
    _fill_sections(layer)
    return layer


def _section(cls: type[_T], values: Mapping[str, object]) -> _T:
    return cls(**{_snake(key): value for key, value in values.items()})


def _default_hostname(source: str) -> str:
    hostname = socket.gethostname().strip().lower()
    if not hostname:
        raise ConfigError(source, "hostnameOverride", "unset, and the machine's hostname is empty")
    return hostname


def load_config(path: str | None, overrides: Mapping[str, object] | None = None) -> ProxyConfig:
    """Read the file at `path` (None: defaults only) and apply `overrides` on top.

    `overrides` maps dotted camelCase paths ("nftables.minSyncPeriod") to values typed as in
    YAML, validated like the file's. Raises ConfigError; logs ignored upstream fields.
    """
    from_file = _layer(path, _read_file(path)) if path is not None else {}
    merged = _merge(from_file, _layer(_OVERRIDE_SOURCE, _nest(overrides or {})))
    source = path if path is not None else _OVERRIDE_SOURCE

    iptables = _section(IPTablesConfig, merged.pop("iptables", {}))
    nftables = _section(NFTablesConfig, merged.pop("nftables", {}))
    ipvs = _section(IPVSConfig, merged.pop("ipvs", {}))
    lace = merged.pop("lace", {})
    top = {
        "iptables": iptables,
        "nftables": nftables,
        "ipvs": ipvs,
        "detect_local": _section(DetectLocalConfig, merged.pop("detectLocal", {})),
        "conntrack": _section(ConntrackConfig, merged.pop("conntrack", {})),
        "client_connection": _section(ClientConnectionConfig, merged.pop("clientConnection", {})),
        "lace": LaceConfig(
            nftables=_section(LaceNFTablesConfig, lace.pop("nftables", {})),
            routing=_section(LaceRoutingConfig, lace.pop("routing", {})),
            egress=_section(LaceEgressConfig, lace.pop("egress", {})),
            **{_snake(key): value for key, value in lace.items()},
        ),
        **{_snake(key): value for key, value in merged.items()},
    }
    if "hostname_override" not in top:
        top["hostname_override"] = _default_hostname(source)
    if ipaddress.ip_address(top.get("bind_address", "0.0.0.0")).version == 6:
        top.setdefault("healthz_bind_address", "[::]:10256")
        top.setdefault("metrics_bind_address", "[::1]:10249")
    mode = top.setdefault("mode", "nftables")
    active = nftables if mode == "nftables" else ipvs
    top["sync_period"] = active.sync_period
    top["min_sync_period"] = active.min_sync_period
    top["masquerade_all"] = (iptables if mode == "ipvs" else nftables).masquerade_all
    config = ProxyConfig(**top)
    _check(config, source)
    return config


def _check(config: ProxyConfig, source: str) -> None:
    """Rules across fields, which no single field's parser can see."""
    if config.lace.egress.table == config.lace.nftables.table:
        raise ConfigError(
            source,
            "lace.egress.table",
            f"{config.lace.egress.table!r} is lace.nftables.table too: the egress SNAT table "
            "is rewritten whole, so it needs a name of its own",
        )
    if config.min_sync_period > config.sync_period:
        raise ConfigError(
            source,
            f"{config.mode}.minSyncPeriod",
            f"{format_duration(config.min_sync_period)} is longer than the syncPeriod "
            f"({format_duration(config.sync_period)})",
        )
    required = {
        "BridgeInterface": ("bridgeInterface", config.detect_local.bridge_interface),
        "InterfaceNamePrefix": ("interfaceNamePrefix", config.detect_local.interface_name_prefix),
    }
    if config.detect_local_mode in required:
        key, value = required[config.detect_local_mode]
        if not value:
            raise ConfigError(
                source,
                f"detectLocal.{key}",
                f"required by detectLocalMode {config.detect_local_mode}",
            )


# flag -> (dotted field path, metavar, help); --masquerade-all is a switch.
_FLAGS: dict[str, tuple[str, str | None, str]] = {
    "--hostname-override": (
        "hostnameOverride",
        "NAME",
        "name of this node (default: the machine's hostname, lowercased)",
    ),
    "--bind-address": (
        "bindAddress",
        "IP",
        "this node's primary IP; an IPv6 one makes the healthz/metrics defaults IPv6 "
        "(default: 0.0.0.0)",
    ),
    "--cluster-cidr": (
        "clusterCIDR",
        "CIDRS",
        "pod CIDR of the cluster, or a comma-separated IPv4,IPv6 pair; used by "
        "detect-local mode ClusterCIDR",
    ),
    "--nodeport-addresses": (
        "nodePortAddresses",
        "CIDRS",
        "comma-separated CIDRs of the node IPs that accept NodePorts, or 'primary' for the "
        "Node's primary IPs (default: all local IPs)",
    ),
    "--proxy-mode": ("mode", "MODE", "nftables or ipvs (default: nftables)"),
    "--masquerade-all": (
        "masqueradeAll",
        None,
        "SNAT all traffic to service IPs (some CNI plugins need it)",
    ),
    "--sync-period": (
        "syncPeriod",
        "DURATION",
        "how often to resync all rules, e.g. 30s, 1m (default: 30s); beats the file's "
        "nftables/ipvs.syncPeriod too",
    ),
    "--min-sync-period": (
        "minSyncPeriod",
        "DURATION",
        "least time between two resyncs, e.g. 1s, 500ms (default: 1s); beats the file's "
        "nftables/ipvs.minSyncPeriod too",
    ),
    "--healthz-bind-address": (
        "healthzBindAddress",
        "IP:PORT",
        "where to serve /healthz (default: 0.0.0.0:10256)",
    ),
    "--metrics-bind-address": (
        "metricsBindAddress",
        "IP:PORT",
        "where to serve /metrics (default: 127.0.0.1:10249)",
    ),
    "--state-socket": (
        "lace.stateSocket",
        "PATH",
        "where to answer `lace-proxy services` and `endpoints` (read-only, root only; "
        "'' for nowhere; default: /run/lace-proxy/state.sock)",
    ),
    "--manifests": (
        "lace.manifests",
        "PATH",
        "serve the Services and EndpointSlices in these manifests",
    ),
}


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """Add --config and the flags that override its most common fields."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        help=f"a {KIND} YAML file (apiVersion {UPSTREAM_API_VERSION} or {LACE_API_VERSION}); "
        "the flags below override it",
    )
    for flag, (path, metavar, help_text) in _FLAGS.items():
        help_text += f" [file: {path}]"
        if metavar is None:
            parser.add_argument(flag, action="store_true", default=None, help=help_text)
        else:
            parser.add_argument(flag, metavar=metavar, help=help_text)


def config_from_args(ns: argparse.Namespace) -> ProxyConfig:
    """Load --config with the given flags applied; errors name the offending flag."""
    overrides: dict[str, object] = {}
    for flag, (path, _, _) in _FLAGS.items():
        value = getattr(ns, flag[2:].replace("-", "_"))
        if value is None:
            continue
        if path == "nodePortAddresses":
            value = [part.strip() for part in value.split(",")] if value else []
        overrides[path] = value
    try:
        return load_config(ns.config, overrides)
    except ConfigError as e:
        if e.source != _OVERRIDE_SOURCE:
            raise
        flags = {path: flag for flag, (path, _, _) in _FLAGS.items()}
        raise ConfigError(flags.get(e.path.split("[")[0], "flags"), e.path, e.problem) from e
