"""A UDP flow that moves off its endpoint loses no reply that was in flight (issue 21).

The query is sent, the endpoint leaves the service (the sync deletes the flow's conntrack
entry), and only then does the old pod answer: the client, its socket connected to the
frontend, gets that answer from the frontend; its next query goes to the new endpoint. Each
frontend kind, from where kube-proxy users reach it: a ClusterIP from a pod and from the node
(delivered locally), a NodePort and an LB IP from outside (masqueraded).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lace_proxy.demo.testbed import UPLINK_NODE4, UPLINK_NODE6, Host, Testbed

from ..conftest import MODES
from .proxykit import LB4, LB6, Harness, endpoints, service

pytestmark = pytest.mark.netns

VIP4, VIP6 = "10.96.0.53", "fd00:96::53"
PORT, NODE_PORT, TARGET = 53, 30053, 5300
FAMILIES = pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])


@pytest.fixture
def moved() -> list[tuple[int, int]]:
    """What lace_proxy_udp_flows_moved counts, sync by sync: (rescued, unrescued)."""
    return []


@pytest.fixture(params=MODES)
def proxy(
    request: pytest.FixtureRequest,
    make_testbed: Callable[..., Testbed],
    tmp_path: Path,
    moved: list[tuple[int, int]],
) -> Iterator[Harness]:
    """Three pods: the first two serve the UDP service in turn (the test answers for them),
    the third is a client."""
    harness = Harness(
        make_testbed(pods=3),
        tmp_path / "manifests",
        mode=request.param,
        udp_flows_moved=lambda *counts: moved.append(counts),
    )
    yield harness
    harness.close()


def dns(proxy: Harness, pod: Host, v6: bool, terminating: Host | None = None) -> None:
    """The service with `pod` as its one ready endpoint (and `terminating`, still serving),
    synced."""
    slices = [endpoints("dns", [pod], v6=v6, port=TARGET, protocol="UDP")]
    if terminating is not None:
        slices.append(
            endpoints(
                "dns",
                [terminating],
                v6=v6,
                port=TARGET,
                protocol="UDP",
                name="dns-terminating",
                ready=False,
                serving=True,
                terminating=True,
            )
        )
    proxy.write(
        "dns",
        service(
            "dns",
            [VIP6 if v6 else VIP4],
            port=PORT,
            target=TARGET,
            node_port=NODE_PORT,
            protocol="UDP",
            type="LoadBalancer",
            ipFamilies=["IPv6" if v6 else "IPv4"],
            status={"loadBalancer": {"ingress": [{"ip": LB6 if v6 else LB4}]}},
        ),
        *slices,
    )
    proxy.sync()


def frontend(tb: Testbed, kind: str, v6: bool) -> tuple[Host, str, int]:
    """Who sends, and to which address and port."""
    if kind == "clusterip-pod":
        return tb.pods[2], VIP6 if v6 else VIP4, PORT
    if kind == "clusterip-node":
        return tb.node, VIP6 if v6 else VIP4, PORT
    if kind == "nodeport":
        return tb.client, UPLINK_NODE6 if v6 else UPLINK_NODE4, NODE_PORT
    return tb.client, LB6 if v6 else LB4, PORT


def udp_socket(host: Host, v6: bool, port: int | None = None) -> socket.socket:
    """A client socket on a fresh source port, or a server's on `port`."""
    family = socket.AF_INET6 if v6 else socket.AF_INET
    if port is None:
        sock = host.ns.socket(family, socket.SOCK_DGRAM)
    else:
        sock = host.ns.call(socket.socket, family, socket.SOCK_DGRAM)
        sock.bind(("::" if v6 else "0.0.0.0", port))
    sock.settimeout(2.0)
    return sock


@pytest.mark.parametrize("kind", ["clusterip-pod", "clusterip-node", "nodeport", "lb"])
@FAMILIES
def test_a_reply_in_flight_when_its_flow_moves_is_delivered(
    proxy: Harness, moved: list[tuple[int, int]], kind: str, v6: bool
) -> None:
    tb = proxy.tb
    if proxy.backend is not proxy.nft and kind in ("clusterip-node", "lb"):
        # The VM's minutes are dear: the rescue is the same nftables maps in both modes.
        pytest.skip("nftables mode only: IPVS mode is shown by a pod's ClusterIP and a NodePort")
    old, new = tb.pods[0], tb.pods[1]
    servers = {pod.name: udp_socket(pod, v6, TARGET) for pod in (old, new)}
    host, address, port = frontend(tb, kind, v6)
    client = udp_socket(host, v6)
    try:
        # Connected: the kernel drops a datagram from any other source than the frontend.
        client.connect((address, port))
        dns(proxy, old, v6)
        client.send(b"first")
        query, peer = servers[old.name].recvfrom(512)
        assert query == b"first"
        # The endpoint leaves the service; its pod answers only after that sync.
        dns(proxy, new, v6)
        servers[old.name].sendto(b"old", peer)
        assert client.recv(512) == b"old"
        assert moved == [(1, 0)]
        # The flow has moved: the same client port now reaches the new endpoint.
        client.send(b"second")
        query, peer = servers[new.name].recvfrom(512)
        assert query == b"second"
        servers[new.name].sendto(b"new", peer)
        assert client.recv(512) == b"new"
    finally:
        client.close()
        for sock in servers.values():
            sock.close()


@pytest.mark.parametrize("kind", ["clusterip-pod", "nodeport"])
@FAMILIES
def test_a_terminating_endpoint_keeps_its_flow_or_moves_it_with_its_reply(
    proxy: Harness, moved: list[tuple[int, int]], kind: str, v6: bool
) -> None:
    """The endpoint becomes terminating, still serving, while a reply is on its way. nftables
    mode keeps the flow on it (kube-proxy's reconciler); IPVS mode, as kube-proxy's, deletes
    its UDP real server at once, so the flow moves, and the reply still arrives."""
    tb = proxy.tb
    old, new = tb.pods[0], tb.pods[1]
    servers = {pod.name: udp_socket(pod, v6, TARGET) for pod in (old, new)}
    host, address, port = frontend(tb, kind, v6)
    client = udp_socket(host, v6)
    ipvs = proxy.backend is not proxy.nft
    try:
        client.connect((address, port))
        dns(proxy, old, v6)
        client.send(b"first")
        _, peer = servers[old.name].recvfrom(512)
        dns(proxy, new, v6, terminating=old)
        servers[old.name].sendto(b"old", peer)
        assert client.recv(512) == b"old"
        assert moved == ([(1, 0)] if ipvs else [])
        client.send(b"second")
        stays = servers[new.name if ipvs else old.name]
        query, peer = stays.recvfrom(512)
        assert query == b"second"
        stays.sendto(b"next", peer)
        assert client.recv(512) == b"next"
    finally:
        client.close()
        for sock in servers.values():
            sock.close()
