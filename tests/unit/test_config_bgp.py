"""lace.bgp: the section read, and each bad value an error that names its field."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from lace_proxy.config import LACE_API_VERSION, ConfigError, load_config
from lace_proxy.config.bgp import BgpPeer, LaceBgpAnnounceConfig, LaceBgpConfig

Writer = Callable[[str], str]

SECTION = """
lace:
  bgp:
    enabled: true
    asn: 4200000001
    routerID: 10.250.0.2
    peers:
      - {address: 10.250.0.1, asn: 65000}
      - address: "fd00:250::0001"
        asn: 65000
        port: 1179
        password: secret
        holdTime: 9s
        nodeSelector: {rack: r1, zone: a}
      - {address: 10.250.0.3, asn: 65003, passwordFile: /etc/lace-proxy/bgp/r3}
    announce: {externalIPs: false, clusterIPs: aggregate}
    gracefulRestartTime: 30s
    directory: /run/lace-bgp
"""


@pytest.fixture
def write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Writer:
    monkeypatch.chdir(tmp_path)

    def write(body: str) -> str:
        header = f"apiVersion: {LACE_API_VERSION}\nkind: KubeProxyConfiguration\n"
        header += "hostnameOverride: node-a\n"
        Path("config.yaml").write_text(header + textwrap.dedent(body))
        return "config.yaml"

    return write


def test_the_section_is_read(write: Writer) -> None:
    bgp = load_config(write(SECTION)).lace.bgp
    assert bgp == LaceBgpConfig(
        enabled=True,
        asn=4200000001,
        router_id="10.250.0.2",
        peers=(
            BgpPeer("10.250.0.1", 65000),
            BgpPeer("fd00:250::1", 65000, 1179, "secret", 9.0, (("rack", "r1"), ("zone", "a"))),
            BgpPeer("10.250.0.3", 65003, password_file="/etc/lace-proxy/bgp/r3"),
        ),
        announce=LaceBgpAnnounceConfig(
            load_balancer_ips=True, external_ips=False, cluster_ips="aggregate"
        ),
        graceful_restart_time=30.0,
        directory="/run/lace-bgp",
    )
    assert bgp.peers[1].selects({"rack": "r1", "zone": "a", "other": "x"})
    assert not bgp.peers[1].selects({"rack": "r1"})
    assert bgp.peers[0].selects({})


def test_off_by_default_and_what_is_announced_by_default(write: Writer) -> None:
    bgp = load_config(write("")).lace.bgp
    assert not bgp.enabled and bgp.peers == ()
    assert bgp.announce == LaceBgpAnnounceConfig(True, True, "none")


def test_an_ipv4_mapped_peer_is_an_ipv4_peer(write: Writer) -> None:
    body = 'lace:\n  bgp:\n    peers: [{address: "::ffff:10.0.0.1", asn: 1}]\n'
    assert load_config(write(body)).lace.bgp.peers[0].address == "10.0.0.1"


def test_round_trips_through_to_dict(write: Writer) -> None:
    original = load_config(write(SECTION))
    Path("printed.yaml").write_text(yaml.safe_dump(original.to_dict()))
    assert load_config("printed.yaml") == original


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ("peers: [{asn: 1}]", "lace.bgp.peers[0].address", "is required"),
        ("peers: [{address: 10.0.0.1}]", "lace.bgp.peers[0].asn", "is required"),
        (
            "peers: [{address: 10.0.0.1, asn: 1, hold: 3s}]",
            "lace.bgp.peers[0].hold",
            "did you mean holdTime?",
        ),
        (
            'peers: [{address: "fd00::1", asn: 1}, {address: "fd00:0::01", asn: 2}]',
            "lace.bgp.peers[1].address",
            "is a peer already",
        ),
        (
            "peers: [{address: 10.0.0.1, asn: 1}, {address: 10.0.0.x, asn: 2}]",
            "lace.bgp.peers[1].address",
            "is not an IP address",
        ),
        (
            "peers: [{address: 10.0.0.1, asn: 4294967296}]",
            "lace.bgp.peers[0].asn",
            "an integer from 0 to 4294967295",
        ),
        (
            "peers: [{address: 10.0.0.1, asn: 1, holdTime: 2s}]",
            "lace.bgp.peers[0].holdTime",
            "3s to 65535s",
        ),
        (
            f"peers: [{{address: 10.0.0.1, asn: 1, password: {'x' * 81}}}]",
            "lace.bgp.peers[0].password",
            "longer than 80 bytes",
        ),
        (
            "peers: [{address: 10.0.0.1, asn: 1, nodeSelector: [a]}]",
            "lace.bgp.peers[0].nodeSelector",
            "a mapping of Node label names",
        ),
        (
            'peers: [{address: 10.0.0.1, asn: 1, password: "a\\"b"}]',
            "lace.bgp.peers[0].password",
            "without quotes or backslashes",
        ),
        (
            "peers: [{address: 10.0.0.1, asn: 1, password: a, passwordFile: /etc/k}]",
            "lace.bgp.peers[0].passwordFile",
            "set password or passwordFile, not both",
        ),
        (
            "peers: [{address: 10.0.0.1, asn: 1, passwordFile: etc/k}]",
            "lace.bgp.peers[0].passwordFile",
            "an absolute path",
        ),
        (
            'peers: [{address: "fe80::1%eth0", asn: 1}]',
            "lace.bgp.peers[0].address",
            "without a zone",
        ),
        ('directory: "run/bgp"', "lace.bgp.directory", "an absolute path"),
        ('directory: "/run/a\\"b"', "lace.bgp.directory", "no quotes"),
        (f"directory: /{'d' * 98}", "lace.bgp.directory", "at most 98"),
        ("peers: [10.0.0.1]", "lace.bgp.peers[0]", "is not a mapping"),
        ("peers: {address: 10.0.0.1}", "lace.bgp.peers", "a list of peers"),
        ("routerID: fd00::1", "lace.bgp.routerID", "an IPv4 address (a BGP router id)"),
        (
            "announce: {clusterIPs: all}",
            "lace.bgp.announce.clusterIPs",
            "one of none, aggregate, perService",
        ),
        ("gracefulRestartTime: 2h", "lace.bgp.gracefulRestartTime", "1s to 4095s"),
        ("enabled: true\n    asn: 1", "lace.bgp.peers", "required when lace.bgp.enabled"),
        (
            "enabled: true\n    peers: [{address: 10.0.0.1, asn: 1}]",
            "lace.bgp.asn",
            "required when lace.bgp.enabled",
        ),
    ],
)
def test_a_bad_value_names_its_field(write: Writer, change: str, field: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(f"lace:\n  bgp:\n    {change}\n"))
    message = str(caught.value)
    assert message.startswith(f"config.yaml: {field}: "), message
    assert says in message, message
