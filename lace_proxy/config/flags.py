"""The command-line flags that override the configuration file's most common fields."""

from __future__ import annotations

import argparse

from lace_proxy.config.errors import ConfigError
from lace_proxy.config.load import OVERRIDE_SOURCE, load_config
from lace_proxy.config.settings import KIND, LACE_API_VERSION, UPSTREAM_API_VERSION, ProxyConfig

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
        "the sync rate limit: a sync per DURATION, two back to back at most (the "
        "periodic full sync and a change), e.g. 1s, 500ms (default: 1s); beats the file's "
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
        if e.source != OVERRIDE_SOURCE:
            raise
        flags = {path: flag for flag, (path, _, _) in _FLAGS.items()}
        raise ConfigError(flags.get(e.path.split("[")[0], "flags"), e.path, e.problem) from e
