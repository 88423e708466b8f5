"""Pod egress by the node's routes (DESIGN.md §4), on real traffic in the egress testbed.

The controller runs in node-a's namespace as in `lace-proxy run` (its own thread, following
rtnetlink events); pod a1 connects out, and each far end reports the source it saw. Traffic
that stays on the node (to pod ax, outside every pod prefix) must keep a1's source.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyroute2 import IPRoute

from lace_proxy.cli import main
from lace_proxy.dataplane.egress_snat import EgressSettings, EgressSnat
from lace_proxy.dataplane.nft import Nft
from lace_proxy.dataplane.rtnetlink import RtnlChannel
from lace_proxy.demo.testbed import Result, request_tcp, request_udp
from lace_proxy.egress.controller import EgressController
from lace_proxy.egress.routing import IFA_F_SECONDARY, Address, _route, read_snapshot
from lace_proxy.metrics import ProxyMetrics
from testkit.cluster_testbed import A1_4, B1_4, FAR4, NEAR4, NEAR_CIDR4, NODE_A4, NODE_B4
from testkit.egress_testbed import (
    A1_6,
    AX4,
    AX6,
    AX_CIDR4,
    AX_CIDR6,
    AX_GATEWAY4,
    AX_GATEWAY6,
    BEYOND_B4,
    EDGE_A4,
    LAB4,
    LAB_CIDR4,
    LAB_PREFSRC4,
    PLATFORM_A4,
    POD_CIDR6,
    UPLINK_A4,
    EgressTestbed,
)

from ..lacekit import external, l3
from .conftest import skip_unless_capable
from .proxykit import Harness, endpoints, service

pytestmark = pytest.mark.netns

LACE_API = "lace-proxy.lace-cni.io/v1alpha1"
POD_CIDRS = ("10.251.0.0/16", "10.254.0.0/16")


@pytest.fixture(scope="module")
def tb() -> Iterator[EgressTestbed]:
    skip_unless_capable()
    with EgressTestbed() as testbed:
        yield testbed


@pytest.fixture
def start(tb: EgressTestbed) -> Iterator[Callable[..., EgressController]]:
    """Start a controller on node-a with these settings; stopped and cleaned up after."""
    made: list[EgressController] = []
    ns = tb.nodes["node-a"].ns.name

    def make(resync: float = 30.0, **settings: object) -> EgressController:
        settings.setdefault("pod_cidrs", POD_CIDRS)
        snat = EgressSnat(EgressSettings(**settings), Nft(ns))  # type: ignore[arg-type]
        controller = EgressController(snat, netns=ns, metrics=ProxyMetrics(), resync=resync)
        controller.start()
        made.append(controller)
        return controller

    yield make
    for controller in made:
        controller.stop()
        controller.snat.cleanup()


def seen(tb: EgressTestbed, destination: str, udp: bool = False) -> str | None:
    """The source address the far end saw for a new connection from pod a1 (None: no answer)."""
    request = request_udp if udp else request_tcp
    result: Result = request(tb.pods["a1"], destination, 8080, timeout=1.0)
    return result.reply.peer if result.reply else None


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.05)


def test_each_destination_sees_the_source_of_its_route(
    tb: EgressTestbed, start: Callable[..., EgressController]
) -> None:
    # Without lace-proxy: the pod's own address; the edge cannot answer it.
    assert seen(tb, FAR4) == A1_4
    assert seen(tb, LAB4) is None
    start()
    assert seen(tb, FAR4) == NODE_A4  # default route: the cluster-host address
    assert seen(tb, FAR4, udp=True) == NODE_A4
    assert seen(tb, LAB4) == UPLINK_A4  # a route on eth1 without src: eth1's address
    assert seen(tb, LAB_PREFSRC4) == PLATFORM_A4  # its own src, which masquerade would not pick
    # Through another node as the gateway: node-b forwards without re-sourcing, so the far
    # end sees node-a's address (and must route it back, here via node-b).
    assert seen(tb, BEYOND_B4) == NODE_A4
    # Pod to pod, also across nodes, is not translated.
    assert seen(tb, B1_4) == A1_4


def test_a_route_change_flips_the_source_without_a_restart(
    tb: EgressTestbed, start: Callable[..., EgressController]
) -> None:
    controller = start()
    node = tb.nodes["node-a"]
    assert seen(tb, LAB4) == UPLINK_A4
    route = [LAB_CIDR4, "via", EDGE_A4, "dev", "eth1"]
    tb.exec(node, ["ip", "route", "replace", *route, "src", PLATFORM_A4])
    try:
        wait_for(lambda: seen(tb, LAB4) == PLATFORM_A4)
        assert controller.errors == 0
    finally:
        tb.exec(node, ["ip", "route", "replace", *route])
    wait_for(lambda: seen(tb, LAB4) == UPLINK_A4)
    # A route that goes away takes its range with it: the default route's source applies.
    tb.exec(node, ["ip", "route", "del", LAB_CIDR4])
    try:
        wait_for(lambda: source_of(controller, LAB4) == NODE_A4)
    finally:
        tb.exec(node, ["ip", "route", "add", *route])
    wait_for(lambda: seen(tb, LAB4) == UPLINK_A4)


def test_a_flood_of_address_events_does_not_hide_the_route_change_behind_it(
    tb: EgressTestbed, start: Callable[..., EgressController], caplog: pytest.LogCaptureFixture
) -> None:
    """IPVS mode's dummy interface gains thousands of addresses at a cold start, each an
    event or two, more than the event socket's buffer holds (ENOBUFS): the route change
    that comes last still reaches the table, and the event socket goes on (an overflow
    only says: read everything again)."""
    controller = start()
    node = tb.nodes["node-a"]
    assert seen(tb, LAB4) == UPLINK_A4
    route = f"{LAB_CIDR4} via {EDGE_A4} dev eth1"
    flood = ["link add spare0 type veth peer name spare1"]
    flood += [f"addr add 10.96.{i // 250}.{i % 250 + 1}/32 dev spare0" for i in range(3000)]
    flood += [f"route replace {route} src {PLATFORM_A4}"]
    tb.exec(node, ["ip", "-batch", "-"], input="\n".join(flood) + "\n")
    try:
        wait_for(lambda: seen(tb, LAB4) == PLATFORM_A4)
        assert controller.errors == 0
        assert "route events lost" not in caplog.text
    finally:
        tb.exec(node, ["ip", "-batch", "-"], input=f"link del spare0\nroute replace {route}\n")
    wait_for(lambda: seen(tb, LAB4) == UPLINK_A4)


def test_non_masquerade_cidrs_are_left_alone(
    tb: EgressTestbed, start: Callable[..., EgressController]
) -> None:
    start(non_masquerade_cidrs=(NEAR_CIDR4,))
    assert seen(tb, NEAR4) == A1_4  # left alone: near routes pods back through the fabric
    assert seen(tb, FAR4) == NODE_A4


def test_pods_of_lace_pod_networks_without_cluster_cidr(
    tb: EgressTestbed, start: Callable[..., EgressController]
) -> None:
    """No clusterCIDR: the pod sources are the Lace pod networks' prefixes the proxier hands
    over at each sync; a network that goes away takes its pods' translation with it."""
    controller = start(pod_cidrs=())
    assert seen(tb, FAR4) == A1_4
    controller.set_pod_networks(("10.251.0.0/16", "10.254.0.0/16"))
    wait_for(lambda: seen(tb, FAR4) == NODE_A4)
    assert seen(tb, B1_4) == A1_4  # another pod network's address: not translated
    controller.set_pod_networks(("10.254.0.0/16",))
    wait_for(lambda: seen(tb, FAR4) == A1_4)


