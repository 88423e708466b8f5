"""A two-node, IPv4-only network-namespace testbed: traffic between nodes, and from outside.

testbed.py's single node cannot show what happens when a service's endpoints live on another
node, or when a client outside the cluster comes in through a router. Here every box is a
namespace and each link a veth pair created straight into its two namespaces (nothing in the
root namespace; packets never leave these namespaces)::

    far    eth0 203.0.113.10 ──── far  203.0.113.1 ─┐ fabric: a router between its links far
    near   eth0 10.249.0.10  ──── near 10.249.0.1  ─┤ and near and br0 10.250.0.254/24, a
                                                    │ bridge (the underlay) with two ports:
    node-a eth0 10.250.0.11  ──── node-a ───────────┤
    node-b eth0 10.250.0.12  ──── node-b ───────────┘

    node-a va1    ──── eth0 a1    10.251.1.11    node-b vb1    ──── eth0 b1    10.251.2.11
           va2    ──── eth0 a2    10.251.1.12           vbblue ──── eth0 bblue 10.254.2.11
           vablue ──── eth0 ablue 10.254.1.11
    (the pods' gateways: 10.251.1.1 on va1 and va2, 10.254.1.1 on vablue; 10.251.2.1 on vb1,
    10.254.2.1 on vbblue)

* fabric: the underlay switch (br0, 10.250.0.0/24) and the nodes' default router. It routes
  the two client networks and each node's pod CIDRs via that node, and is the sink for
  everything else it would forward (the service CIDR, unknown addresses): it rejects those
  with ICMP net-prohibited from 10.250.0.254, like testbed.py's gw, so a service packet that
  left a node untranslated comes back as outcome "escaped", whoever sent it. Its routes to
  the clients' links prefer 10.250.0.254 as source, so its ICMP errors to far and near come
  from that address too (by default they would come from 203.0.113.1 / 10.249.0.1). It
  bridges without filtering (bridge-nf-call-iptables 0 where br_netfilter is loaded).
* node-a, node-b: where proxies run. Forward; default route via the fabric; the other node's
  pod CIDRs via its underlay address, straight over the bridge, so pod-to-pod traffic across
  nodes keeps the pods' addresses (no masquerade). Pods as in testbed.py: routed
  point-to-point veths, the gateway as a /32 on every pod veth, a /32 route per pod. The rest
  of a node's own pod CIDRs is "unreachable" there: an address no pod holds fails at once
  (ICMP host unreachable from the node) instead of looping between node and fabric.
* far: an "internet-like" client; near: a client in a narrower external network
  (10.249.0.0/24). Both have their default route via the fabric, so they reach node
  addresses and (the fabric routes them) pods directly, unmasqueraded.

Servers (servers.py) run in both nodes, every pod, far and near, on ``ports`` (TCP and UDP),
and answer "NAME LOCAL_IP:PORT PEER_IP", so a reply names who answered ("node-a", "b1",
"far", ...), on which address, and the source it saw. The fabric runs none (it answers a
connection to itself with a RST).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from lace_proxy.demo.testbed import (
    DEFAULT_PORTS,
    FABRIC4,
    Host,
    TestbedBase,
    host_sysctls,
    reachable,
    run_checked,
    write_sysctls,
)
from lace_proxy.demo.testbed import SERVICE_CIDR4 as SERVICE_CIDR4  # the fabric sinks it

# Address plan (IPv4 only). FABRIC4, 10.250.0.254, is the fabric's address on the underlay.
UNDERLAY_CIDR4 = "10.250.0.0/24"
NODE_A4, NODE_B4 = "10.250.0.11", "10.250.0.12"
FAR4, FAR_GATEWAY4, FAR_CIDR4 = "203.0.113.10", "203.0.113.1", "203.0.113.0/24"
NEAR4, NEAR_GATEWAY4, NEAR_CIDR4 = "10.249.0.10", "10.249.0.1", "10.249.0.0/24"
POD_CIDR_A4, BLUE_CIDR_A4 = "10.251.1.0/24", "10.254.1.0/24"
POD_CIDR_B4, BLUE_CIDR_B4 = "10.251.2.0/24", "10.254.2.0/24"
POD_GATEWAY_A4, BLUE_GATEWAY_A4 = "10.251.1.1", "10.254.1.1"
POD_GATEWAY_B4, BLUE_GATEWAY_B4 = "10.251.2.1", "10.254.2.1"
A1_4, A2_4, ABLUE4 = "10.251.1.11", "10.251.1.12", "10.254.1.11"
B1_4, BBLUE4 = "10.251.2.11", "10.254.2.11"

NODE_ADDRESSES: Mapping[str, str] = {"node-a": NODE_A4, "node-b": NODE_B4}
POD_CIDRS: Mapping[str, tuple[str, ...]] = {
    "node-a": (POD_CIDR_A4, BLUE_CIDR_A4),
    "node-b": (POD_CIDR_B4, BLUE_CIDR_B4),
}


@dataclass(frozen=True)
class _Pod:
    """One pod of the fixed plan; role is its namespace name's suffix (see _NAME_PATTERN)."""

    name: str
    node: str
    ipv4: str
    gateway: str
    role: str


