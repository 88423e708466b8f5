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

Modules: `schema` (every field: how it is read, validated and written back), `duration` (Go
durations), `settings` (`ProxyConfig` and its sections), `load` (`load_config`: the layers
merged and checked across fields), `flags` (the command line), `errors` (`ConfigError`).
"""

from lace_proxy.config.duration import format_duration, parse_duration
from lace_proxy.config.errors import ConfigError
from lace_proxy.config.flags import add_config_flags, config_from_args
from lace_proxy.config.load import load_config
from lace_proxy.config.schema import (
    DETECT_LOCAL_MODES,
    IGNORED_UPSTREAM_FIELDS,
    MODES,
    NFTABLES_FAMILIES,
    NODE_PORT_PRIMARY,
    SERVICE_ADDRESSES,
    IPNetwork,
)
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

__all__ = [
    "DETECT_LOCAL_MODES",
    "IGNORED_UPSTREAM_FIELDS",
    "IPTABLES_MODE_ONLY",
    "KIND",
    "LACE_API_VERSION",
    "MODES",
    "NFTABLES_FAMILIES",
    "NODE_PORT_PRIMARY",
    "SERVICE_ADDRESSES",
    "UPSTREAM_API_VERSION",
    "ClientConnectionConfig",
    "ConfigError",
    "ConntrackConfig",
    "DetectLocalConfig",
    "IPNetwork",
    "IPTablesConfig",
    "IPVSConfig",
    "LaceConfig",
    "LaceEgressConfig",
    "LaceIPVSConfig",
    "LaceNFTablesConfig",
    "LaceRoutingConfig",
    "NFTablesConfig",
    "ProxyConfig",
    "add_config_flags",
    "config_from_args",
    "format_duration",
    "load_config",
    "parse_duration",
]
