"""Configuration loading: defaults, the file, flags on top, and errors that name the field."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import re
import socket
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from lace_proxy import config as cfg
from lace_proxy.app import nftables_settings
from lace_proxy.config import (
    LACE_API_VERSION,
    UPSTREAM_API_VERSION,
    ClientConnectionConfig,
    ConfigError,
    ProxyConfig,
    add_config_flags,
    config_from_args,
    format_duration,
    load_config,
    parse_duration,
)

net = ipaddress.ip_network
Writer = Callable[..., str]  # write(body, api_version=...) -> the file's name


@pytest.fixture(autouse=True)
def hostname(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fixed machine hostname, mixed-case to show it is lowercased like kube-proxy does."""
    monkeypatch.setattr(socket, "gethostname", lambda: "Node-A.Example\n")


@pytest.fixture
def write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Writer:
    """Write config.yaml (relative, so messages read "config.yaml: ...") and return its name."""
    monkeypatch.chdir(tmp_path)

    def write(body: str, api_version: str = UPSTREAM_API_VERSION) -> str:
        header = f"apiVersion: {api_version}\nkind: KubeProxyConfiguration\n"
        Path("config.yaml").write_text(header + textwrap.dedent(body))
        return "config.yaml"

    return write


def parse_flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    return parser.parse_args(argv)


# --- defaults and the file ---------------------------------------------------------------


def test_defaults_are_kube_proxys() -> None:
    c = load_config(None)
    assert c == ProxyConfig(hostname_override="node-a.example")
    assert (c.bind_address, c.healthz_bind_address, c.metrics_bind_address) == (
        "0.0.0.0",
        "0.0.0.0:10256",
        "127.0.0.1:10249",
    )
    assert (c.mode, c.detect_local_mode, c.cluster_cidr, c.node_port_addresses) == (
        "nftables",
        "ClusterCIDR",
        (),
        (),
    )
    assert (c.masquerade_all, c.sync_period, c.min_sync_period) == (False, 30.0, 1.0)
    assert (c.nftables.masquerade_bit, c.ipvs.scheduler) == (14, "rr")
    assert (c.conntrack.max_per_core, c.conntrack.min) == (32768, 131072)
    assert (c.conntrack.tcp_established_timeout, c.conntrack.tcp_close_wait_timeout) == (
        86400.0,
        3600.0,
    )
    assert (c.lace.manifests, c.lace.nftables.table, c.lace.nftables.family) == (
        None,
        "lace-proxy",
        "inet",
    )
    assert c.lace.ipvs.service_addresses == "interface"  # kube-proxy's dummy interface


def test_empty_machine_hostname_without_override_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: " ")
    with pytest.raises(ConfigError, match="hostnameOverride: unset"):
        load_config(None)
    assert load_config(None, {"hostnameOverride": "n1"}).hostname_override == "n1"


