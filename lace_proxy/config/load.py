"""`load_config`: the file and the overrides read through the schema, layered (see the
package docstring for the order), converted into a `ProxyConfig` and checked across fields."""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Mapping
from typing import Any, TypeVar

import yaml

from lace_proxy.config.bgp import LaceBgpAnnounceConfig, LaceBgpConfig
from lace_proxy.config.duration import format_duration
from lace_proxy.config.errors import ConfigError
from lace_proxy.config.schema import SCHEMA, parse_fields, show, snake
from lace_proxy.config.settings import (
    IPTABLES_MODE_ONLY,
    KIND,
    LACE_API_VERSION,
    UPSTREAM_API_VERSION,
    ClientConnectionConfig,
    ConntrackConfig,
    DetectLocalConfig,
    IPTablesConfig,
    IPVSConfig,
    LaceConfig,
    LaceEgressConfig,
    LaceIPVSConfig,
    LaceNFTablesConfig,
    LaceRoutingConfig,
    NFTablesConfig,
    ProxyConfig,
)

log = logging.getLogger(__name__)

#: The source `ConfigError` names for a problem in `load_config`'s overrides.
OVERRIDE_SOURCE = "override"

# Top-level fields that fill the same field of these mode sections (see the package docstring).
_SHARED_FIELDS = {
    "syncPeriod": ("nftables", "ipvs"),
    "minSyncPeriod": ("nftables", "ipvs"),
    "masqueradeAll": ("nftables", "iptables"),
}

_T = TypeVar("_T")


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
                raise ConfigError(OVERRIDE_SOURCE, dotted, f"{part} is already set to a value")
            node[part] = child = dict(child)  # copied: never change the caller's mapping
            node = child
        if leaf in node:
            raise ConfigError(OVERRIDE_SOURCE, dotted, "set twice")
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
        raise ConfigError(path, "", f"expected a {KIND} mapping, got {show(doc)}")
    doc = dict(doc)
    api_version = doc.pop("apiVersion", None)
    if api_version not in (UPSTREAM_API_VERSION, LACE_API_VERSION):
        expected = f"{UPSTREAM_API_VERSION} or {LACE_API_VERSION}"
        raise ConfigError(path, "apiVersion", f"{show(api_version)} is not {expected}")
    kind = doc.pop("kind", None)
    if kind != KIND:
        raise ConfigError(path, "kind", f"{show(kind)} is not {KIND}")
    return doc


def _layer(source: str, raw: Mapping[Any, object]) -> dict[str, Any]:
    """One source's validated fields, its top-level shared fields copied into its sections."""
    ignored: list[str] = []
    layer = parse_fields(raw, SCHEMA, source, "", ignored)
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
    return cls(**{snake(key): value for key, value in values.items()})


def _bgp_section(values: dict[str, Any]) -> LaceBgpConfig:
    announce = _section(LaceBgpAnnounceConfig, values.pop("announce", {}))
    return LaceBgpConfig(announce=announce, **{snake(k): v for k, v in values.items()})


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
    merged = _merge(from_file, _layer(OVERRIDE_SOURCE, _nest(overrides or {})))
    source = path if path is not None else OVERRIDE_SOURCE

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
            ipvs=_section(LaceIPVSConfig, lace.pop("ipvs", {})),
            egress=_section(LaceEgressConfig, lace.pop("egress", {})),
            bgp=_bgp_section(lace.pop("bgp", {})),
            **{snake(key): value for key, value in lace.items()},
        ),
        **{snake(key): value for key, value in merged.items()},
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
    bgp = config.lace.bgp
    if bgp.enabled:
        for key, missing in (
            ("asn", not bgp.asn),
            ("peers", not bgp.peers),
            ("directory", not bgp.directory),
        ):
            if missing:
                raise ConfigError(source, f"lace.bgp.{key}", "required when lace.bgp.enabled")
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
