"""The nftables dataplane on real traffic: every frontend kind and behaviour of kube-proxy.

Each test programs the testbed's node through the proxy's own pipeline (manifest folder →
files source → table → proxier → nftables) and asserts on what servers in the pods saw.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lace_proxy.app import nftables_settings
from lace_proxy.config import load_config
from lace_proxy.dataplane.nftables.parts import holders
from lace_proxy.demo.testbed import (
    CLIENT4,
    CLIENT6,
    GWLINK_NODE4,
    POD_CIDR4,
    POD_CIDR6,
    POD_GATEWAY4,
    POD_GATEWAY6,
    SERVICE_CIDR4,
    SERVICE_CIDR6,
    UPLINK_NODE4,
    UPLINK_NODE6,
    Host,
    Testbed,
    request_tcp,
    request_udp,
)

from ..conftest import MODES
from ..helpers import api_service_cidr
from .proxykit import (
    EXT4,
    EXT6,
    LB4,
    LB6,
    NODE,
    OTHER_NODE,
    VIP4,
    VIP6,
    Harness,
    endpoints,
    many,
    names,
    service,
    udp_exchange,
)

pytestmark = pytest.mark.netns
#: Why some behaviour is nftables mode's alone.
TRANSLATED_HERE = "IPVS mode has no nftables state of this kind"

FAMILIES = pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])


def vip(v6: bool) -> str:
    return VIP6 if v6 else VIP4


@pytest.fixture
def tb(make_testbed: Callable[..., Testbed]) -> Testbed:
    return make_testbed(pods=3)


@pytest.fixture(params=[*MODES, "split"])
def proxy(request: pytest.FixtureRequest, tb: Testbed, tmp_path: Path) -> Iterator[Harness]:
    """The proxy in each mode: nftables here, IPVS inside the VM (tests/vm); "split" is
    nftables mode with its biggest containers split in four, as at scale (parts.py)."""
    mode = request.param
    marker = request.node.get_closest_marker("nftables_only")
    if mode == "ipvs" and marker is not None:
        pytest.skip(f"nftables mode only: {marker.args[0]}")
    if mode == "split":
        harness = Harness(tb, tmp_path / "manifests", parts=4)
    else:
        harness = Harness(tb, tmp_path / "manifests", mode=mode)
    yield harness
    harness.close()


def web(proxy: Harness, *, v6: bool = False, **spec: object) -> None:
    """A dual-stack service `web` over all three pods."""
    tb = proxy.tb
    proxy.write(
        "web",
        service("web", [VIP4, VIP6], **spec),  # type: ignore[arg-type]
        endpoints("web", tb.pods),
        endpoints("web", tb.pods, v6=True),
    )
    proxy.sync()


@FAMILIES
def test_cluster_ip_reaches_pods_from_client_pod_and_node(proxy: Harness, v6: bool) -> None:
    web(proxy)
    tb = proxy.tb
    pods = {p.name for p in tb.pods}
    gateway = POD_GATEWAY6 if v6 else POD_GATEWAY4
    from_client = request_tcp(tb.client, vip(v6), 80)
    assert from_client.outcome == "reply", from_client
    assert from_client.reply is not None and from_client.reply.name in pods
    assert from_client.reply.port == 8080
    # Off-cluster source (not in clusterCIDR): masqueraded to the node.
    assert from_client.reply.peer == gateway
    # A pod's own address is kept.
    pod = tb.pods[0]
    replies = [r.reply for r in many(pod, vip(v6), 80, n=12) if r.reply]
    assert len(replies) == 12
    others = [r for r in replies if r.name != pod.name]
    assert others and all(r.peer == (pod.ipv6 if v6 else pod.ipv4) for r in others)
    from_node = request_tcp(tb.node, vip(v6), 80)
    assert from_node.reply is not None and from_node.reply.name in pods


@FAMILIES
def test_a_pod_keeps_its_source_to_an_endpoint_outside_the_cluster_cidr(
    proxy: Harness, v6: bool
) -> None:
    """detectLocalMode ClusterCIDR, as kube-proxy: a pod's connection to a ClusterIP whose
    endpoint is off the node and outside clusterCIDR (the client) is not masqueraded, in
    either family (issue 31 named an IPv6 case)."""
    tb = proxy.tb
    proxy.write(
        "outside",
        service("outside", [VIP4, VIP6], port=80, target=80),
        endpoints("outside", [tb.client], port=80),
        endpoints("outside", [tb.client], port=80, v6=True),
    )
    proxy.sync()
    pod = tb.pods[0]
    for result in many(pod, vip(v6), 80, n=6):
        assert result.reply is not None and result.reply.name == "client", result
        assert result.reply.peer == (pod.ipv6 if v6 else pod.ipv4), result


@FAMILIES
def test_udp_cluster_ip(proxy: Harness, v6: bool) -> None:
    tb = proxy.tb
    proxy.write(
        "dns",
        service("dns", [VIP4, VIP6], port=53, target=8080, protocol="UDP"),
        endpoints("dns", tb.pods[:1], protocol="UDP"),
        endpoints("dns", tb.pods[:1], protocol="UDP", v6=True),
    )
    proxy.sync()
    result = request_udp(tb.client, vip(v6), 53)
    assert result.reply is not None and result.reply.name == "pod1", result
    # TCP on the same port is not a service port of this ClusterIP: refused at once.
    refused = request_tcp(tb.client, vip(v6), 53)
    assert refused.outcome == "refused", refused


def test_every_endpoint_gets_traffic(proxy: Harness) -> None:
    web(proxy)
    seen = names(many(proxy.tb.client, VIP4, 80, n=60))
    assert set(seen) == {"pod1", "pod2", "pod3"}, seen


@FAMILIES
def test_node_port_external_ip_and_load_balancer_reach_pods(proxy: Harness, v6: bool) -> None:
    web(
        proxy,
        type="LoadBalancer",
        node_port=30080,
        externalIPs=[EXT4, EXT6],
        status={"loadBalancer": {"ingress": [{"ip": LB4}, {"ip": LB6}]}},
    )
    tb = proxy.tb
    gateway = POD_GATEWAY6 if v6 else POD_GATEWAY4
    targets = [
        (UPLINK_NODE6 if v6 else UPLINK_NODE4, 30080),
        (EXT6 if v6 else EXT4, 80),
        (LB6 if v6 else LB4, 80),
    ]
    for address, port in targets:
        results = many(tb.client, address, port, n=30)
        assert set(names(results)) == {"pod1", "pod2", "pod3"}, (address, names(results))
        # externalTrafficPolicy Cluster: external traffic is masqueraded.
        assert {r.reply.peer for r in results if r.reply} == {gateway}


def test_an_address_given_twice_is_one_frontend(proxy: Harness) -> None:
    """An ExternalIP equal to the ClusterIP, or repeated, or also a load-balancer IP, is one
    frontend: the sync goes through (a kernel map refuses a key twice) and all of them serve."""
    web(
        proxy,
        type="LoadBalancer",
        externalIPs=[VIP4, EXT4, EXT4, LB4],
        status={"loadBalancer": {"ingress": [{"ip": LB4}, {"ip": LB4}, {"ip": VIP4}]}},
    )
    for address in (VIP4, EXT4, LB4):
        seen = names(many(proxy.tb.client, address, 80, n=30))
        assert set(seen) == {"pod1", "pod2", "pod3"}, (address, seen)


def test_node_port_does_not_answer_on_other_ports_or_loopback(proxy: Harness) -> None:
    web(proxy, type="NodePort", node_port=30080)
    tb = proxy.tb
    # 30080 on loopback is not a NodePort (kube-proxy parity): the node's own server answers.
    local = request_tcp(tb.node, "127.0.0.1", 30080)
    assert local.reply is not None and local.reply.name == "node", local
    # Another port on the node address reaches the node's own server, untouched.
    other = request_tcp(tb.client, UPLINK_NODE4, 8080)
    assert other.reply is not None and other.reply.name == "node", other


def test_client_ip_affinity_pins_a_client(proxy: Harness) -> None:
    web(
        proxy,
        type="LoadBalancer",
        node_port=30080,
        status={"loadBalancer": {"ingress": [{"ip": LB4}]}},
        sessionAffinity="ClientIP",
        sessionAffinityConfig={"clientIP": {"timeoutSeconds": 60}},
    )
    tb = proxy.tb
    # Every frontend kind pins (IPv6 too, through kube-proxy's per-endpoint layout), and
    # external traffic is still masqueraded (policy Cluster).
    for address, port in ((UPLINK_NODE4, 30080), (LB4, 80), (VIP6, 80)):
        results = many(tb.client, address, port, n=15)
        assert len(names(results)) == 1, address
        if address != VIP6:
            assert {r.reply.peer for r in results if r.reply} == {POD_GATEWAY4}, address
    seen = names(many(tb.client, VIP4, 80, n=30))
    assert len(seen) == 1 and next(iter(seen)).startswith("pod"), seen
    # Another client (a pod) gets its own pick, and keeps it too.
    assert len(names(many(tb.pods[0], VIP4, 80, n=15))) == 1
    # The periodic full resync keeps the remembered choices.
    for _ in range(3):
        proxy.sync(full=True)
        assert names(many(tb.client, VIP4, 80, n=10)).keys() == seen.keys()


@FAMILIES
def test_service_without_endpoints_is_refused_at_once(proxy: Harness, v6: bool) -> None:
    tb = proxy.tb
    proxy.write(
        "empty",
        service("empty", [VIP4, VIP6], type="NodePort", node_port=30081),
        endpoints("empty", [], name="empty-v4"),
    )
    proxy.sync()
    for result in (
        request_tcp(tb.client, vip(v6), 80),
        request_udp(tb.client, vip(v6), 80),
        request_tcp(tb.pods[0], vip(v6), 80),
        request_tcp(tb.node, vip(v6), 80),
        request_tcp(tb.client, UPLINK_NODE6 if v6 else UPLINK_NODE4, 30081),
    ):
        assert result.outcome == "refused", result
        assert result.elapsed < 1.0  # an ICMP error, not a timeout (2 s)


@pytest.mark.nftables_only(
    "IPVS balances eTP Local frontends over local endpoints for every client (no short-circuit)"
)
def test_external_traffic_policy_local(proxy: Harness) -> None:
    tb = proxy.tb
    spec: dict[str, Any] = {
        "type": "LoadBalancer",
        "node_port": 30080,
        "externalTrafficPolicy": "Local",
        "status": {"loadBalancer": {"ingress": [{"ip": LB4}]}},
    }
    remote = endpoints("local", tb.pods[1:], node=OTHER_NODE, name="local-b")

    def served(where: Host, address: str, port: int, pinned: bool) -> bool:
        """By the remote endpoints: both, or one alone when affinity pins the client."""
        answered = set(names(many(where, address, port, n=20)))
        return answered <= {"pod2", "pod3"} and len(answered) == (1 if pinned else 2)

    def program(*slices: dict[str, Any]) -> None:
        proxy.write("local", service("local", [VIP4], **spec), *slices)
        proxy.sync()

    program(endpoints("local", tb.pods[:1], name="local-a"), remote)
    for address, port in ((UPLINK_NODE4, 30080), (LB4, 80)):
        results = many(tb.client, address, port, n=20)
        assert names(results) == {"pod1": 20}, address
        # The client's address is preserved (no masquerade under Local).
        assert {r.reply.peer for r in results if r.reply} == {CLIENT4}
    # Pods reaching the load balancer address are short-circuited to every endpoint. (The
    # client is this node's pod1: a pod the slices place on another node reaches itself
    # through that node only, which masquerades it, not through this one.)
    assert set(names(many(tb.pods[0], LB4, 80, n=40))) == {"pod1", "pod2", "pod3"}
    # Cluster traffic to the ClusterIP still uses every endpoint.
    assert set(names(many(tb.pods[0], VIP4, 80, n=40))) == {"pod1", "pod2", "pod3"}
    # No local endpoint: external traffic is dropped, never sent off-node; pods and the node
    # itself are short-circuited to the (remote) endpoints, as kube-proxy does; also with
    # ClientIP affinity (kube-proxy's per-endpoint layout).
    for affinity in ("None", "ClientIP"):
        spec["sessionAffinity"] = affinity
        program(remote)
        for address, port in ((UPLINK_NODE4, 30080), (LB4, 80)):
            dropped = request_tcp(tb.client, address, port, timeout=1.0)
            assert dropped.outcome == "timeout", dropped
            # (pod1 asks: no longer an endpoint, it is this node's pod, as a client is.)
            assert served(tb.pods[0], address, port, pinned=affinity == "ClientIP")
        assert served(tb.node, LB4, 80, pinned=affinity == "ClientIP")


def test_internal_traffic_policy_local(proxy: Harness) -> None:
    tb = proxy.tb
    proxy.write(
        "itp",
        service("itp", [VIP4], internalTrafficPolicy="Local"),
        endpoints("itp", tb.pods[:1], name="itp-a"),
        endpoints("itp", tb.pods[1:], node=OTHER_NODE, name="itp-b"),
    )
    proxy.sync()
    assert names(many(tb.pods[1], VIP4, 80, n=20)) == {"pod1": 20}
    proxy.write(
        "itp",
        service("itp", [VIP4], internalTrafficPolicy="Local"),
        endpoints("itp", tb.pods[1:], node=OTHER_NODE, name="itp-b"),
    )
    proxy.sync()
    assert request_tcp(tb.pods[1], VIP4, 80, timeout=1.0).outcome == "timeout"


@FAMILIES
def test_load_balancer_source_ranges(proxy: Harness, v6: bool) -> None:
    tb = proxy.tb
    lb = LB6 if v6 else LB4
    lb_spec = {
        "type": "LoadBalancer",
        "node_port": 30080,
        "status": {"loadBalancer": {"ingress": [{"ip": LB4}, {"ip": LB6}]}},
    }
    web(proxy, loadBalancerSourceRanges=[f"{CLIENT4}/32", f"{CLIENT6}/128"], **lb_spec)
    assert request_tcp(tb.client, lb, 80).outcome == "reply"
    web(proxy, loadBalancerSourceRanges=["10.99.0.0/24", "fd00:99::/64"], **lb_spec)
    assert request_tcp(tb.client, lb, 80, timeout=1.0).outcome == "timeout"
    # The ranges guard only the load balancer address.
    assert request_tcp(tb.client, vip(v6), 80).outcome == "reply"


@FAMILIES
def test_source_ranges_covering_the_node_let_it_reach_its_own_lb_ip(
    proxy: Harness, v6: bool
) -> None:
    """A VIP-style load balancer puts the LB IP on the node: the node's own connection to it
    then has the LB IP as its source, which the ranges let in if they cover the node."""
    tb = proxy.tb
    lb = LB6 if v6 else LB4
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": UPLINK_NODE4},
                {"type": "InternalIP", "address": UPLINK_NODE6},
            ]
        },
    }
    proxy.write("node", node)
    tb.exec(tb.node, ["ip", "addr", "add", f"{lb}/{128 if v6 else 32}", "dev", "lo"])
    lb_spec = {
        "type": "LoadBalancer",
        "node_port": 30080,
        "status": {"loadBalancer": {"ingress": [{"ip": LB4}, {"ip": LB6}]}},
    }
    # Ranges that do not cover the node: its connection (from the LB IP) is dropped.
    web(proxy, loadBalancerSourceRanges=[f"{CLIENT4}/32", f"{CLIENT6}/128"], **lb_spec)
    assert request_tcp(tb.node, lb, 80, timeout=1.0).outcome == "timeout"
    # Ranges that cover the node's address: the node is let in, the client stays out.
    web(proxy, loadBalancerSourceRanges=[f"{UPLINK_NODE4}/32", f"{UPLINK_NODE6}/128"], **lb_spec)
    from_node = request_tcp(tb.node, lb, 80)
    assert from_node.outcome == "reply", from_node
    assert request_tcp(tb.client, lb, 80, timeout=1.0).outcome == "timeout"
    # Another source outside the ranges (a pod) stays dropped too.
    assert request_tcp(tb.pods[0], lb, 80, timeout=1.0).outcome == "timeout"


def test_hairpin_traffic_is_masqueraded(proxy: Harness) -> None:
    tb = proxy.tb
    proxy.write("solo", service("solo", [VIP4]), endpoints("solo", tb.pods[:1], name="solo-v4"))
    proxy.sync()
    result = request_tcp(tb.pods[0], VIP4, 80)
    assert result.reply is not None and result.reply.name == "pod1", result
    assert result.reply.peer == POD_GATEWAY4  # not pod1's own address


def test_terminating_endpoints_serve_only_when_nothing_is_ready(proxy: Harness) -> None:
    tb = proxy.tb
    ready = endpoints("t", tb.pods[:1], name="t-a")
    leaving = endpoints("t", tb.pods[1:2], name="t-b", ready=False, serving=True, terminating=True)
    proxy.write("t", service("t", [VIP4]), ready, leaving)
    proxy.sync()
    assert names(many(tb.client, VIP4, 80, n=20)) == {"pod1": 20}
    proxy.write("t", service("t", [VIP4]), leaving)
    proxy.sync()
    assert names(many(tb.client, VIP4, 80, n=10)) == {"pod2": 10}


@pytest.mark.nftables_only(TRANSLATED_HERE)
def test_manifest_edits_change_the_kernel(proxy: Harness) -> None:
    tb = proxy.tb
    web(proxy)
    assert set(names(many(tb.client, VIP4, 80, n=40))) == {"pod1", "pod2", "pod3"}
    # An endpoint removed: it never answers again.
    proxy.write(
        "web",
        service("web", [VIP4, VIP6]),
        endpoints("web", tb.pods[:2]),
        endpoints("web", tb.pods, v6=True),
    )
    proxy.sync()
    assert set(names(many(tb.client, VIP4, 80, n=40))) == {"pod1", "pod2"}
    # The port changed: the old one is refused, the new one works.
    proxy.write(
        "web",
        service("web", [VIP4, VIP6], port=81),
        endpoints("web", tb.pods[:2]),
    )
    proxy.sync()
    assert request_tcp(tb.client, VIP4, 80).outcome == "refused"
    assert request_tcp(tb.client, VIP4, 81).outcome == "reply"
    assert request_tcp(tb.client, VIP6, 81).outcome == "refused"  # its v6 slice is gone
    # The service deleted: its address is no longer handled at all.
    proxy.remove("web")
    proxy.sync()
    assert request_tcp(tb.client, VIP4, 81).outcome == "escaped"
    state = proxy.backend.read_back()
    assert state is not None
    held = [h for m in ("frontends-lb-v4", "cluster-ips-v4") for h in holders(m, state.elements)]
    assert held and not any(state.elements[h] for h in held)
    assert not [c for c in state.chains if c.startswith(("svc-", "ep-"))]


def test_a_bad_edit_keeps_serving_the_last_good_version(proxy: Harness) -> None:
    tb = proxy.tb
    web(proxy)
    broken = service("web", [VIP4, VIP6])
    broken["spec"]["ports"][0]["port"] = 70000
    proxy.write("web", broken, endpoints("web", tb.pods[:1]), endpoints("web", tb.pods, v6=True))
    proxy.sync()
    assert proxy.rejections.counts.get("invalid_port") == 1
    # The service keeps its last good version; the (valid) slice change applies.
    assert names(many(tb.client, VIP4, 80, n=10)) == {"pod1": 10}
    (proxy.folder / "web.yaml").write_text("kind: [unclosed\n")
    proxy.sync()
    assert names(many(tb.client, VIP4, 80, n=10)) == {"pod1": 10}


@pytest.mark.nftables_only(TRANSLATED_HERE)
def test_full_resync_matches_incremental_state(proxy: Harness) -> None:
    tb = proxy.tb
    web(proxy, type="NodePort", node_port=30080, sessionAffinity="ClientIP")
    proxy.write("solo", service("solo", ["10.96.0.11"]), endpoints("solo", tb.pods[:1]))
    proxy.sync()
    proxy.remove("solo")
    proxy.sync()
    incremental = proxy.backend.read_back()
    proxy.sync(full=True)
    full = proxy.backend.read_back()
    assert incremental is not None and full is not None
    assert incremental.chains == full.chains
    assert {k: v for k, v in incremental.elements.items() if not k.startswith("aff-")} == {
        k: v for k, v in full.elements.items() if not k.startswith("aff-")
    }


@pytest.mark.nftables_only("conntrack cleanup; IPVS expires flows to removed real servers itself")
def test_udp_flows_follow_endpoint_changes(proxy: Harness) -> None:
    tb = proxy.tb
    dns = service("dns", [VIP4], port=53, protocol="UDP")
    proxy.write("dns", dns, endpoints("dns", tb.pods[:1], protocol="UDP"))
    proxy.sync()
    sock = tb.client.ns.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.settimeout(1.0)
    try:
        assert udp_exchange(sock, VIP4, 53) == "pod1"
        # pod1 leaves the service (still alive): the same flow must move to pod2.
        proxy.write("dns", dns, endpoints("dns", tb.pods[1:2], protocol="UDP"))
        proxy.sync()
        assert udp_exchange(sock, VIP4, 53) == "pod2"
        # No endpoints: the flow is rejected; endpoints again: the same flow is served.
        proxy.write("dns", dns)
        proxy.sync()
        assert udp_exchange(sock, VIP4, 53) == "refused"
        proxy.write("dns", dns, endpoints("dns", tb.pods[2:3], protocol="UDP"))
        proxy.sync()
        assert udp_exchange(sock, VIP4, 53) == "pod3"
    finally:
        sock.close()


def unallocated_outcomes(tb: Testbed, v6: bool) -> dict[str, str]:
    """What a new connection to an address of the service CIDR that no Service holds gets,
    from a pod, the node and a client outside."""
    address = "fd00:96::99" if v6 else "10.96.0.99"
    where = {"pod": tb.pods[0], "node": tb.node, "client": tb.client}
    return {
        name: request_tcp(host, address, 80, timeout=1.0).outcome for name, host in where.items()
    }


@FAMILIES
def test_unallocated_cluster_ips_are_dropped(proxy: Harness, v6: bool) -> None:
    tb = proxy.tb
    web(proxy)
    # Without ServiceCIDR objects or lace.serviceCIDRs, lace-proxy knows no service CIDR: the
    # node routes such a packet out of its uplink, as any other (the gateway's sink answers).
    assert set(unallocated_outcomes(tb, v6).values()) == {"escaped"}
    proxy.write("cidrs", api_service_cidr(SERVICE_CIDR4, SERVICE_CIDR6, name="kubernetes"))
    proxy.sync()
    assert unallocated_outcomes(tb, v6) == {
        "pod": "timeout",
        "node": "timeout",
        "client": "timeout",
    }
    # Allocated ClusterIPs are served as before, from everywhere.
    for host in (tb.pods[0], tb.node, tb.client):
        assert request_tcp(host, vip(v6), 80).outcome == "reply"
    # The objects are followed: once gone, the range is not the proxy's any more.
    proxy.remove("cidrs")
    proxy.sync()
    assert set(unallocated_outcomes(tb, v6).values()) == {"escaped"}


@pytest.mark.parametrize("mode", MODES)
@FAMILIES
def test_service_cidrs_fall_back_to_the_configuration(
    tb: Testbed, tmp_path: Path, mode: str, v6: bool
) -> None:
    proxy = Harness(
        tb, tmp_path / "manifests", mode=mode, service_cidrs=(SERVICE_CIDR4, SERVICE_CIDR6)
    )
    try:
        web(proxy)
        assert set(unallocated_outcomes(tb, v6).values()) == {"timeout"}
        # A ServiceCIDR object, once there, is what counts: lace.serviceCIDRs is the fallback.
        other = "fd00:97::/112" if v6 else "10.97.0.0/16"
        proxy.write("cidrs", api_service_cidr(other, name="other"))
        proxy.sync()
        assert set(unallocated_outcomes(tb, v6).values()) == {"escaped"}
    finally:
        proxy.close()


@pytest.mark.parametrize("mode", MODES)
def test_masquerade_all_is_read_where_kube_proxy_reads_it(
    tb: Testbed, tmp_path: Path, mode: str
) -> None:
    """A kube-proxy ConfigMap as its users have it: masqueradeAll in `nftables` for nftables
    mode, in `iptables` for IPVS mode (v1alpha1 conversion); a pod's connection to a ClusterIP
    then arrives masqueraded to the node."""
    section = "iptables" if mode == "ipvs" else "nftables"
    path = tmp_path / "kube-proxy.yaml"
    path.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
        f"mode: {mode}\nclusterCIDR: {POD_CIDR4},{POD_CIDR6}\n"
        f"{section}: {{masqueradeAll: true, masqueradeBit: 11}}\n"
    )
    settings = nftables_settings(load_config(str(path), {"hostnameOverride": NODE}))
    assert (settings.masquerade_all, settings.masquerade_bit) == (True, 11)
    proxy = Harness(
        tb,
        tmp_path / "manifests",
        mode=mode,
        masquerade_all=settings.masquerade_all,
        masquerade_bit=settings.masquerade_bit,
        cluster_cidrs=settings.cluster_cidrs,
    )
    try:
        web(proxy)
        pod = tb.pods[0]
        replies = [r.reply for r in many(pod, VIP4, 80, n=12) if r.reply]
        others = [r for r in replies if r.name != pod.name]
        assert len(replies) == 12 and others
        assert {r.peer for r in others} == {POD_GATEWAY4}  # the node, not the pod
    finally:
        proxy.close()


def test_node_port_addresses_primary_follow_the_node_object(tb: Testbed, tmp_path: Path) -> None:
    proxy = Harness(tb, tmp_path / "manifests", node_port_primary=True)
    try:
        web(proxy, type="NodePort", node_port=30080)
        # The Node (and so its primary address) is not known yet: no NodePort anywhere.
        untouched = request_tcp(tb.client, UPLINK_NODE4, 30080)
        assert untouched.reply is not None and untouched.reply.name == "node", untouched
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE},
            "status": {"addresses": [{"type": "InternalIP", "address": UPLINK_NODE4}]},
        }
        proxy.write("node", node)
        proxy.sync()
        assert set(names(many(tb.client, UPLINK_NODE4, 30080))) <= {"pod1", "pod2", "pod3"}
        # Another address of the node is not a NodePort address.
        other = request_tcp(tb.client, GWLINK_NODE4, 30080)
        assert other.reply is not None and other.reply.name == "node", other
    finally:
        proxy.close()


def test_source_ranges_overlap_and_stay_per_frontend(proxy: Harness) -> None:
    tb = proxy.tb
    ingress = {"loadBalancer": {"ingress": [{"ip": LB4}]}}
    # Overlapping ranges in one service (an interval set would refuse them as they are).
    proxy.write(
        "a",
        service(
            "a",
            ["10.96.0.21"],
            type="LoadBalancer",
            node_port=30081,
            status=ingress,
            loadBalancerSourceRanges=["10.0.0.0/8", "10.250.0.0/16"],
        ),
        endpoints("a", tb.pods[:1], name="a-v4"),
    )
    proxy.sync()
    assert request_tcp(tb.client, LB4, 80).outcome == "reply"
    # Another service on the same address, another port, that allows the client: the
    # first one's ranges still hold for its own port.
    proxy.write(
        "a",
        service(
            "a",
            ["10.96.0.21"],
            type="LoadBalancer",
            node_port=30081,
            status=ingress,
            loadBalancerSourceRanges=["10.99.0.0/24"],
        ),
        endpoints("a", tb.pods[:1], name="a-v4"),
    )
    proxy.write(
        "b",
        service(
            "b",
            ["10.96.0.22"],
            port=81,
            type="LoadBalancer",
            node_port=30082,
            status=ingress,
            loadBalancerSourceRanges=[f"{CLIENT4}/32"],
        ),
        endpoints("b", tb.pods[1:2], name="b-v4"),
    )
    proxy.sync()
    assert request_tcp(tb.client, LB4, 81).outcome == "reply"
    assert request_tcp(tb.client, LB4, 80, timeout=1.0).outcome == "timeout"


def test_affinity_never_sends_a_client_to_an_endpoint_that_left(proxy: Harness) -> None:
    tb = proxy.tb
    spec = {
        "sessionAffinity": "ClientIP",
        "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}},
    }
    proxy.write("web", service("web", [VIP4], **spec), endpoints("web", tb.pods))  # type: ignore[arg-type]
    proxy.sync()
    (pinned,) = names(many(tb.client, VIP4, 80, n=10))
    rest = [p for p in tb.pods if p.name != pinned]
    proxy.write("web", service("web", [VIP4], **spec), endpoints("web", rest))  # type: ignore[arg-type]
    proxy.sync()
    (now,) = names(many(tb.client, VIP4, 80, n=10))  # pinned again, elsewhere
    assert now != pinned and now in {p.name for p in rest}
