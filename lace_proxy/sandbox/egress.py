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
"""

from __future__ import annotations

from collections.abc import Sequence

from lace_proxy.sandbox.cluster import NODE_B4, UNDERLAY_CIDR4, ClusterTestbed, _batch
from lace_proxy.sandbox.testbed import DEFAULT_PORTS, Host, _run, _sysctls, _write_sysctls

UPLINK_A4, UPLINK_B4 = "192.0.2.11", "192.0.3.12"
EDGE_A4, EDGE_B4 = "192.0.2.1", "192.0.3.1"
PLATFORM_A4 = "172.16.0.11"
LAB4, LAB_PREFSRC4, BEYOND_B4 = "198.18.0.10", "198.18.1.10", "198.51.100.10"
LAB_CIDR4, LAB_PREFSRC_CIDR4, BEYOND_B_CIDR4 = "198.18.0.0/24", "198.18.1.0/24", "198.51.100.0/24"


class EgressTestbed(ClusterTestbed):
    """ClusterTestbed plus `edge` (role E) and the second uplinks (see the module docstring)."""

    def __init__(self, *, ports: Sequence[int] = DEFAULT_PORTS) -> None:
        super().__init__(ports=ports)
        self.edge: Host

    def _build(self) -> None:
        super()._build()
        (edge_ns,) = self._add_namespaces(["E"])
        self.edge = Host("edge", LAB4, "", edge_ns)
        edge_ns.call(_write_sysctls, _sysctls(router=True))
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
        _run(["ip", "-n", edge_ns.name, "-batch", "-"], _batch(lines))
        node_a = [
            "link set eth1 up",
            f"addr add {UPLINK_A4}/24 dev eth1",
            f"addr add {PLATFORM_A4}/32 dev lo",
            f"route add {LAB_CIDR4} via {EDGE_A4} dev eth1",
            f"route add {LAB_PREFSRC_CIDR4} via {EDGE_A4} dev eth1 src {PLATFORM_A4}",
            f"route add {BEYOND_B_CIDR4} via {NODE_B4}",
        ]
        _run(["ip", "-n", a.ns.name, "-batch", "-"], _batch(node_a))
        node_b = [
            "link set eth1 up",
            f"addr add {UPLINK_B4}/24 dev eth1",
            f"route add {BEYOND_B_CIDR4} via {EDGE_B4}",
        ]
        _run(["ip", "-n", b.ns.name, "-batch", "-"], _batch(node_b))
        self.serve(self.edge, self.ports)