def test_the_proxier_hands_over_the_pod_networks_of_network_objects(
    tb: EgressTestbed, start: Callable[..., EgressController], tmp_path: Path
) -> None:
    controller = start(pod_cidrs=())
    proxy = Harness(
        tb,
        tmp_path / "manifests",
        node=tb.nodes["node-a"],
        node_name="node-a",
        pod_networks=controller.set_pod_networks,
    )
    try:
        proxy.write("networks", l3("default", "10.251.0.0/16"), external("internet", "0.0.0.0/0"))
        proxy.sync()
        assert controller.pod_networks == ("10.251.0.0/16",)
        wait_for(lambda: seen(tb, FAR4) == NODE_A4)
        proxy.remove("networks")
        proxy.sync()
        wait_for(lambda: seen(tb, FAR4) == A1_4)
    finally:
        proxy.close()


def test_the_table_comes_back_when_deleted(
    tb: EgressTestbed, start: Callable[..., EgressController]
) -> None:
    """Someone deletes the table: the next resync (here 1 s) writes it again."""
    start(resync=1.0)
    tb.exec(tb.nodes["node-a"], ["nft", "delete", "table", "inet", "lace-proxy-egress"])
    assert seen(tb, FAR4) == A1_4
    wait_for(lambda: seen(tb, FAR4) == NODE_A4)