def test_full_file(write: Writer) -> None:
    path = write(
        """\
        hostnameOverride: Worker-1
        bindAddress: 10.0.0.5
        healthzBindAddress: 10.0.0.5:8080
        metricsBindAddress: "[::1]:9090"
        clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
        detectLocalMode: InterfaceNamePrefix
        detectLocal: {bridgeInterface: cbr0, interfaceNamePrefix: veth}
        nodePortAddresses: [10.0.0.0/8, "fd00::/64"]
        mode: ipvs
        masqueradeAll: true
        nftables: {masqueradeAll: true, masqueradeBit: 13, minSyncPeriod: 2s, syncPeriod: 1m}
        ipvs:
          scheduler: wlc
          syncPeriod: 45s
          minSyncPeriod: 500ms
          strictARP: true
          tcpTimeout: 15m
          tcpFinTimeout: 2m
          udpTimeout: 5m
          excludeCIDRs: [192.168.0.0/24]
        conntrack:
          maxPerCore: 0
          min: 1000
          tcpEstablishedTimeout: 12h
          tcpCloseWaitTimeout: 30m
          tcpBeLiberal: true
          udpTimeout: 30s
          udpStreamTimeout: 2m
        lace:
          manifests: /etc/lace/manifests
          nftables: {table: lace_test, family: ip}
          serviceCIDRs: [10.96.0.0/12, "fd00:10:96::/112"]
          routing: {table: 300, priority: 900}
          ipvs: {serviceAddresses: localRoutes}
        """,
        LACE_API_VERSION,
    )
    c = load_config(path)
    assert c.hostname_override == "worker-1"
    assert (c.bind_address, c.healthz_bind_address, c.metrics_bind_address) == (
        "10.0.0.5",
        "10.0.0.5:8080",
        "[::1]:9090",
    )
    assert c.cluster_cidr == (net("10.244.0.0/16"), net("fd00:10:244::/56"))
    assert c.detect_local_mode == "InterfaceNamePrefix"
    assert c.detect_local == cfg.DetectLocalConfig("cbr0", "veth")
    assert c.node_port_addresses == (net("10.0.0.0/8"), net("fd00::/64"))
    assert (c.mode, c.masquerade_all, c.sync_period, c.min_sync_period) == ("ipvs", True, 45, 0.5)
    assert c.nftables == cfg.NFTablesConfig(True, 13, 2.0, 60.0)
    assert c.ipvs == cfg.IPVSConfig(
        "wlc", 45.0, 0.5, True, 900.0, 120.0, 300.0, (net("192.168.0.0/24"),)
    )
    assert c.conntrack == cfg.ConntrackConfig(0, 1000, 43200.0, 1800.0, True, 30.0, 120.0)
    assert c.lace == cfg.LaceConfig(
        "/etc/lace/manifests",
        cfg.LaceNFTablesConfig("lace_test", "ip"),
        (net("10.96.0.0/12"), net("fd00:10:96::/112")),
        cfg.LaceRoutingConfig(300, 900),
        cfg.LaceIPVSConfig("localRoutes"),
    )


def test_cidrs_are_canonical_networks(write: Writer) -> None:
    c = load_config(write("clusterCIDR: ' 10.244.1.7/16 , FD00:0::1/64'\n"))
    assert c.cluster_cidr == (net("10.244.0.0/16"), net("fd00::/64"))


def test_primary_node_port_addresses(write: Writer) -> None:
    assert load_config(write("nodePortAddresses: [primary]\n")).node_port_addresses == "primary"


def test_ipv6_bind_address_makes_the_server_defaults_ipv6() -> None:
    c = load_config(None, {"bindAddress": "fd00::0005"})
    assert (c.bind_address, c.healthz_bind_address, c.metrics_bind_address) == (
        "fd00::5",
        "[::]:10256",
        "[::1]:10249",
    )


@pytest.mark.parametrize(
    ("given", "expected"),
    [("10.0.0.1", "10.0.0.1:10256"), ("fd00::1", "[fd00::1]:10256"), ("[::]:99", "[::]:99")],
)
def test_bind_address_without_port_gets_the_default_port(given: str, expected: str) -> None:
    assert load_config(None, {"healthzBindAddress": given}).healthz_bind_address == expected


KUBEADM_CONFIGMAP = """\
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection: {acceptContentTypes: "", burst: 0, contentType: "", kubeconfig: /k.conf, qps: 0}
clusterCIDR: 10.244.0.0/16
configSyncPeriod: 0s
conntrack:
  maxPerCore: null
  min: null
  tcpBeLiberal: false
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal: {bridgeInterface: "", interfaceNamePrefix: ""}
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables: {localhostNodePorts: null, masqueradeAll: false, masqueradeBit: null, syncPeriod: 0s}
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
logging: {flushFrequency: 0, verbosity: 0}
metricsBindAddress: ""
mode: ""
nftables: {masqueradeAll: false, masqueradeBit: null, minSyncPeriod: 0s, syncPeriod: 0s}
nodePortAddresses: null
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
winkernel: {enableDSR: false, networkName: "", sourceVip: ""}
"""


