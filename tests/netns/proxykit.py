"""Drive the real proxy pipeline (manifest folder → source → table → proxier → nftables)
against a testbed's node namespace, one sync at a time."""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from lace_proxy.dataplane.conntrack import Conntrack
from lace_proxy.dataplane.ipvs import IpvsBackend, IpvsSettings
from lace_proxy.dataplane.nft import ElementSource, Nft
from lace_proxy.dataplane.nftables.backend import NftablesBackend
from lace_proxy.dataplane.nftables.settings import NftablesSettings
from lace_proxy.dataplane.nftables.transaction import Transaction
from lace_proxy.dataplane.routes import PolicyRoutes, RoutingSettings
from lace_proxy.demo.testbed import (
    POD_CIDR4,
    POD_CIDR6,
    Host,
    Result,
    TestbedBase,
    request_tcp,
    request_udp,
)
from lace_proxy.model import Rejections
from lace_proxy.proxier import Proxier
from lace_proxy.sources.files import SOURCE_NAME, ManifestSource
from lace_proxy.table import ServiceTable

from ..conftest import IPVS_ADDRESSES

NODE = "node-a"
OTHER_NODE = "node-b"
LB4, LB6 = "10.252.0.20", "fd00:252::20"
EXT4, EXT6 = "10.252.0.30", "fd00:252::30"
VIP4, VIP6 = "10.96.0.10", "fd00:96::10"


def service(
    name: str,
    ips: Sequence[str],
    *,
    port: int = 80,
    target: int = 8080,
    node_port: int | None = None,
    protocol: str = "TCP",
    type: str = "ClusterIP",
    **spec: Any,
) -> dict[str, Any]:
    svc_port: dict[str, Any] = {
        "name": "p",
        "port": port,
        "targetPort": target,
        "protocol": protocol,
    }
    if node_port:
        svc_port["nodePort"] = node_port
    status = spec.pop("status", {})
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"type": type, "clusterIPs": list(ips), "ports": [svc_port], **spec},
        "status": status,
    }


def endpoints(
    svc: str,
    pods: Sequence[Host],
    *,
    v6: bool = False,
    port: int = 8080,
    protocol: str = "TCP",
    node: str = NODE,
    name: str | None = None,
    **conditions: bool,
) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name or f"{svc}-{'v6' if v6 else 'v4'}",
            "namespace": "default",
            "labels": {"kubernetes.io/service-name": svc},
        },
        "addressType": "IPv6" if v6 else "IPv4",
        "ports": [{"name": "p", "port": port, "protocol": protocol}],
        "endpoints": [
            {
                "addresses": [p.ipv6 if v6 else p.ipv4],
                "nodeName": node,
                "conditions": {"ready": True, **conditions},
            }
            for p in pods
        ],
    }


def ipvs_settings(**settings: Any) -> IpvsSettings:
    """IPVS mode's settings for a test, its service addresses as this run's setting says
    (IPVS_ADDRESSES: the dummy interface's, or local routes)."""
    return IpvsSettings(local_routes=IPVS_ADDRESSES == "localRoutes", **settings)