# -- Traffic that stays on the node keeps the pod's source -----------------------------------

CLUSTER_CIDRS = (*POD_CIDRS, POD_CIDR6)
CLUSTER_IPS = {4: "10.96.0.60", 6: "fd00:96::60"}
A1 = {4: A1_4, 6: A1_6}
AX = {4: AX4, 6: AX6}
AX_GATEWAY = {4: AX_GATEWAY4, 6: AX_GATEWAY6}  # vax's address: the source a SNAT would pick


@contextlib.contextmanager
def ax_behind_a_cluster_ip(
    tb: EgressTestbed, folder: Path, controller: EgressController
) -> Iterator[Harness]:
    """The proxy on node-a serving a dual-stack ClusterIP whose endpoint is pod ax (a1's
    connection to it is not masqueraded by the service table, a1 being in clusterCIDR, nor
    by the egress table, which leaves service traffic to the proxy)."""
    proxy = Harness(
        tb,
        folder,
        node=tb.nodes["node-a"],
        node_name="node-a",
        cluster_cidrs=CLUSTER_CIDRS,
        pod_networks=controller.set_pod_networks,
        node_pod_cidrs=controller.set_node_pod_cidrs,
    )
    try:
        ax = tb.pods["ax"]
        svc = service("ax", list(CLUSTER_IPS.values()), port=8080)
        proxy.write("ax", svc, endpoints("ax", [ax]), endpoints("ax", [ax], v6=True))
        proxy.sync()
        yield proxy
    finally:
        proxy.close()


def seen_by_ax(tb: EgressTestbed, family: int) -> tuple[str | None, str | None]:
    """The source ax saw for a new TCP connection from a1 to the ClusterIP, and straight."""
    via_service = request_tcp(tb.pods["a1"], CLUSTER_IPS[family], 8080, timeout=1.0)
    assert via_service.reply is None or via_service.reply.name == "ax", via_service
    return (
        via_service.reply.peer if via_service.reply else None,
        seen(tb, AX[family]),
    )


@pytest.mark.parametrize("family", [4, 6])
def test_a_local_pod_outside_the_pod_prefixes_sees_the_client_pod(
    tb: EgressTestbed, start: Callable[..., EgressController], tmp_path: Path, family: int
) -> None:
    """ax's interface is a pod interface by detectLocal.interfaceNamePrefix ("v"): packets out
    of it are not translated, while traffic leaving the node still is."""
    controller = start(pod_cidrs=CLUSTER_CIDRS, pod_interface_prefix="v")
    with ax_behind_a_cluster_ip(tb, tmp_path / "manifests", controller):
        assert seen_by_ax(tb, family) == (A1[family], A1[family])
    assert controller.pod_interfaces == ("va1", "va2", "vablue")  # vax only by the prefix
    assert seen(tb, FAR4) == NODE_A4