def test_kubeadm_configmap_zero_values_mean_defaults(
    write: Writer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="lace_proxy.config"):
        c = load_config(write(KUBEADM_CONFIGMAP))
    assert c == ProxyConfig(
        hostname_override="node-a.example",
        cluster_cidr=(net("10.244.0.0/16"),),
        client_connection=ClientConnectionConfig(kubeconfig="/k.conf"),
    )
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        "config.yaml: ignoring kube-proxy fields that do not apply to lace-proxy: "
        "bindAddressHardFail, configSyncPeriod, enableProfiling, "
        "logging, oomScoreAdj, portRange, showHiddenMetricsForVersion, winkernel"
    )


def test_ignored_upstream_field_warns_instead_of_failing(
    write: Writer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="lace_proxy.config"):
        c = load_config(write("featureGates: {Foo: true}\noomScoreAdj: -999\nmode: ipvs\n"))
    assert c.mode == "ipvs"
    assert "featureGates, oomScoreAdj" in caplog.text
    assert caplog.records[0].levelno == logging.WARNING


def test_no_warning_without_ignored_fields(write: Writer, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="lace_proxy.config"):
        load_config(write("mode: ipvs\n"))
    assert caplog.records == []


def test_to_dict_round_trips_through_a_file(write: Writer) -> None:
    original = load_config(
        None,
        {
            "clusterCIDR": "10.244.0.0/16,fd00::/56",
            "nodePortAddresses": ["primary"],
            "mode": "ipvs",
            "ipvs.syncPeriod": "1h2m3.5s",
            "ipvs.excludeCIDRs": ["10.1.0.0/16"],
            "conntrack.udpTimeout": "250ms",
            "lace.manifests": "/m",
            "lace.ipvs.serviceAddresses": "localRoutes",
        },
    )
    rendered = original.to_dict()
    assert rendered["apiVersion"] == LACE_API_VERSION
    assert rendered["clusterCIDR"] == "10.244.0.0/16,fd00::/56"
    assert rendered["nodePortAddresses"] == ["primary"]
    assert rendered["syncPeriod"] == "1h2m3.5s"
    assert rendered["ipvs"]["excludeCIDRs"] == ["10.1.0.0/16"]  # type: ignore[index]
    assert rendered["lace"]["ipvs"] == {"serviceAddresses": "localRoutes"}  # type: ignore[index]
    Path("printed.yaml").write_text(yaml.safe_dump(rendered, allow_unicode=True))
    assert load_config("printed.yaml") == original


# --- where syncPeriod, minSyncPeriod and masqueradeAll come from -------------------------


@pytest.mark.parametrize(
    ("body", "overrides", "sync_period"),
    [
        ("syncPeriod: 10s\n", {}, 10.0),  # top level fills the section
        ("syncPeriod: 10s\nnftables: {syncPeriod: 20s}\n", {}, 20.0),  # the section wins
        ("nftables: {syncPeriod: 0s}\nsyncPeriod: 10s\n", {}, 10.0),  # 0s is unset
        ("ipvs: {syncPeriod: 20s}\n", {}, 30.0),  # another mode's section does not apply
        ("nftables: {syncPeriod: 20s}\n", {"syncPeriod": "5s"}, 5.0),  # a flag beats the file
        ("", {"syncPeriod": "5s", "nftables.syncPeriod": "6s"}, 6.0),  # section flag wins
    ],
)
def test_sync_period_precedence(
    write: Writer,
    body: str,
    overrides: dict[str, object],
    sync_period: float,
) -> None:
    c = load_config(write(body), overrides)
    assert c.sync_period == c.nftables.sync_period == sync_period