class Harness:
    """The proxy's own pipeline, synced on demand, programming a testbed's node.

    Every full sync reads every element back (`verify_every`; the proxy's default is 10), so a
    test's full sync repairs any tampering at once.
    `node` is the namespace programmed (the single-node testbed's node by default) and
    `node_name` the Node it is; `routing` turns on the policy routes; `mode` "ipvs" programs
    IPVS (plus nftables without translation; needs an IPVS kernel: tests/vm) with `ipvs`
    (default: `ipvs_settings()`, this run's way of making service addresses local); `pod_networks`
    is told the pod networks' prefixes at each sync and `node_pod_cidrs` the Node's podCIDRs
    when they change (the egress controller's hooks); `udp_flows_moved` gets what the metric
    lace_proxy_udp_flows_moved would count; `announce` is the BGP announcer's hook.
    """

    def __init__(
        self,
        tb: TestbedBase,
        folder: Path,
        *,
        node: Host | None = None,
        node_name: str = NODE,
        routing: RoutingSettings | None = None,
        mode: str = "nftables",
        ipvs: IpvsSettings | None = None,
        pod_networks: Callable[[tuple[str, ...]], None] | None = None,
        node_pod_cidrs: Callable[[tuple[str, ...]], None] | None = None,
        udp_flows_moved: Callable[[int, int], None] | None = None,
        verify_every: int = 1,
        announce: Callable[..., None] | None = None,
        **settings: Any,
    ) -> None:
        self.tb = tb
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        netns = (node or tb.node).ns.name  # type: ignore[attr-defined]
        settings.setdefault("cluster_cidrs", (POD_CIDR4, POD_CIDR6))
        if mode == "ipvs":
            settings["translate"] = False
        self.nft = NftablesBackend(
            NftablesSettings(**settings),
            Nft(netns),
            Conntrack(netns),
            verify_every=verify_every,
            udp_flows_moved=udp_flows_moved,
        )
        self.backend: NftablesBackend | IpvsBackend = (
            IpvsBackend(ipvs or ipvs_settings(), self.nft, netns) if mode == "ipvs" else self.nft
        )
        self.routes = None if routing is None else PolicyRoutes(routing, netns)
        self.table = ServiceTable(node_name)
        self.rejections = Rejections()
        self.proxier = Proxier(
            self.table,
            self.backend,
            sources=[SOURCE_NAME],
            routes=self.routes,
            pod_networks=pod_networks,
            node_pod_cidrs=node_pod_cidrs,
            announce=announce,
        )
        self.source = ManifestSource(folder, self.proxier, self.rejections)
        self.proxier.synced(SOURCE_NAME)

    def write(self, name: str, *objects: dict[str, Any]) -> None:
        (self.folder / f"{name}.yaml").write_text(yaml.safe_dump_all(objects))

    def remove(self, name: str) -> None:
        (self.folder / f"{name}.yaml").unlink()

    def sync(self, *, full: bool = False) -> None:
        """Deliver the folder's changes and program them; fail the test if the sync fails."""
        self.source._signature = None  # same-second edits may keep size and mtime
        self.source.poll()
        ok = asyncio.run(self.proxier.sync(full=full))
        assert ok, self.proxier.stats.last_error

    def close(self) -> None:
        self.backend.cleanup()
        if self.routes is not None:
            self.routes.cleanup()


def talk(sock: socket.socket, word: str) -> str:
    """One exchange on a held connection: the pod that answers."""
    sock.sendall(f"{word}\n".encode())
    line = sock.recv(4096).decode()
    name, _, echoed = line.partition(" ")
    assert echoed == f"{word}\n", line
    return name


def names(results: Sequence[Result]) -> Counter[str]:
    """How often each endpoint answered; non-replies count under their outcome."""
    return Counter(r.reply.name if r.reply else r.outcome for r in results)


def many(where: Host, ip: str, port: int, n: int = 30, udp: bool = False) -> list[Result]:
    request = request_udp if udp else request_tcp
    return [request(where, ip, port) for _ in range(n)]


def udp_exchange(sock: socket.socket, ip: str, port: int) -> str:
    """One datagram from a fixed source port (the same conntrack flow each time)."""
    sock.sendto(b"?", (ip, port))
    try:
        data, _ = sock.recvfrom(512)
    except TimeoutError:
        return "timeout"
    except ConnectionRefusedError:  # the ICMP error of a reject
        return "refused"
    return data.decode().split()[0]


class RecordingNft(Nft):
    """The real nft, remembering each transaction it applied."""

    def __init__(self, netns: str) -> None:
        super().__init__(netns)
        self.applied: list[Transaction] = []
        self.listings = 0  # how often the table's elements were read

    def table_elements(self, family: str, table: str) -> ElementSource:
        self.listings += 1
        return super().table_elements(family, table)

    def apply(self, tx: Transaction) -> None:
        super().apply(tx)
        if tx.commands:  # an empty one reaches no kernel
            self.applied.append(tx)