_PODS = (
    _Pod("a1", "node-a", A1_4, POD_GATEWAY_A4, "Pa1"),
    _Pod("a2", "node-a", A2_4, POD_GATEWAY_A4, "Pa2"),
    _Pod("ablue", "node-a", ABLUE4, BLUE_GATEWAY_A4, "Pab"),
    _Pod("b1", "node-b", B1_4, POD_GATEWAY_B4, "Pb1"),
    _Pod("bblue", "node-b", BBLUE4, BLUE_GATEWAY_B4, "Pbb"),
)
POD_NODES: Mapping[str, str] = {pod.name: pod.node for pod in _PODS}
_NODE_ROLES = {"node-a": "Na", "node-b": "Nb"}
# Where the fabric forwards; anything else that reaches its forward hook is rejected.
_ROUTED4 = (UNDERLAY_CIDR4, FAR_CIDR4, NEAR_CIDR4, *(c for cs in POD_CIDRS.values() for c in cs))

FABRIC_SINK_RULES = f"""
table inet lace_testbed_sink {{
    set routed {{
        type ipv4_addr; flags interval
        elements = {{ {", ".join(_ROUTED4)} }}
    }}
    chain forward {{
        type filter hook forward priority 0; policy accept;
        ip daddr != @routed reject with icmp type net-prohibited
    }}
}}
"""


def _bridge_unfiltered() -> None:
    """Runs in the fabric's worker: a switch does not filter, so bridged frames must not pass
    the fabric's IP hooks (they would with br_netfilter loaded, the per-namespace default)."""
    for key in ("bridge-nf-call-iptables", "bridge-nf-call-ip6tables"):
        path = Path("/proc/sys/net/bridge", key)
        if path.exists():
            path.write_text("0\n")


def batch_lines(lines: Sequence[str]) -> str:
    return "".join(f"{line}\n" for line in lines)