def test_top_level_values_fill_both_mode_sections() -> None:
    c = load_config(None, {"mode": "ipvs", "syncPeriod": "1m", "minSyncPeriod": "2s"})
    assert (c.sync_period, c.min_sync_period) == (60.0, 2.0)
    assert (c.ipvs.sync_period, c.nftables.sync_period) == (60.0, 60.0)


def test_masquerade_all_follows_the_mode(write: Writer) -> None:
    nft_only = write("nftables: {masqueradeAll: true}\n")
    assert load_config(nft_only).masquerade_all is True
    assert load_config(nft_only, {"mode": "ipvs"}).masquerade_all is False
    top = write("masqueradeAll: true\nnftables: {masqueradeAll: false}\n")
    assert load_config(top).masquerade_all is True  # false is unset, as in kube-proxy
    assert load_config(top, {"mode": "ipvs"}).masquerade_all is True


def test_ipvs_mode_reads_masquerade_settings_from_iptables_as_kube_proxy(write: Writer) -> None:
    """kube-proxy's v1alpha1 conversion: masqueradeAll from nftables in nftables mode, from
    iptables in every other mode; its IPVS mode marks with iptables.masqueradeBit."""
    path = write("mode: ipvs\niptables: {masqueradeAll: true, masqueradeBit: 12}\n")
    c = load_config(path)
    assert (c.masquerade_all, c.masquerade_bit) == (True, 12)
    assert nftables_settings(c).masquerade_all is True
    assert nftables_settings(c).masquerade_bit == 12
    nft = load_config(path, {"mode": "nftables"})
    assert (nft.masquerade_all, nft.masquerade_bit) == (False, 14)
    both = write("iptables: {masqueradeAll: true}\nnftables: {masqueradeBit: 9}\n")
    assert (load_config(both).masquerade_all, load_config(both).masquerade_bit) == (False, 9)
    ipvs = load_config(both, {"mode": "ipvs"})
    assert (ipvs.masquerade_all, ipvs.masquerade_bit) == (True, 14)
    # The flag (top level) fills the section of either mode.
    assert load_config(None, {"mode": "ipvs", "masqueradeAll": True}).iptables.masquerade_all


def test_iptables_mode_fields_are_accepted_with_a_warning(
    write: Writer, caplog: pytest.LogCaptureFixture
) -> None:
    body = "mode: ipvs\niptables: {syncPeriod: 10s, localhostNodePorts: false}\n"
    with caplog.at_level(logging.WARNING, logger="lace_proxy.config"):
        c = load_config(write(body))
    assert c.sync_period == 30.0  # IPVS mode's is ipvs.syncPeriod, as in kube-proxy
    assert "iptables.localhostNodePorts, iptables.syncPeriod" in caplog.text
    with pytest.raises(ConfigError, match=r"iptables\.masqueradeBit: 40"):
        load_config(write("iptables: {masqueradeBit: 40}\n"))


# --- flags --------------------------------------------------------------------------------


def test_flags_override_the_file(write: Writer) -> None:
    path = write(
        """\
        hostnameOverride: from-file
        bindAddress: 10.0.0.1
        clusterCIDR: 10.244.0.0/16
        nodePortAddresses: [10.0.0.0/8]
        mode: nftables
        nftables: {syncPeriod: 20s, minSyncPeriod: 2s}
        metricsBindAddress: 127.0.0.1:1
        lace: {manifests: /from/file, nftables: {table: kept}}
        """
    )
    c = config_from_args(
        parse_flags(
            "--config",
            path,
            "--hostname-override=N1",
            "--bind-address=10.0.0.2",
            "--cluster-cidr=10.245.0.0/16,fd00::/64",
            "--nodeport-addresses=192.168.0.0/16, fd01::/64",
            "--proxy-mode=ipvs",
            "--masquerade-all",
            "--sync-period=1m",
            "--min-sync-period=5s",
            "--healthz-bind-address=10.0.0.2:1",
            "--metrics-bind-address=[::1]:2",
            "--manifests=/from/flag",
        )
    )
    assert c.hostname_override == "n1"
    assert c.bind_address == "10.0.0.2"
    assert c.cluster_cidr == (net("10.245.0.0/16"), net("fd00::/64"))
    assert c.node_port_addresses == (net("192.168.0.0/16"), net("fd01::/64"))
    assert (c.mode, c.masquerade_all, c.sync_period, c.min_sync_period) == ("ipvs", True, 60, 5)
    assert (c.nftables.sync_period, c.nftables.min_sync_period) == (60.0, 5.0)
    assert (c.healthz_bind_address, c.metrics_bind_address) == ("10.0.0.2:1", "[::1]:2")
    assert c.lace.manifests == "/from/flag"
    assert c.lace.nftables.table == "kept"


