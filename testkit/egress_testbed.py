"""The two-node testbed (cluster.py) with a second uplink on each node: pod egress by routes.

One more namespace, `edge`, a router with servers of its own (every address answers "edge",
and reports the source it saw)::

    node-a eth1 192.0.2.11/24 ──── na 192.0.2.1  ┐ edge: lo 198.18.0.10, 198.18.1.10,
    node-b eth1 192.0.3.12/24 ──── nb 192.0.3.1  ┘       198.51.100.10

    node-a: lo 172.16.0.11/32 (a platform address no interface subnet holds)
            198.18.0.0/24   via 192.0.2.1 dev eth1              (source: eth1's 192.0.2.11)
            198.18.1.0/24   via 192.0.2.1 dev eth1 src 172.16.0.11   (its own source)
            198.51.100.0/24 via 10.250.0.12 (node-b: another node as the gateway)
            default         via the fabric (source: the cluster-host address 10.250.0.11)
    node-b: 198.51.100.0/24 via 192.0.3.1
    edge:   172.16.0.11/32 via 192.0.2.11, 10.250.0.0/24 via 192.0.3.12; no default route

The edge knows no pod addresses: a pod's packet that reaches it untranslated gets no answer
(outcome "timeout"); one translated to a source it can route back to is answered. Masquerade
would pick eth1's address for 198.18.1.0/24 too: only the route's own source tells them apart.

Pods of node-a beyond cluster.py's, for traffic that must stay untranslated inside the node::

    a1 also fd00:251:0:1::11 (in POD_CIDR6 fd00:251::/48; gateway fd00:251:0:1::1 on va1)
    ax 10.253.1.11, fd00:253:1::11 on vax: outside every pod prefix (a second network's),
       gateways 10.253.1.1 and fd00:253:1::1, /32 and /128 routes on vax as for every pod
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from lace_proxy.demo.testbed import (
    DEFAULT_PORTS,
    Host,
    host_sysctls,
    reachable,
    run_checked,
    write_sysctls,
)
from testkit.cluster_testbed import NODE_B4, UNDERLAY_CIDR4, ClusterTestbed, batch_lines

UPLINK_A4, UPLINK_B4 = "192.0.2.11", "192.0.3.12"
EDGE_A4, EDGE_B4 = "192.0.2.1", "192.0.3.1"
PLATFORM_A4 = "172.16.0.11"
LAB4, LAB_PREFSRC4, BEYOND_B4 = "198.18.0.10", "198.18.1.10", "198.51.100.10"
LAB_CIDR4, LAB_PREFSRC_CIDR4, BEYOND_B_CIDR4 = "198.18.0.0/24", "198.18.1.0/24", "198.51.100.0/24"
POD_CIDR6, A1_6, POD_GATEWAY_A6 = "fd00:251::/48", "fd00:251:0:1::11", "fd00:251:0:1::1"
AX4, AX_GATEWAY4, AX_CIDR4 = "10.253.1.11", "10.253.1.1", "10.253.1.0/24"
AX6, AX_GATEWAY6, AX_CIDR6 = "fd00:253:1::11", "fd00:253:1::1", "fd00:253:1::/64"


class EgressTestbed(ClusterTestbed):
    """ClusterTestbed plus `edge` (role E) and the second uplinks (see the module docstring)."""

    def __init__(self, *, ports: Sequence[int] = DEFAULT_PORTS) -> None:
        super().__init__(ports=ports)
        self.edge: Host

    def _build(self) -> None:
        super()._build()
        (edge_ns,) = self._add_namespaces(["E"])
        self.edge = Host("edge", LAB4, "", edge_ns)
        edge_ns.call(write_sysctls, host_sysctls(router=True))
        a, b = self.nodes["node-a"], self.nodes["node-b"]
        lines = ["link set lo up"]
        lines += [f"addr add {ip}/32 dev lo" for ip in (LAB4, LAB_PREFSRC4, BEYOND_B4)]
        for peer, node, own in (
            ("na", a, EDGE_A4),
            ("nb", b, EDGE_B4),
        ):
            lines += [
                f"link add {peer} type veth peer name eth1 netns {node.ns.name}",
                f"link set {peer} up",
                f"addr add {own}/24 dev {peer}",
            ]
        lines += [
            f"route add {PLATFORM_A4}/32 via {UPLINK_A4}",
            f"route add {UNDERLAY_CIDR4} via {UPLINK_B4}",
        ]
        run_checked(["ip", "-n", edge_ns.name, "-batch", "-"], batch_lines(lines))
        node_a = [
            "link set eth1 up",
            f"addr add {UPLINK_A4}/24 dev eth1",
            f"addr add {PLATFORM_A4}/32 dev lo",
            f"route add {LAB_CIDR4} via {EDGE_A4} dev eth1",
            f"route add {LAB_PREFSRC_CIDR4} via {EDGE_A4} dev eth1 src {PLATFORM_A4}",
            f"route add {BEYOND_B_CIDR4} via {NODE_B4}",
        ]
        run_checked(["ip", "-n", a.ns.name, "-batch", "-"], batch_lines(node_a))
        node_b = [
            "link set eth1 up",
            f"addr add {UPLINK_B4}/24 dev eth1",
            f"route add {BEYOND_B_CIDR4} via {EDGE_B4}",
        ]
        run_checked(["ip", "-n", b.ns.name, "-batch", "-"], batch_lines(node_b))
        self.serve(self.edge, self.ports)
        self._add_local_pods()

    def _add_local_pods(self) -> None:
        """IPv6 for a1, and the pod ax (see the module docstring)."""
        a, a1 = self.nodes["node-a"], self.pods["a1"]
        (ax_ns,) = self._add_namespaces(["Pax"])
        ax = self.pods["ax"] = Host("ax", AX4, AX6, ax_ns)
        self.pods["a1"] = a1 = Host(a1.name, a1.ipv4, A1_6, a1.ns)
        self.pod_nodes["ax"] = "node-a"
        ax_ns.call(write_sysctls, host_sysctls(router=False))
        node_a = [
            f"addr add {POD_GATEWAY_A6}/128 dev va1 nodad",
            f"route add {A1_6}/128 dev va1",
            f"link add vax type veth peer name eth0 netns {ax_ns.name}",
            "link set vax up",
            f"addr add {AX_GATEWAY4}/32 dev vax",
            f"addr add {AX_GATEWAY6}/128 dev vax nodad",
            f"route add {AX4}/32 dev vax",
            f"route add {AX6}/128 dev vax",
        ]
        run_checked(["ip", "-n", a.ns.name, "-batch", "-"], batch_lines(node_a))
        ax_lines = ["link set lo up", "link set eth0 up", *_pod_address(AX4, AX_GATEWAY4)]
        ax_lines += _pod_address(AX6, AX_GATEWAY6)
        run_checked(["ip", "-n", ax_ns.name, "-batch", "-"], batch_lines(ax_lines))
        run_checked(
            ["ip", "-n", a1.ns.name, "-batch", "-"], batch_lines(_pod_address(A1_6, POD_GATEWAY_A6))
        )
        self.serve(ax, self.ports)
        deadline = time.monotonic() + 5
        for ip, name in ((AX4, "ax"), (AX6, "ax"), (A1_6, "a1")):
            result = reachable(a, ip, self.ports[0], deadline)
            if result.reply is None or result.reply.name != name:
                raise RuntimeError(f"node-a to {name} at {ip}: got {result}")


def _pod_address(ip: str, gateway: str) -> list[str]:
    """A pod's address on its eth0 and its default route through the node's `gateway`."""
    bits, dad = (128, " nodad") if ":" in ip else (32, "")
    return [
        f"addr add {ip}/{bits} dev eth0{dad}",
        f"route add {gateway}/{bits} dev eth0",
        f"route add default via {gateway}",
    ]
