"""The configuration's schema: every field of the file, how its value is read and validated
(`parse_fields`) and how `ProxyConfig.to_dict` writes it back (`render`).

A field's parser returns None for "unset" (null and Go zero values, as kube-proxy defaults
them) and raises `ConfigError` naming the source, the dotted field path and the value.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

from lace_proxy.config.bgp import CLUSTER_IP_MODES, BgpPeer, password_problem
from lace_proxy.config.duration import NOT_A_DURATION, format_duration, parse_duration
from lace_proxy.config.errors import ConfigError
from lace_proxy.model.service import IPVS_SCHEDULERS

MODES = ("nftables", "ipvs")
DETECT_LOCAL_MODES = ("ClusterCIDR", "NodeCIDR", "InterfaceNamePrefix", "BridgeInterface")
#: The nodePortAddresses value that means "only the Node object's primary IPs" (kube-proxy 1.29+).
NODE_PORT_PRIMARY: Final = "primary"
NFTABLES_FAMILIES = ("inet", "ip", "ip6")
#: lace.ipvs.serviceAddresses: the dummy interface's addresses, or local routes.
SERVICE_ADDRESSES = ("interface", "localRoutes")

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

_TABLE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,30}")
_IFNAMSIZ = 16  # Linux interface names are at most 15 bytes plus NUL


class _Invalid(Exception):
    """A value's problem, before the caller adds where it is; `suffix` locates a list item."""

    def __init__(self, problem: str, suffix: str = "") -> None:
        super().__init__(problem)
        self.problem = problem
        self.suffix = suffix


def show(value: object) -> str:
    """A value as the operator wrote it (JSON is also YAML), cut short if long."""
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def _bad(value: object, expected: str) -> _Invalid:
    return _Invalid(f"{show(value)} is not {expected}")


def _identity(value: Any) -> object:
    return value


@dataclass(frozen=True, slots=True)
class _Field:
    """How to read a leaf field (None: unset) and how `to_dict` writes it back."""

    parse: Callable[[object], object | None]
    render: Callable[[Any], object] = _identity


Schema: TypeAlias = Mapping[str, "_Field | Schema"]


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
        raise _Invalid(f"{show(value)} is {NOT_A_DURATION}")
    try:
        return parse_duration(value)
    except ValueError as e:
        raise _Invalid(f"{show(value)} is {e}") from None


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
        raise _Invalid(f"{show(value)} is not supported: lace-proxy supports nftables and ipvs")
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


def _within(suffix: str, parse: Callable[[object], Any], value: object) -> Any:
    """`parse(value)`, its error located at `suffix` (a list item's field)."""
    try:
        return parse(value)
    except _Invalid as e:
        raise _Invalid(e.problem, suffix + e.suffix) from None


def _router_id(value: object) -> str | None:
    text = _string(value)
    if not text:
        return None
    try:
        return str(ipaddress.IPv4Address(text))
    except ValueError:
        raise _bad(value, "an IPv4 address (a BGP router id)") from None


def _hold_time(value: object) -> float:
    seconds = _duration(value)
    if not 3 <= seconds <= 65535:
        raise _bad(value, "3s to 65535s (a BGP hold time)")
    return seconds


def _peer_address(value: object) -> str | None:
    """A router's address: no IPv6 zone (BIRD takes none), IPv4-mapped IPv6 as IPv4."""
    text = _ip(value)
    if text is None:
        return None
    ip = ipaddress.ip_address(text)
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id is not None:
        raise _bad(value, "an address without a zone (%...)")
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return str(mapped or ip)


def _speaker_directory(value: object) -> str:
    """Where BIRD's files go: an absolute path of printable ASCII without quotes or
    backslashes (it is written into BIRD's configuration), short enough for its control
    socket (bird.ctl) in it to fit AF_UNIX's 107 bytes."""
    text = _string(value)
    if (
        not text.startswith("/")
        or len(text) > 98
        or not all(" " <= c <= "~" and c not in '"\\' for c in text)
    ):
        raise _bad(value, "an absolute path of at most 98 printable ASCII characters, no quotes")
    return text


def _restart_time(value: object) -> float:
    seconds = _duration(value)
    if not 1 <= seconds <= 4095:
        raise _bad(value, "1s to 4095s (a BGP graceful restart time)")
    return seconds


def _password(value: object) -> str:
    """A TCP MD5 key (config.bgp.password_problem)."""
    text = _string(value)
    if (problem := password_problem(text)) is not None:
        raise _Invalid(problem)
    return text


def _password_file(value: object) -> str:
    """The file a TCP MD5 key is read from (a mounted Secret's): an absolute path, or ""."""
    text = _string(value)
    if text and (not text.startswith("/") or "\0" in text):
        raise _bad(value, "an absolute path (a mounted Secret's key, say)")
    return text