def test_unset_flags_leave_the_file_alone(write: Writer) -> None:
    path = write("mode: ipvs\nmasqueradeAll: true\nnodePortAddresses: [primary]\n")
    c = config_from_args(parse_flags("--config", path))
    assert (c.mode, c.masquerade_all, c.node_port_addresses) == ("ipvs", True, "primary")


def test_empty_nodeport_addresses_flag_means_all() -> None:
    assert config_from_args(parse_flags("--nodeport-addresses=")).node_port_addresses == ()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sync-period=abc"], '--sync-period: syncPeriod: "abc" is not a duration'),
        (["--proxy-mode=iptables"], "--proxy-mode: mode: "),
        (["--nodeport-addresses=10.0.0.0/8,x"], '--nodeport-addresses: nodePortAddresses[1]: "x"'),
        (["--bind-address=nope"], '--bind-address: bindAddress: "nope" is not an IP address'),
    ],
)
def test_bad_flag_value_names_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_args(parse_flags(*argv))
    assert str(info.value).startswith(message)


def test_every_flag_has_help() -> None:
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    for action in parser._actions[1:]:  # [0] is --help
        assert action.help, action.option_strings


# --- errors -------------------------------------------------------------------------------


def test_error_message_format(write: Writer) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write("nftables: {syncPeriod: abc}\n"))
    assert (
        str(info.value)
        == 'config.yaml: nftables.syncPeriod: "abc" is not a duration (e.g. 30s, 1m)'
    )
    assert (info.value.source, info.value.path) == ("config.yaml", "nftables.syncPeriod")
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("body", "path", "problem"),
    [
        ("bogus: 1\n", "bogus", "unknown field"),
        ("clusterCidr: 10.0.0.0/8\n", "clusterCidr", "did you mean clusterCIDR?"),
        ("nftables: {bogus: 1}\n", "nftables.bogus", "known: masqueradeAll, masqueradeBit"),
        ("lace: {nftables: {bogus: 1}}\n", "lace.nftables.bogus", "unknown field"),
        ("detectLocal: {bogus: x}\n", "detectLocal.bogus", "unknown field"),
        ("ipvs: {strictARP: 'yes'}\n", "ipvs.strictARP", '"yes" is not a boolean'),
        ("masqueradeAll: 1\n", "masqueradeAll", "1 is not a boolean"),
        (
            "conntrack: {tcpEstablishedTimeout: 30}\n",
            "conntrack.tcpEstablishedTimeout",
            "30 is not a duration",
        ),
        ("syncPeriod: 1.5\n", "syncPeriod", "1.5 is not a duration"),
        ("ipvs: {tcpTimeout: -1s}\n", "ipvs.tcpTimeout", '"-1s" is a negative duration'),
        ("nodePortAddresses: 10.0.0.0/8\n", "nodePortAddresses", "is not a list of CIDRs"),
        (
            "ipvs: {excludeCIDRs: [10.0.0.0/8, 10.0.0.0/33]}\n",
            "ipvs.excludeCIDRs[1]",
            '"10.0.0.0/33" is not a CIDR',
        ),
        ("lace: {routing: {table: 254}}\n", "lace.routing.table", "default/main/local"),
        ("lace: {egress: {table: lace-proxy}}\n", "lace.egress.table", "a name of its own"),
        ("lace: {egress: {enabled: 1}}\n", "lace.egress.enabled", "1 is not a boolean"),
        (
            "lace: {egress: {nonMasqueradeCIDRs: [10.0.0.0/33]}}\n",
            "lace.egress.nonMasqueradeCIDRs[0]",
            '"10.0.0.0/33" is not a CIDR',
        ),
        ("lace: {routing: {table: 0}}\n", "lace.routing.table", "an integer from 1"),
        ("lace: {routing: {priority: 32766}}\n", "lace.routing.priority", "from 1 to 32765"),
        (
            "lace: {ipvs: {serviceAddresses: routes}}\n",
            "lace.ipvs.serviceAddresses",
            '"routes" is not one of interface, localRoutes',
        ),
        (
            "lace: {serviceCIDRs: [10.96.0.1]}\n",
            "lace.serviceCIDRs[0]",
            '"10.96.0.1" is not a CIDR',
        ),
        ("nodePortAddresses: [primary, 10.0.0.0/8]\n", "nodePortAddresses", '["primary"] alone'),
        ("clusterCIDR: 10.0.0.0/8,10.1.0.0/16\n", "clusterCIDR", "IPv4,IPv6 pair"),
        ("clusterCIDR: [10.0.0.0/8]\n", "clusterCIDR", "is not a string"),
        ("clusterCIDR: 10.0.0.0/8,bad\n", "clusterCIDR", '"bad" is not a CIDR'),
        (
            "mode: iptables\n",
            "mode",
            '"iptables" is not supported: lace-proxy supports nftables and ipvs',
        ),
        ("mode: kernelspace\n", "mode", "lace-proxy supports nftables and ipvs"),
        ("detectLocalMode: Bogus\n", "detectLocalMode", "is not one of ClusterCIDR, NodeCIDR"),
        ("hostnameOverride: 42\n", "hostnameOverride", "42 is not a string"),
        ("bindAddress: 10.0.0.300\n", "bindAddress", "is not an IP address"),
        ("healthzBindAddress: 0.0.0.0:70000\n", "healthzBindAddress", "port from 1 to 65535"),
        ("metricsBindAddress: localhost:10249\n", "metricsBindAddress", "is not an IP:port"),
        (
            "nftables: {masqueradeBit: 32}\n",
            "nftables.masqueradeBit",
            "32 is not an integer from 0 to 31",
        ),
        ("nftables: {masqueradeBit: true}\n", "nftables.masqueradeBit", "true is not an integer"),
        ("conntrack: {maxPerCore: -1}\n", "conntrack.maxPerCore", "-1 is not an integer"),
        ("ipvs: {scheduler: fifo}\n", "ipvs.scheduler", '"fifo" is not one of rr, wrr'),
        ("nftables: 5\n", "nftables", "5 is not a mapping"),
        (
            "lace: {nftables: {table: 9lives}}\n",
            "lace.nftables.table",
            "is not an nftables table name",
        ),
        ("lace: {nftables: {table: ''}}\n", "lace.nftables.table", "is not an nftables table name"),
        (
            "lace: {nftables: {family: bridge}}\n",
            "lace.nftables.family",
            "is not one of inet, ip, ip6",
        ),
        ("lace: {manifests: [a]}\n", "lace.manifests", "is not a string"),
        (
            "detectLocal: {bridgeInterface: a-very-long-name0}\n",
            "detectLocal.bridgeInterface",
            "interface name",
        ),
        (
            "detectLocalMode: BridgeInterface\n",
            "detectLocal.bridgeInterface",
            "required by detectLocalMode",
        ),
        ("detectLocalMode: InterfaceNamePrefix\n", "detectLocal.interfaceNamePrefix", "required"),
        (
            "nftables: {syncPeriod: 1s, minSyncPeriod: 2s}\n",
            "nftables.minSyncPeriod",
            "2s is longer than the syncPeriod (1s)",
        ),
    ],
)
def test_error_names_the_field(write: Writer, body: str, path: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(body))
    assert info.value.path == path
    assert str(info.value).startswith(f"config.yaml: {path}: ")
    assert problem in info.value.problem


