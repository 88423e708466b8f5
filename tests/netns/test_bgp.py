"""BGP announcements through BIRD (the node's speaker) to a real router (FRR's bgpd), each in
a network namespace of the testbed: the node, and the client's side of the uplink as the
cluster host network's router."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from lace_proxy.bgp.announcer import Announcer
from lace_proxy.bgp.bird import BirdError, NodeFacts
from lace_proxy.bgp.speaker import Speaker
from lace_proxy.cli import main
from lace_proxy.config import LACE_API_VERSION
from lace_proxy.config.bgp import BgpPeer, LaceBgpConfig
from lace_proxy.demo.addresses import CLIENT4, UPLINK_NODE4, UPLINK_NODE6
from lace_proxy.demo.testbed import FABRIC4, Testbed
from lace_proxy.metrics import ProxyMetrics
from lace_proxy.model.service import BGP_ADVERTISE_ANNOTATION, BGP_COMMUNITIES_ANNOTATION
from testkit.cluster_testbed import NODE_A4, NODE_ADDRESSES, NODE_B4, ClusterTestbed

from .bgpkit import FrrRouter
from .proxykit import LB4, LB6, NODE, OTHER_NODE, Harness, endpoints, service
from .runkit import run_argv, write

pytestmark = pytest.mark.netns

NODE_ASN, ROUTER_ASN = 65001, 65000
FACTS = NodeFacts((UPLINK_NODE4, UPLINK_NODE6))


@pytest.fixture
def router(testbed: Testbed, tmp_path: Path) -> Iterator[FrrRouter]:
    neighbors = {UPLINK_NODE4: NODE_ASN}
    with FrrRouter(testbed.client.ns.name, tmp_path / "frr", ROUTER_ASN, CLIENT4, neighbors) as r:
        yield r


@pytest.fixture
def speaker(testbed: Testbed, tmp_path: Path) -> Iterator[Speaker]:
    settings = LaceBgpConfig(
        enabled=True,
        asn=NODE_ASN,
        peers=(BgpPeer(CLIENT4, ROUTER_ASN, hold_time=9),),
        graceful_restart_time=60,
        directory=str(tmp_path / "bird"),
    )
    s = Speaker(settings, netns=testbed.node.ns.name)
    try:
        yield s
    finally:
        s.stop(withdraw=True)


def both(router: FrrRouter) -> dict[str, tuple[str, tuple[str, ...], bool]]:
    return {**router.routes(4), **router.routes(6)}


def test_routes_appear_with_the_nodes_address_and_go_without_a_session_reset(
    router: FrrRouter, speaker: Speaker
) -> None:
    speaker.sync(FACTS, {"192.0.2.10/32": ("65000:100", "65001:1:2"), "fd00:96::12/128": ()}, {})
    want = {
        "192.0.2.10/32": (UPLINK_NODE4, ("65000:100", "65001:1:2"), False),
        "fd00:96::12/128": (UPLINK_NODE6, (), False),
    }
    assert router.wait_for("routes", lambda: both(router) == want and both(router)) == want
    assert [p.state for p in speaker.peers()] == ["Established"]
    speaker.sync(FACTS, {"fd00:96::12/128": ()}, {})  # 192.0.2.10 withdrawn
    router.wait_for("withdrawal", lambda: "192.0.2.10/32" not in both(router))
    assert both(router) == {"fd00:96::12/128": want["fd00:96::12/128"]}
    assert router.peer(UPLINK_NODE4)["connectionsEstablished"] == 1  # no session reset
    assert not speaker.sync(FACTS, {"fd00:96::12/128": ()}, {})  # the same again: nothing to do


def test_a_killed_bird_is_started_again_and_the_router_keeps_the_routes(
    router: FrrRouter, speaker: Speaker
) -> None:
    routes = {"192.0.2.10/32": ()}
    speaker.sync(FACTS, routes, {})
    router.wait_for("the route", lambda: "192.0.2.10/32" in router.routes(4))
    assert speaker._process is not None
    os.kill(speaker._process.pid, signal.SIGKILL)
    speaker._process.wait()
    # Graceful restart: the router keeps the route, stale, while the speaker is away.
    router.wait_for(
        "the session's end", lambda: router.peer(UPLINK_NODE4)["state"] != "Established"
    )
    router.wait_for(  # kept, stale: a withdrawn route has no entry at all
        "the route kept, stale", lambda: router.routes(4)["192.0.2.10/32"][2] is True
    )
    assert speaker.check()  # found dead, counted, started again
    assert speaker.restarts == 1
    router.wait_for(
        "the route refreshed",
        lambda: router.routes(4).get("192.0.2.10/32", ("", (), True))[2] is False,
    )
    assert router.peer(UPLINK_NODE4)["connectionsEstablished"] == 2


def node_object(name: str = NODE, *addresses: str, deleting: bool = False) -> dict[str, object]:
    internal = addresses or (UPLINK_NODE4, UPLINK_NODE6)
    metadata: dict[str, object] = {"name": name, "labels": {"rack": "r1"}}
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-04T00:00:00Z"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": metadata,
        "status": {"addresses": [{"type": "InternalIP", "address": a} for a in internal]},
    }


def test_the_proxy_announces_a_local_policy_service_while_it_has_a_ready_endpoint_here(
    testbed: Testbed, router: FrrRouter, speaker: Speaker, tmp_path: Path
) -> None:
    """The whole pipeline: manifests, table, proxier, announcer, BIRD, the router. Under
    externalTrafficPolicy Local the LB IP is announced while this node has a ready endpoint
    and withdrawn by the sync that sees the last one leave; the annotations opt out and add
    communities; the metrics say what the router sees."""
    metrics = ProxyMetrics()
    harness = Harness(testbed, tmp_path / "m", announce=Announcer(speaker, metrics=metrics).sync)
    status = {"loadBalancer": {"ingress": [{"ip": LB4}, {"ip": LB6}]}}
    spec = {"externalTrafficPolicy": "Local", "status": status}
    web = service(
        "web", ["10.96.0.10", "fd00:96::10"], type="LoadBalancer", node_port=30080, **spec
    )
    web["metadata"]["annotations"] = {BGP_COMMUNITIES_ANNOTATION: "65000:7"}
    here = [endpoints("web", testbed.pods), endpoints("web", testbed.pods, v6=True)]
    try:
        harness.write("node", node_object())
        harness.write("web", web, *here)
        harness.sync()
        want = {
            f"{LB4}/32": (UPLINK_NODE4, ("65000:7",), False),
            f"{LB6}/128": (UPLINK_NODE6, ("65000:7",), False),
        }
        router.wait_for("the LB IPs", lambda: both(router) == want)
        elsewhere = [endpoints("web", testbed.pods, node=OTHER_NODE)]
        elsewhere.append(endpoints("web", testbed.pods, v6=True, node=OTHER_NODE))
        harness.write("web", web, *elsewhere)
        harness.sync()
        router.wait_for("the withdrawal", lambda: not both(router))
        harness.write("web", web, *here)
        harness.sync()
        router.wait_for("the LB IPs again", lambda: both(router) == want)
        web["metadata"]["annotations"] = {BGP_ADVERTISE_ANNOTATION: "false"}
        harness.write("web", web, *here)
        harness.sync()
        router.wait_for("the opt-out", lambda: not both(router))
        assert router.peer(UPLINK_NODE4)["connectionsEstablished"] == 1
        exposition = metrics.exposition()[0].decode()
        assert 'lace_proxy_bgp_peers{state="Established"} 1.0' in exposition
        assert "lace_proxy_bgp_announced_routes 0.0" in exposition
    finally:
        harness.close()


def test_the_bgp_command_shows_the_peers_state_and_the_routes(
    router: FrrRouter, speaker: Speaker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "proxy.yaml"
    bgp = {
        "enabled": True,
        "asn": NODE_ASN,
        "peers": [{"address": CLIENT4, "asn": ROUTER_ASN}],
        "directory": str(speaker.directory),
    }
    header = {"apiVersion": LACE_API_VERSION, "kind": "KubeProxyConfiguration"}
    config.write_text(yaml.safe_dump({**header, "lace": {"bgp": bgp}}))
    argv = ["bgp", "--config", str(config), "--hostname-override", NODE, "-o", "json"]
    speaker.sync(FACTS, {"192.0.2.10/32": ("65000:7",)}, {})
    router.wait_for("the session", lambda: router.peer(UPLINK_NODE4).get("state") == "Established")
    assert main(argv) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown == {
        "speaker": "running",
        "peers": [{"address": CLIENT4, "asn": ROUTER_ASN, "state": "Established"}],
        "routes": [{"prefix": "192.0.2.10/32", "communities": ["65000:7"]}],
    }
    speaker.stop(withdraw=True)
    assert main(argv) == 1  # the speaker does not run: every peer Down
    shown = json.loads(capsys.readouterr().out)
    assert shown["speaker"] == "not running"
    assert [p["state"] for p in shown["peers"]] == ["Down"]


def test_cleanup_withdraws_the_routes_and_removes_the_speakers_files(
    router: FrrRouter, speaker: Speaker
) -> None:
    speaker.sync(FACTS, {"192.0.2.10/32": ()}, {})
    router.wait_for("the route", lambda: "192.0.2.10/32" in router.routes(4))
    other = Speaker(speaker.settings)  # `lace-proxy cleanup`: not the process that runs BIRD
    assert other.cleanup()
    router.wait_for("the withdrawal", lambda: not router.routes(4))
    assert not speaker.directory.exists()
    assert not other.cleanup()  # nothing left


def test_two_nodes_only_the_one_with_the_local_endpoint_announces(
    cluster: ClusterTestbed, tmp_path: Path
) -> None:
    """externalTrafficPolicy Local on the two-node testbed: the fabric (the router) learns
    the LB IP from the node whose pod is the endpoint, with that node's next hop; when the
    endpoint moves to the other node, the route moves with it. A Cluster service is
    announced by both (the router has two paths: ECMP)."""
    neighbors = {NODE_A4: NODE_ASN, NODE_B4: NODE_ASN}
    nodes = [node_object(name, address) for name, address in NODE_ADDRESSES.items()]
    local = service(
        "local",
        ["10.96.0.21"],
        type="LoadBalancer",
        node_port=30021,
        externalTrafficPolicy="Local",
        status={"loadBalancer": {"ingress": [{"ip": LB4}]}},
    )
    anywhere = service(
        "anywhere",
        ["10.96.0.22"],
        type="LoadBalancer",
        node_port=30022,
        status={"loadBalancer": {"ingress": [{"ip": "10.252.0.22"}]}},
    )
    on = {
        name: endpoints("local", [cluster.pods[pod]], node=name)
        for name, pod in (("node-a", "a1"), ("node-b", "b1"))
    }
    with FrrRouter(
        cluster.fabric.ns.name, tmp_path / "frr", ROUTER_ASN, FABRIC4, neighbors
    ) as router:
        proxies, speakers = [], []
        try:
            for name, host in cluster.nodes.items():
                settings = LaceBgpConfig(
                    enabled=True,
                    asn=NODE_ASN,
                    peers=(BgpPeer(FABRIC4, ROUTER_ASN, hold_time=9),),
                    directory=str(tmp_path / name / "bird"),
                )
                speaker = Speaker(settings, netns=host.ns.name)
                speakers.append(speaker)
                proxy = Harness(
                    cluster,
                    tmp_path / name / "m",
                    node=host,
                    node_name=name,
                    announce=Announcer(speaker).sync,
                )
                proxies.append(proxy)
                proxy.write("nodes", *nodes)
                proxy.write(
                    "anywhere", anywhere, endpoints("anywhere", [cluster.pods["a1"]], node="node-a")
                )
            for where, hop in (("node-a", NODE_A4), ("node-b", NODE_B4)):
                for proxy in proxies:
                    proxy.write("local", local, on[where])
                    proxy.sync()
                want = {f"{LB4}/32": {hop}, "10.252.0.22/32": {NODE_A4, NODE_B4}}
                router.wait_for(
                    f"the LB IP from {where} only", lambda want=want: router.next_hops(4) == want
                )
        finally:
            for proxy in proxies:
                proxy.close()
            for speaker in speakers:
                speaker.stop(withdraw=True)


def test_a_router_that_goes_away_and_comes_back_learns_the_routes_again(
    testbed: Testbed, speaker: Speaker, tmp_path: Path
) -> None:
    neighbors = {UPLINK_NODE4: NODE_ASN}
    start = (testbed.client.ns.name, tmp_path / "frr", ROUTER_ASN, CLIENT4, neighbors)
    routes = {"192.0.2.10/32": ("65000:7",)}
    with FrrRouter(*start) as router:
        speaker.sync(FACTS, routes, {})
        router.wait_for("the route", lambda: "192.0.2.10/32" in router.routes(4))
    # The router is gone: the session is down, and the speaker says so.
    deadline = time.monotonic() + 30
    while speaker.peers()[0].state == "Established":
        assert time.monotonic() < deadline, "the session outlived its router"
        time.sleep(0.2)
    assert speaker.peers()[0].state in ("Idle", "Connect", "Active")
    speaker.sync(FACTS, routes, {})  # meanwhile: nothing changed, nothing refused
    with FrrRouter(*start) as router:
        router.wait_for("the route again", lambda: "192.0.2.10/32" in router.routes(4))
        assert router.routes(4)["192.0.2.10/32"] == (UPLINK_NODE4, ("65000:7",), False)
        assert [p.state for p in speaker.peers()] == ["Established"]


def test_lace_proxy_run_announces_and_its_restart_keeps_the_routes(
    testbed: Testbed, router: FrrRouter, tmp_path: Path
) -> None:
    """The product as it runs: `lace-proxy run` with lace.bgp starts BIRD and announces the LB
    IP; stopped (SIGTERM), it leaves the route with the router (graceful restart: stale,
    not withdrawn); started again, the route is refreshed."""
    bgp = {
        "enabled": True,
        "asn": NODE_ASN,
        "peers": [{"address": CLIENT4, "asn": ROUTER_ASN, "holdTime": "9s"}],
        "directory": str(tmp_path / "bird"),
    }
    config = tmp_path / "proxy.yaml"
    header = {"apiVersion": LACE_API_VERSION, "kind": "KubeProxyConfiguration"}
    config.write_text(yaml.safe_dump({**header, "lace": {"bgp": bgp}}))
    folder = tmp_path / "manifests"
    folder.mkdir()
    status = {"loadBalancer": {"ingress": [{"ip": LB4}]}}
    web = service("web", ["10.96.0.10"], type="LoadBalancer", node_port=30080, status=status)
    write(folder, node_object(), web, endpoints("web", testbed.pods))
    argv = [
        *run_argv(testbed, folder, "nftables", tmp_path / "state.sock"),
        "--config",
        str(config),
    ]
    lb = f"{LB4}/32"
    try:
        for run in (1, 2):
            proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
            try:
                router.wait_for(
                    f"the route from run {run}",
                    lambda: router.routes(4).get(lb, ("", (), True))[2] is False,
                )
                assert router.routes(4)[lb][0] == UPLINK_NODE4
                assert router.peer(UPLINK_NODE4)["connectionsEstablished"] == run
            finally:
                proc.send_signal(signal.SIGTERM)
                _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0 and "Traceback" not in err, err
            router.wait_for(
                "the session's end", lambda: router.peer(UPLINK_NODE4)["state"] != "Established"
            )
            router.wait_for(  # kept, stale: a withdrawn route has no entry at all
                "the route kept, stale", lambda: router.routes(4)[lb][2] is True
            )
    finally:
        Speaker(LaceBgpConfig(directory=str(tmp_path / "bird"))).cleanup()


def test_a_refused_configuration_changes_nothing_and_the_next_sync_converges(
    router: FrrRouter, speaker: Speaker
) -> None:
    """BIRD refuses a route set (a community out of range, which the announcement never
    makes: the speaker's own input is not checked twice): it keeps announcing what it had,
    the speaker still reports that, and a good set goes through."""
    speaker.sync(FACTS, {"192.0.2.10/32": ()}, {})
    router.wait_for("the route", lambda: set(router.routes(4)) == {"192.0.2.10/32"})
    bad = {"192.0.2.10/32": (), "192.0.2.11/32": ("70000:1",)}
    with pytest.raises(BirdError, match="refused 'configure'"):
        speaker.sync(FACTS, bad, {})
    assert speaker.routes == {"192.0.2.10/32": ()}  # what BIRD announces, not what was asked
    assert set(router.routes(4)) == {"192.0.2.10/32"}
    assert speaker.sync(FACTS, {"192.0.2.10/32": (), "192.0.2.11/32": ("65000:1",)}, {})
    router.wait_for("both", lambda: set(router.routes(4)) == {"192.0.2.10/32", "192.0.2.11/32"})


def test_a_node_being_deleted_withdraws_what_it_announced(
    testbed: Testbed, router: FrrRouter, speaker: Speaker, tmp_path: Path
) -> None:
    harness = Harness(testbed, tmp_path / "m", announce=Announcer(speaker).sync)
    status = {"loadBalancer": {"ingress": [{"ip": LB4}]}}
    web = service("web", ["10.96.0.10"], type="LoadBalancer", node_port=30080, status=status)
    try:
        harness.write("node", node_object())
        harness.write("web", web, endpoints("web", testbed.pods))
        harness.sync()
        router.wait_for("the LB IP", lambda: f"{LB4}/32" in router.routes(4))
        harness.write("node", node_object(deleting=True))
        harness.sync()
        router.wait_for("the withdrawal", lambda: not router.routes(4))
        assert router.peer(UPLINK_NODE4)["state"] == "Established"  # the session stays
    finally:
        harness.close()


def test_a_peers_key_comes_from_a_file_and_a_new_key_is_taken_at_the_next_sync(
    testbed: Testbed, tmp_path: Path
) -> None:
    """TCP MD5 with the key in a file (a mounted Secret's): the session comes up with it; a
    file that cannot be read is an error, logged and counted, and the session goes on with
    the last key, routes coming and going; the router's and the file's new key meet at the
    next sync."""
    key = tmp_path / "secret" / "router-key"
    key.parent.mkdir()
    key.write_text("first-key\n")  # as a Secret's value often ends
    settings = LaceBgpConfig(
        enabled=True,
        asn=NODE_ASN,
        peers=(BgpPeer(CLIENT4, ROUTER_ASN, hold_time=9, password_file=str(key)),),
        graceful_restart_time=60,
        directory=str(tmp_path / "bird"),
    )
    speaker = Speaker(settings, netns=testbed.node.ns.name)
    metrics = ProxyMetrics()
    harness = Harness(testbed, tmp_path / "m", announce=Announcer(speaker, metrics=metrics).sync)
    neighbors, keys = {UPLINK_NODE4: NODE_ASN}, {UPLINK_NODE4: "first-key"}
    status = {"loadBalancer": {"ingress": [{"ip": LB4}]}}
    web = service("web", ["10.96.0.10"], type="LoadBalancer", node_port=30080, status=status)
    with FrrRouter(
        testbed.client.ns.name, tmp_path / "frr", ROUTER_ASN, CLIENT4, neighbors, keys
    ) as router:
        try:
            harness.write("node", node_object())
            harness.write("web", web, endpoints("web", testbed.pods))
            harness.sync()
            router.wait_for("the LB IP", lambda: f"{LB4}/32" in router.routes(4))
            assert 'password "first-key";' in (tmp_path / "bird" / "bird.conf").read_text()

            # The Secret's volume without the key: the session keeps its last key, and
            # routes still come and go.
            key.unlink()
            harness.write("web", web)  # no endpoint: withdrawn
            harness.sync()
            router.wait_for("the withdrawal", lambda: not router.routes(4))
            exposition = metrics.exposition()[0].decode()
            assert 'lace_proxy_bgp_errors_total{kind="failed"} 1.0' in exposition
            assert router.peer(UPLINK_NODE4)["connectionsEstablished"] == 1
            harness.write("web", web, endpoints("web", testbed.pods))
            harness.sync()
            router.wait_for("the LB IP back", lambda: f"{LB4}/32" in router.routes(4))

            router.set_password(UPLINK_NODE4, "second-key")
            key.write_text("second-key\n")
            harness.sync(full=True)
            router.wait_for(
                "the session with the new key",
                lambda: (
                    router.peer(UPLINK_NODE4).get("connectionsEstablished", 0) >= 2
                    and router.peer(UPLINK_NODE4)["state"] == "Established"
                ),
            )
            router.wait_for("the LB IP again", lambda: f"{LB4}/32" in router.routes(4))
            assert 'password "second-key";' in (tmp_path / "bird" / "bird.conf").read_text()
        finally:
            harness.close()
            speaker.stop(withdraw=True)


def test_a_restart_refreshes_the_routes_while_another_peer_never_answers(
    testbed: Testbed, router: FrrRouter, tmp_path: Path
) -> None:
    """After a restart (BIRD in recovery, `-R`), a router whose BGP packets are lost does
    not hold back the refresh of the other router's routes: they do not stay stale."""
    silent = "10.250.0.77"  # the client's too, where every BGP connection to it is dropped
    rules = "table ip lacetest {\n chain in {\n  type filter hook input priority 0;\n"
    rules += f"  ip daddr {silent} tcp dport 179 drop\n }}\n}}\n"
    testbed.exec(testbed.client, ["ip", "addr", "add", f"{silent}/24", "dev", "eth0"])
    testbed.exec(testbed.client, ["nft", "-f", "-"], input=rules)
    settings = LaceBgpConfig(
        enabled=True,
        asn=NODE_ASN,
        peers=(BgpPeer(CLIENT4, ROUTER_ASN, hold_time=9), BgpPeer(silent, ROUTER_ASN)),
        graceful_restart_time=60,
        directory=str(tmp_path / "bird"),
    )
    routes = {"192.0.2.10/32": ()}
    first = Speaker(settings, netns=testbed.node.ns.name)
    second = Speaker(settings, netns=testbed.node.ns.name)
    try:
        first.sync(FACTS, routes, {})
        router.wait_for("the route", lambda: router.routes(4).get("192.0.2.10/32"))
        first.stop()  # graceful: the router keeps the route, stale
        router.wait_for("the route kept, stale", lambda: router.routes(4)["192.0.2.10/32"][2])
        second.sync(FACTS, routes, {})
        router.wait_for(
            "the route refreshed", lambda: router.routes(4)["192.0.2.10/32"][2] is False
        )
        states = {p.address: p.state for p in second.peers()}
        assert states[CLIENT4] == "Established" and states[silent] != "Established"
    finally:
        second.stop(withdraw=True)
        testbed.exec(testbed.client, ["nft", "delete", "table", "ip", "lacetest"])
        testbed.exec(testbed.client, ["ip", "addr", "del", f"{silent}/24", "dev", "eth0"])