@pytest.mark.parametrize("family", [4, 6])
def test_pod_interfaces_follow_the_routes_and_the_nodes_pod_cidrs(
    tb: EgressTestbed, start: Callable[..., EgressController], tmp_path: Path, family: int
) -> None:
    """Without interfaceNamePrefix, an interface the node routes a pod prefix through on-link
    is a pod interface: known once the route is there (route events), or once the Node's
    podCIDRs cover ax's addresses. Known neither way, a1's own connections to ax are
    translated; those through the ClusterIP never are (service traffic, the proxy's)."""
    controller = start(pod_cidrs=CLUSTER_CIDRS)
    node = tb.nodes["node-a"]
    untranslated = (A1[family], A1[family])
    translated = (A1[family], AX_GATEWAY[family])
    with ax_behind_a_cluster_ip(tb, tmp_path / "manifests", controller) as proxy:
        assert seen_by_ax(tb, family) == translated
        assert controller.pod_interfaces == ("va1", "va2", "vablue")
        # The CNI routes a clusterCIDR address (a second one of ax's) to ax's interface.
        in_cluster = {4: "10.251.1.13/32", 6: "fd00:251:0:1::13/128"}[family]
        tb.exec(node, ["ip", "route", "add", in_cluster, "dev", "vax"])
        try:
            wait_for(lambda: seen_by_ax(tb, family) == untranslated)
        finally:
            tb.exec(node, ["ip", "route", "del", in_cluster, "dev", "vax"])
        wait_for(lambda: seen_by_ax(tb, family) == translated)
        # The Node's podCIDRs, from the proxier: ax's /32 and /128 routes lie inside them.
        node_a = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}
        proxy.write("node", {**node_a, "spec": {"podCIDRs": [AX_CIDR4, AX_CIDR6]}})
        proxy.sync()
        wait_for(lambda: seen_by_ax(tb, family) == untranslated)
        assert controller.pod_interfaces == ("va1", "va2", "vablue", "vax")
        proxy.remove("node")
        proxy.sync()
        wait_for(lambda: seen_by_ax(tb, family) == translated)
    assert seen(tb, FAR4) == NODE_A4


def source_of(controller: EgressController, address: str) -> str | None:
    """The source the programmed map gives `address` (IPv4)."""
    ip = ipaddress.ip_address(address)
    for first, last, source in (controller.programmed or {}).get(4, []):
        if ipaddress.ip_address(first) <= ip <= ipaddress.ip_address(last):
            return source
    return None


# -- lace-proxy doctor egress, against the same routes and the traffic's own answer ----------


def doctor(
    tb: EgressTestbed,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    destination: str,
    routable: tuple[str, ...] = (),
) -> tuple[int, dict[str, Any]]:
    folder = tmp_path / "manifests"
    folder.mkdir(exist_ok=True)
    nodes = [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name},
            "status": {"addresses": [{"type": "InternalIP", "address": address}]},
        }
        for name, address in (("node-a", NODE_A4), ("node-b", NODE_B4))
    ]
    (folder / "nodes.yaml").write_text(yaml.safe_dump_all(nodes))
    config = tmp_path / "proxy.yaml"
    doc = {
        "apiVersion": LACE_API,
        "kind": "KubeProxyConfiguration",
        "lace": {"egress": {"routablePrefixes": list(routable)}},
    }
    config.write_text(yaml.safe_dump(doc))
    argv = ["doctor", "egress", "--pod", A1_4, "--to", destination, "-o", "json"]
    argv += ["--netns", tb.nodes["node-a"].ns.name, "--config", str(config)]
    argv += ["--cluster-cidr", POD_CIDRS[0], "--hostname-override", "node-a"]
    argv += ["--manifests", str(folder)]
    code = main(argv)
    out = capsys.readouterr()
    assert code in (0, 1), out.err
    return code, json.loads(out.out)


def codes(report: dict[str, Any]) -> list[str]:
    return [f["code"] for f in report["findings"]]