@pytest.mark.parametrize(
    ("text", "path", "problem"),
    [
        ("apiVersion: v1\nkind: KubeProxyConfiguration\n", "apiVersion", '"v1" is not '),
        ("kind: KubeProxyConfiguration\n", "apiVersion", "null is not kubeproxy.config.k8s.io"),
        (f"apiVersion: {UPSTREAM_API_VERSION}\n", "kind", "null is not KubeProxyConfiguration"),
        (f"apiVersion: {LACE_API_VERSION}\nkind: Pod\n", "kind", '"Pod" is not'),
        ("", "", "expected a KubeProxyConfiguration mapping, got null"),
        ("- a\n", "", "expected a KubeProxyConfiguration mapping"),
        ("a: [\n", "", "not valid YAML"),
    ],
)
def test_file_level_errors(tmp_path: Path, text: str, path: str, problem: str) -> None:
    file = tmp_path / "c.yaml"
    file.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(str(file))
    assert (info.value.source, info.value.path) == (str(file), path)
    assert problem in info.value.problem


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read: No such file or directory"):
        load_config(str(tmp_path / "absent.yaml"))


def test_overrides_are_validated_and_named() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, {"nftables.minSyncPeriod": 2})
    assert str(info.value) == "override: nftables.minSyncPeriod: 2 is not a duration (e.g. 30s, 1m)"
    with pytest.raises(ConfigError, match=re.escape("override: nftables.bogus: unknown field")):
        load_config(None, {"nftables.bogus": "1s"})