class ClusterTestbed(TestbedBase):
    """Two nodes with pods, their router (the fabric, also the sink) and two outside clients.

    Use as a context manager (see TestbedBase for lifecycle, teardown and naming; roles F,
    Xf, Xn, Na, Nb, Pa1, Pa2, Pab, Pb1, Pbb). Hosts are IPv4-only: their ipv6 is "".

    nodes: "node-a", "node-b" -> Host; pods: "a1", "a2", "ablue", "b1", "bblue" -> Host;
    far, near, fabric: Hosts; pod_cidrs: node name -> its pod CIDRs; pod_nodes: pod -> node.
    """

    def __init__(self, *, ports: Sequence[int] = DEFAULT_PORTS) -> None:
        super().__init__(ports)
        self.fabric: Host
        self.far: Host
        self.near: Host
        self.nodes: dict[str, Host] = {}
        self.pods: dict[str, Host] = {}
        self.pod_cidrs: dict[str, tuple[str, ...]] = dict(POD_CIDRS)
        self.pod_nodes: dict[str, str] = dict(POD_NODES)

    def _build(self) -> None:
        roles = ["F", "Xf", "Xn", *_NODE_ROLES.values(), *(pod.role for pod in _PODS)]
        fabric_ns, far_ns, near_ns, *rest = self._add_namespaces(roles)
        self.fabric = Host("fabric", FABRIC4, "", fabric_ns)
        self.far = Host("far", FAR4, "", far_ns)
        self.near = Host("near", NEAR4, "", near_ns)
        node_ns, pod_ns = rest[: len(_NODE_ROLES)], rest[len(_NODE_ROLES) :]
        self.nodes = {
            name: Host(name, NODE_ADDRESSES[name], "", ns)
            for name, ns in zip(_NODE_ROLES, node_ns, strict=True)
        }
        self.pods = {
            pod.name: Host(pod.name, pod.ipv4, "", ns)
            for pod, ns in zip(_PODS, pod_ns, strict=True)
        }
        routers = {self.fabric.name, *self.nodes}
        for host in self._hosts():
            host.ns.call(write_sysctls, host_sysctls(router=host.name in routers))
        fabric_ns.call(_bridge_unfiltered)

        # The fabric creates the underlay and client veths, each node its pods' veths, always
        # putting the far end straight into its namespace; then each far end is configured.
        run_checked(["ip", "-n", fabric_ns.name, "-batch", "-"], self._fabric_batch())
        for node in self.nodes.values():
            run_checked(["ip", "-n", node.ns.name, "-batch", "-"], self._node_batch(node))
        for client, gateway in ((self.far, FAR_GATEWAY4), (self.near, NEAR_GATEWAY4)):
            lines = ["link set lo up", "link set eth0 up", f"addr add {client.ipv4}/24 dev eth0"]
            lines.append(f"route add default via {gateway}")
            run_checked(["ip", "-n", client.ns.name, "-batch", "-"], batch_lines(lines))
        for spec in _PODS:
            pod = self.pods[spec.name]
            lines = ["link set lo up", "link set eth0 up", f"addr add {pod.ipv4}/32 dev eth0"]
            lines += [
                f"route add {spec.gateway}/32 dev eth0",
                f"route add default via {spec.gateway}",
            ]
            run_checked(["ip", "-n", pod.ns.name, "-batch", "-"], batch_lines(lines))
        self.exec(self.fabric, ["nft", "-f", "-"], input=FABRIC_SINK_RULES)

        self._start_servers([host for host in self._hosts() if host is not self.fabric])
        self._wait_for_links()

    def _hosts(self) -> list[Host]:
        return [self.fabric, self.far, self.near, *self.nodes.values(), *self.pods.values()]

    def _fabric_batch(self) -> str:
        # forward_delay 0: without STP a port may forward at once, not after 15 seconds.
        lines = [
            "link set lo up",
            "link add br0 type bridge forward_delay 0",
            "link set br0 up",
            f"addr add {FABRIC4}/24 dev br0",
        ]
        for node in self.nodes.values():
            lines += [
                f"link add {node.name} type veth peer name eth0 netns {node.ns.name}",
                f"link set {node.name} master br0",
                f"link set {node.name} up",
            ]
            lines += [f"route add {cidr} via {node.ipv4}" for cidr in self.pod_cidrs[node.name]]
        for client, gateway, cidr in (
            (self.far, FAR_GATEWAY4, FAR_CIDR4),
            (self.near, NEAR_GATEWAY4, NEAR_CIDR4),
        ):
            lines += [
                f"link add {client.name} type veth peer name eth0 netns {client.ns.name}",
                f"link set {client.name} up",
                f"addr add {gateway}/24 dev {client.name} noprefixroute",
                f"route add {cidr} dev {client.name} src {FABRIC4}",
            ]
        # Only so that routing forwards (instead of failing) what the sink then rejects.
        lines.append("route add default dev br0")
        return batch_lines(lines)

    def _node_batch(self, node: Host) -> str:
        lines = [
            "link set lo up",
            "link set eth0 up",
            f"addr add {node.ipv4}/24 dev eth0",
            f"route add default via {FABRIC4}",
        ]
        for name, cidrs in self.pod_cidrs.items():
            if name == node.name:
                lines += [f"route add unreachable {cidr}" for cidr in cidrs]
            else:
                lines += [f"route add {cidr} via {NODE_ADDRESSES[name]}" for cidr in cidrs]
        for spec in _PODS:
            if spec.node != node.name:
                continue
            veth, pod = f"v{spec.name}", self.pods[spec.name]
            lines += [
                f"link add {veth} type veth peer name eth0 netns {pod.ns.name}",
                f"link set {veth} up",
                f"addr add {spec.gateway}/32 dev {veth}",
                f"route add {pod.ipv4}/32 dev {veth}",
            ]
        return batch_lines(lines)

    def _wait_for_links(self) -> None:
        """Wait until every link passes traffic, and check that each path ends where it should.

        Every node reaches every pod (its own and, across the bridge, the other node's), the
        other node and both clients (through the fabric), each answering under its own name;
        the fabric answers with a RST. Fails loudly otherwise.
        """
        port = self.ports[0]
        targets = [*self.pods.values(), *self.nodes.values(), self.far, self.near]
        deadline = time.monotonic() + 5
        for node in self.nodes.values():
            for target in targets:
                if target is node:
                    continue
                result = reachable(node, target.ipv4, port, deadline)
                if result.reply is None or result.reply.name != target.name:
                    raise RuntimeError(f"{node.name} to {target.name}: got {result}")
            result = reachable(node, FABRIC4, port, deadline)
            if (result.outcome, result.icmp) != ("refused", None):
                raise RuntimeError(f"{node.name} to fabric: expected a RST, got {result}")