def test_doctor_says_the_source_the_far_end_sees(
    tb: EgressTestbed,
    start: Callable[..., EgressController],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    start()
    routable = ("10.250.0.0/24", "192.0.2.0/24")
    code, report = doctor(tb, tmp_path, capsys, LAB4, routable)
    assert (code, codes(report)) == (0, [])
    assert report["route"]["interface"] == "eth1" and report["translated"]
    assert report["source"] == seen(tb, LAB4) == UPLINK_A4
    # The platform address is not among the routable prefixes: flagged, with what to do.
    code, report = doctor(tb, tmp_path, capsys, LAB_PREFSRC4, routable)
    assert (code, codes(report)) == (1, ["source_not_routable"])
    assert report["source"] == seen(tb, LAB_PREFSRC4) == PLATFORM_A4
    assert "advertise 172.16.0.11's prefix" in report["findings"][0]["action"]


def test_doctor_flags_another_node_as_the_next_hop(
    tb: EgressTestbed,
    start: Callable[..., EgressController],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    start()
    code, report = doctor(tb, tmp_path, capsys, BEYOND_B4)
    assert (code, codes(report)) == (1, ["next_hop_is_a_node"])
    assert report["route"]["gateway"] == NODE_B4
    assert report["source"] == seen(tb, BEYOND_B4) == NODE_A4
    assert "node node-b, which forwards without re-sourcing" in report["findings"][0]["message"]


def test_doctor_says_where_a_blackhole_route_drops_it(
    tb: EgressTestbed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = tb.nodes["node-a"]
    tb.exec(node, ["ip", "route", "add", "blackhole", "198.18.0.128/25"])
    try:
        code, report = doctor(tb, tmp_path, capsys, "198.18.0.200")
        assert (code, codes(report)) == (1, ["dropped_by_route"])
        assert report["route"]["kind"] == "blackhole" and report["source"] is None
        code, report = doctor(tb, tmp_path, capsys, LAB4)  # the rest of the /24 still goes out
        assert (code, report["source"]) == (0, UPLINK_A4)
    finally:
        tb.exec(node, ["ip", "route", "del", "blackhole", "198.18.0.128/25"])


def test_doctor_flags_a_path_mtu_below_the_pods(
    tb: EgressTestbed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = tb.nodes["node-a"]
    tb.exec(node, ["ip", "link", "set", "eth1", "mtu", "1400"])
    try:
        code, report = doctor(tb, tmp_path, capsys, LAB4)
    finally:
        tb.exec(node, ["ip", "link", "set", "eth1", "mtu", "1500"])
    assert (code, codes(report)) == (1, ["mtu_mismatch"])
    assert report["pathMTU"] == 1400
    assert "MTU to 1400 or less" in report["findings"][0]["action"]
    code, report = doctor(tb, tmp_path, capsys, LAB4)
    assert (code, codes(report)) == (0, [])


def test_a_failing_nft_is_counted_retried_and_recovered(tb: EgressTestbed) -> None:
    """nft cannot run (here: not installed where it is looked for): the failure is logged and
    counted, the thread keeps retrying with backoff, and the table appears once nft works."""
    ns = tb.nodes["node-a"].ns.name
    metrics = ProxyMetrics()
    snat = EgressSnat(EgressSettings(pod_cidrs=POD_CIDRS), Nft(ns, binary="/nonexistent/nft"))
    controller = EgressController(snat, netns=ns, metrics=metrics)
    controller.start()
    try:
        assert controller.errors >= 1 and controller.programmed is None
        assert 'lace_proxy_egress_syncs_total{result="error"}' in metrics.exposition()[0].decode()
        assert seen(tb, FAR4) == A1_4
        snat.nft = Nft(ns)  # nft is installed
        wait_for(lambda: seen(tb, FAR4) == NODE_A4, timeout=15)
        wait_for(lambda: controller.syncs == 1)
    finally:
        controller.stop()
        controller.stop()  # idempotent
        snat.cleanup()


def test_a_route_without_a_source_is_masqueraded(
    tb: EgressTestbed, start: Callable[..., EgressController]
) -> None:
    """A route out of an interface without addresses has no preferred source: no map element,
    so the fallback `masquerade` lets the kernel choose (conntrack shows the translation)."""
    node = tb.nodes["node-a"]
    tb.exec(node, ["ip", "link", "add", "nx0", "type", "veth", "peer", "name", "nx1"])
    try:
        for link in ("nx0", "nx1"):
            tb.exec(node, ["ip", "link", "set", link, "up"])
        tb.exec(node, ["ip", "route", "add", "198.18.9.0/24", "dev", "nx0"])
        controller = start()
        wait_for(lambda: source_of(controller, "198.18.9.1") is None and controller.syncs > 0)
        request_udp(tb.pods["a1"], "198.18.9.1", 8080, timeout=0.2)
        flows = tb.exec(node, ["conntrack", "-L", "-p", "udp", "-d", "198.18.9.1"]).stdout
        assert f"src={A1_4}" in flows, flows
        reply_dst = flows.split("src=198.18.9.1 dst=")[1].split()[0]
        assert reply_dst != A1_4, flows  # translated, by the kernel's choice
    finally:
        tb.exec(node, ["ip", "link", "del", "nx0"])


#: Routes the snapshot must read (multipath, a blackhole, IPv6 with an MTU) and one it must
#: not (another table), a secondary address, and an interface holding many addresses and no
#: route (as IPVS mode's dummy interface): none of its addresses is read.
SNAPSHOT_SETUP = [
    f"route add 203.0.113.0/24 nexthop via {EDGE_A4} dev eth1 nexthop via {NODE_B4}",
    "route add blackhole 198.18.2.0/24",
    "route add 2001:db8:77::/48 dev eth1 mtu 1280",
    f"route add 198.18.3.0/24 via {EDGE_A4} dev eth1 table 77",
    "addr add 192.0.2.200/24 dev eth1",
    "link add spare0 type veth peer name spare1",
    *(f"addr add 10.96.{i // 250}.{i % 250 + 1}/32 dev spare0" for i in range(600)),
]


def _pyroute2_snapshot() -> tuple[list[Any], list[Address], list[tuple[str, int]]]:
    """What the snapshot should hold, from pyroute2's reading of every table and address:
    the main table's routes as the snapshot takes them, the addresses of the interfaces
    they leave by, each interface's MTU."""
    with IPRoute() as ipr:
        links = list(ipr.get_links())
        names = {int(link["index"]): str(link.get("IFLA_IFNAME")) for link in links}
        routes = [
            route
            for family in (socket.AF_INET, socket.AF_INET6)
            for msg in ipr.get_routes(family=family)
            if (route := _route(msg, names)) is not None
        ]
        routed = {r.interface for r in routes}
        addresses = [
            Address(
                names[int(msg["index"])],
                str(ipaddress.ip_address(msg.get("IFA_LOCAL") or msg.get("IFA_ADDRESS"))),
                int(msg["prefixlen"]),
                not int(msg["flags"]) & IFA_F_SECONDARY,
                int(msg["scope"]),
            )
            for msg in ipr.get_addr()
            if names[int(msg["index"])] in routed
        ]
        mtus = [(str(link.get("IFLA_IFNAME")), int(link.get("IFLA_MTU"))) for link in links]
    return routes, addresses, mtus


def _read_both() -> tuple[Any, tuple[list[Any], list[Address], list[tuple[str, int]]]]:
    with RtnlChannel() as rtnl:
        ours = read_snapshot(rtnl)
    return ours, _pyroute2_snapshot()


def test_the_snapshot_reads_the_main_table_and_the_routed_interfaces_addresses(
    tb: EgressTestbed,
) -> None:
    """read_snapshot asks the kernel for the main table and for each routed interface's
    addresses; what it reads is what pyroute2 reads of everything, filtered the same way."""
    node = tb.nodes["node-a"]
    tb.exec(node, ["ip", "-batch", "-"], input="\n".join(SNAPSHOT_SETUP) + "\n")
    try:
        ours, (routes, addresses, mtus) = node.ns.call(_read_both)
    finally:
        cleanup = ["link del spare0", "addr del 192.0.2.200/24 dev eth1"]
        cleanup += [line.replace(" add ", " del ", 1) for line in SNAPSHOT_SETUP[:4]]
        tb.exec(node, ["ip", "-force", "-batch", "-"], input="\n".join(cleanup) + "\n")
    assert list(ours.routes) == routes
    kinds = {(r.dst, r.kind, r.mtu) for r in ours.routes}
    assert {("198.18.2.0/24", "blackhole", 0), ("2001:db8:77::/48", "unicast", 1280)} <= kinds
    assert "198.18.3.0/24" not in {r.dst for r in ours.routes}  # table 77's

    def by_interface(a: Address) -> tuple[str, bool]:  # the kernel's order within each
        return a.interface, ":" in a.address

    assert sorted(ours.addresses, key=by_interface) == sorted(addresses, key=by_interface)
    assert Address("eth1", "192.0.2.200", 24, False) in ours.addresses  # secondary
    assert "spare0" not in {a.interface for a in ours.addresses}
    assert dict(ours.mtus) == dict(mtus) and dict(ours.mtus)["spare0"] == 1500
    assert ours.source(next(r for r in ours.routes if r.dst == "203.0.113.0/24")) == UPLINK_A4
