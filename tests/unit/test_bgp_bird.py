"""BIRD's configuration and route files as lace-proxy writes them, and its control socket
when no BIRD answers (the real BIRD: tests/netns/test_bgp.py)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import yaml

from lace_proxy.bgp.bird import (
    BirdError,
    NodeFacts,
    command,
    configured_peers,
    read_passwords,
    render_config,
    render_routes,
    write_if_changed,
)
from lace_proxy.cli import main
from lace_proxy.config import LACE_API_VERSION
from lace_proxy.config.bgp import BgpPeer, LaceBgpConfig

SETTINGS = LaceBgpConfig(
    enabled=True,
    asn=65001,
    peers=(
        BgpPeer("10.250.0.254", 65000, hold_time=9, password="s3cret"),
        BgpPeer("fd00:250::fe", 65000, port=1179, node_selector=(("rack", "r2"),)),
    ),
    graceful_restart_time=30,
    directory="/run/bgp",
)
KEYS, _ = read_passwords(SETTINGS.peers, {})


def test_the_configuration_for_a_dual_stack_node() -> None:
    text = render_config(SETTINGS, NodeFacts(("10.250.0.1", "fd00:250::1")), "/run/bgp", KEYS)
    assert "router id 10.250.0.1;\n" in text
    assert 'include "/run/bgp/routes4.conf";\n' in text
    assert 'include "/run/bgp/routes6.conf";\n' in text
    assert text.count("protocol bgp ") == 1  # the second peer selects rack r2 only
    assert "protocol bgp peer_10_250_0_254 {\n" in text
    assert "  local 10.250.0.1 as 65001;\n" in text
    assert "  neighbor 10.250.0.254 port 179 as 65000;\n" in text
    assert "  hold time 9;\n  " in text and "  graceful restart time 30;\n" in text
    assert '  password "s3cret";\n' in text
    assert "export filter { bgp_next_hop = 10.250.0.1; accept; }" in text
    assert "export filter { bgp_next_hop = fd00:250::1; accept; }" in text


def test_a_peer_selected_by_labels_and_a_node_of_one_family() -> None:
    node = NodeFacts(("fd00:250::1",), (("rack", "r2"),))
    settings = dataclasses.replace(SETTINGS, router_id="192.0.2.1")
    text = render_config(settings, node, "/run/bgp", {})
    assert "router id 192.0.2.1;\n" in text
    assert "protocol bgp peer_fd00_250__fe {\n" in text
    assert "  local fd00:250::1 as 65001;\n" in text
    assert "  local as 65001;\n" in text  # no IPv4 address to speak from
    assert "lace_svc4; import none" not in text  # no IPv4 next hop: no IPv4 routes
    with pytest.raises(BirdError, match="routerID is required"):
        render_config(SETTINGS, node, "/run/bgp", {})


def test_route_files_carry_communities_by_kind() -> None:
    routes = {
        "192.0.2.10/32": ("65000:100", "65001:1:2"),
        "198.51.100.7/32": (),
        "fd00:96::12/128": ("65535:65281",),
    }
    assert render_routes(routes, 4) == (
        "route 192.0.2.10/32 blackhole { bgp_community.add((65000,100)); "
        "bgp_large_community.add((65001,1,2)); };\n"
        "route 198.51.100.7/32 blackhole;\n"
    )
    assert render_routes(routes, 6) == (
        "route fd00:96::12/128 blackhole { bgp_community.add((65535,65281)); };\n"
    )
    assert render_routes({}, 4) == ""


def test_files_are_replaced_only_when_they_change(tmp_path: Path) -> None:
    path = tmp_path / "routes4.conf"
    assert write_if_changed(path, "a\n")
    assert not write_if_changed(path, "a\n")
    assert write_if_changed(path, "b\n") and path.read_text() == "b\n"
    assert [p.name for p in tmp_path.iterdir()] == ["routes4.conf"]  # no temporary left


def test_no_bird_on_the_socket_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(BirdError, match=r"control socket .*bird.ctl"):
        command(tmp_path / "bird.ctl", "show status")


def test_keys_come_from_the_config_or_from_files_read_now(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("from-a-secret\r\n")
    peers = (
        BgpPeer("10.0.0.1", 1, password="inline"),
        BgpPeer("10.0.0.2", 1, password_file=str(key)),
        BgpPeer("10.0.0.3", 1),
    )
    keys, problems = read_passwords(peers, {})
    assert (keys, problems) == ({"10.0.0.1": "inline", "10.0.0.2": "from-a-secret"}, [])
    key.write_text("replaced")  # kubelet swaps a Secret's files: read again, the new key
    assert read_passwords(peers, keys)[0]["10.0.0.2"] == "replaced"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "cannot be read"),
        ("", "is empty"),
        ("\n", "is empty"),
        ('a"b', "may hold printable ASCII only"),
        ("k" * 81, "is longer than 80 bytes"),
        ("k" * 5000, "is longer than 80 bytes"),
        ("k\u00e9y", "cannot be read"),  # not ASCII
        ("fifo", "not a regular file"),
    ],
)
def test_a_key_file_that_fails_keeps_the_last_key_or_leaves_the_peer_out(
    tmp_path: Path, content: str | None, problem: str
) -> None:
    """A peer's key file that fails costs that peer only: its last good key is kept, or
    without one the peer is left out of the configuration; nothing raises."""
    key = tmp_path / "key"
    if content == "fifo":
        os.mkfifo(key)  # would block a plain read forever
    elif content is not None:
        key.write_text(content)
    peers = (
        BgpPeer("10.0.0.1", 1, password="inline"),
        BgpPeer("10.0.0.2", 1, password_file=str(key)),
    )
    keys, problems = read_passwords(peers, {"10.0.0.2": "last-good"})
    assert keys == {"10.0.0.1": "inline", "10.0.0.2": "last-good"}
    [told] = problems
    assert told.startswith(f"peer 10.0.0.2's passwordFile {key}: the key ") and problem in told
    assert told.endswith("its last key is kept")
    keys, problems = read_passwords(peers, {})
    assert keys == {"10.0.0.1": "inline", "10.0.0.2": None}
    assert problems[0].endswith("the peer is left out until it has a key")
    settings = dataclasses.replace(SETTINGS, peers=peers)
    text = render_config(settings, NodeFacts(("10.250.0.1",)), "/run/bgp", keys)
    assert "protocol bgp peer_10_0_0_1 {" in text and "peer_10_0_0_2" not in text


def test_the_bgp_command_shows_this_nodes_peers_while_bird_does_not_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With BIRD down, the peers are those of the configuration last written for this node
    (a peer selecting it by label included); before any, those selecting no node."""
    directory = tmp_path / "bgp"
    config = tmp_path / "proxy.yaml"
    bgp = {
        "enabled": True,
        "asn": 65001,
        "peers": [
            {"address": "10.250.0.254", "asn": 65000},
            {"address": "fd00:250::fe", "asn": 65000, "nodeSelector": {"rack": "r2"}},
        ],
        "directory": str(directory),
    }
    header = {"apiVersion": LACE_API_VERSION, "kind": "KubeProxyConfiguration"}
    config.write_text(yaml.safe_dump({**header, "lace": {"bgp": bgp}}))
    argv = ["bgp", "--config", str(config), "--hostname-override", "n1", "-o", "json"]

    def shown() -> list[tuple[str, str]]:
        assert main(argv) == 1  # the speaker does not run
        return [(p["address"], p["state"]) for p in json.loads(capsys.readouterr().out)["peers"]]

    assert shown() == [("10.250.0.254", "Down")]
    settings = dataclasses.replace(SETTINGS, directory=str(directory))
    node = NodeFacts(("10.250.0.1", "fd00:250::1"), (("rack", "r2"),))
    directory.mkdir()
    write_if_changed(directory / "bird.conf", render_config(settings, node, str(directory), {}))
    assert configured_peers(directory) == {"peer_10_250_0_254", "peer_fd00_250__fe"}
    assert shown() == [("10.250.0.254", "Down"), ("fd00:250::fe", "Down")]