def _labels(value: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise _bad(value, "a mapping of Node label names to values")
    return tuple(sorted(value.items()))


def _asn(value: object) -> int | None:
    """An AS number (4 bytes); 0 is unset, as Go's zero value."""
    return _integer(0, 2**32 - 1)(value) or None


#: A peer's fields: their parsers, and whether one must be set.
_PEER_FIELDS: dict[str, tuple[Callable[[object], Any], bool]] = {
    "address": (_peer_address, True),
    "asn": (_asn, True),
    "port": (_integer(1, 65535), False),
    "password": (_password, False),
    "passwordFile": (_password_file, False),
    "holdTime": (_hold_time, False),
    "nodeSelector": (_labels, False),
}


def _bgp_peers(value: object) -> tuple[BgpPeer, ...]:
    """lace.bgp.peers: a list of routers, each a mapping of _PEER_FIELDS, no address twice."""
    if not isinstance(value, list):
        raise _bad(value, "a list of peers")
    peers: list[BgpPeer] = []
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise _Invalid(f"{show(item)} is not a mapping", f"[{i}]")
        fields: dict[str, Any] = {}
        for key, raw in item.items():
            if key not in _PEER_FIELDS:
                raise _Invalid(_unknown_field(str(key), _PEER_FIELDS), f"[{i}].{key}")
            parsed = _within(f"[{i}].{key}", _PEER_FIELDS[key][0], raw)
            if parsed is not None:
                fields[snake(key)] = parsed
        for key, (_, required) in _PEER_FIELDS.items():
            if required and snake(key) not in fields:
                raise _Invalid("is required", f"[{i}].{key}")
        if fields.get("password") and fields.get("password_file"):
            raise _Invalid("set password or passwordFile, not both", f"[{i}].passwordFile")
        if any(p.address == fields["address"] for p in peers):
            raise _Invalid(f"{show(item['address'])} is a peer already", f"[{i}].address")
        peers.append(BgpPeer(**fields))
    return tuple(peers)


def _render_peers(peers: tuple[BgpPeer, ...]) -> list[dict[str, object]]:
    return [
        {
            "address": p.address,
            "asn": p.asn,
            "port": p.port,
            "password": p.password,
            "passwordFile": p.password_file,
            "holdTime": format_duration(p.hold_time),
            "nodeSelector": dict(p.node_selector),
        }
        for p in peers
    ]


def _render_networks(networks: tuple[IPNetwork, ...]) -> list[str]:
    return [str(n) for n in networks]


def _render_node_port_addresses(value: tuple[IPNetwork, ...] | str) -> list[str]:
    return [value] if isinstance(value, str) else _render_networks(value)


_DURATION_FIELD = _Field(_duration, format_duration)
_SYNC_PERIOD_FIELD = _Field(_sync_period, format_duration)
_MASQUERADE_ALL_FIELD = _Field(_true_or_unset)
_CIDRS_FIELD = _Field(_cidr_list, _render_networks)

# Keys in the order `to_dict` writes them; leaves' attributes are the keys in snake_case.
SCHEMA: Schema = {
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
        "ipvs": {
            "serviceAddresses": _Field(_choice(SERVICE_ADDRESSES)),
        },
        "egress": {
            "enabled": _Field(_boolean),
            "table": _Field(_table_name),
            "nonMasqueradeCIDRs": _CIDRS_FIELD,
            "routablePrefixes": _CIDRS_FIELD,
        },
        "stateSocket": _Field(_socket_path),
        "bgp": {
            "enabled": _Field(_boolean),
            "asn": _Field(_asn),
            "routerID": _Field(_router_id),
            "peers": _Field(_bgp_peers, _render_peers),
            "announce": {
                "loadBalancerIPs": _Field(_boolean),
                "externalIPs": _Field(_boolean),
                "clusterIPs": _Field(_choice(CLUSTER_IP_MODES)),
            },
            "gracefulRestartTime": _Field(_restart_time, format_duration),
            "directory": _Field(_speaker_directory),
        },
    },
}


def snake(key: str) -> str:
    """camelCase to snake_case, keeping acronyms whole: clusterCIDR -> cluster_cidr."""
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", key).lower()


def render(obj: object, schema: Schema) -> dict[str, object]:
    """The settings object `obj` as the file's camelCase mapping, in the schema's order."""
    return {
        key: render(getattr(obj, snake(key)), spec)
        if isinstance(spec, Mapping)
        else spec.render(getattr(obj, snake(key)))
        for key, spec in schema.items()
    }


def parse_fields(
    raw: Mapping[Any, object], schema: Schema, source: str, prefix: str, ignored: list[str]
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
                raise ConfigError(source, path, f"{show(value)} is not a mapping")
            section = parse_fields(value, spec, source, f"{path}.", ignored)
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


def _unknown_field(key: str, schema: Collection[str]) -> str:
    known = sorted(schema)
    close = difflib.get_close_matches(key, known, n=1)
    return "unknown field; " + (
        f"did you mean {close[0]}?" if close else f"known: {', '.join(known)}"
    )