def test_override_set_twice_is_an_error_and_input_is_not_mutated() -> None:
    overrides: dict[str, object] = {"nftables": {"syncPeriod": "1m"}, "nftables.syncPeriod": "2m"}
    with pytest.raises(ConfigError, match=re.escape("nftables.syncPeriod: set twice")):
        load_config(None, overrides)
    assert overrides["nftables"] == {"syncPeriod": "1m"}
    c = load_config(None, {"nftables": {"syncPeriod": "1m"}, "nftables.minSyncPeriod": "2s"})
    assert (c.sync_period, c.min_sync_period) == (60.0, 2.0)


# --- durations ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("0s", 0.0),
        ("30s", 30.0),
        ("1m", 60.0),
        ("1m30s", 90.0),
        ("1h", 3600.0),
        ("1h2m3.5s", 3723.5),
        ("500ms", 0.5),
        ("1.5h", 5400.0),
        (".5s", 0.5),
        ("1.s", 1.0),
        ("2us", 2e-6),
        ("2\u00b5s", 2e-6),
        ("2\u03bcs", 2e-6),
        ("10ns", 1e-8),
        ("1.9ns", 1e-9),  # truncated to whole nanoseconds, like Go
        ("1s1s", 2.0),
        ("24h", 86400.0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds, rel=1e-12, abs=0)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "-1s",
        "-0s",
        "+1s",
        "1",
        "30",
        "abc",
        "1 s",
        " 1s",
        "1d",
        "1S",
        "s",
        ".s",
        "1.2.3s",
        "1e3s",
        "\u0661s",
        "3000000h",
    ],
)
def test_invalid_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (1e-9, "1ns"),
        (1.5e-6, "1.5\u00b5s"),
        (0.5, "500ms"),
        (0.0125, "12.5ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (60, "1m0s"),
        (90, "1m30s"),
        (3600, "1h0m0s"),
        (3723.5, "1h2m3.5s"),
        (86400, "24h0m0s"),
    ],
)
def test_format_duration_like_go(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(seconds)
