"""`lace-proxy doctor`: what will happen to a pod's traffic out of the cluster, and why it
may fail (DESIGN.md §4); and whether this node is fit for lace-proxy.

`egress` reads the node's routing table once (`RoutingSnapshot`, as the egress SNAT does)
and answers for one pod and destination: the route the node selects, the source address the
far end will see, and whether the return path can work. `node` checks the kernel features
for the mode, sysctls, MTUs against the other nodes', and kube-proxy's leftovers. Both read,
never change; each finding says what to do.
"""

from lace_proxy.doctor.egress import EgressReport, EgressSettingsView, Finding, diagnose_egress
from lace_proxy.doctor.node import (
    NODE_SYSCTLS,
    Check,
    NodeFacts,
    NodeReport,
    NodeSettingsView,
    diagnose_node,
    read_node_facts,
)
from lace_proxy.doctor.severity import NOTE, OK, PROBLEM

__all__ = [
    "NODE_SYSCTLS",
    "NOTE",
    "OK",
    "PROBLEM",
    "Check",
    "EgressReport",
    "EgressSettingsView",
    "Finding",
    "NodeFacts",
    "NodeReport",
    "NodeSettingsView",
    "diagnose_egress",
    "diagnose_node",
    "read_node_facts",
]
