"""`lace-proxy explain`: what happens to one new connection, and why, from the table and kernel.

An operator asking "why can't X reach Y?" needs four answers at once: which network the source
is in, what the destination is (a service frontend, a pod, nothing of ours), which network the
service is bound to, and which policy lets the connection through or what is missing. This
package gives them from the same state the proxy programs (the proxier's table, its network
view and graph, the settings the renderer uses), so that the answer is the kernel's answer, not
a second opinion. The decision is the graph's (`NetworkGraph.classify`, `allowed_sources` via
the plans' `Access`, `layout()` for the node's own traffic); this package only names the
policies behind it and orders the kernel's checks as the nftables chains do:

* output (the node's own traffic, `node`): ClusterIPs outside node.serviceCIDRs are not
  proxied at all; a NodePort on the node's own address is dropped; a pod network host-local is
  not peered to is refused unless the address is in the node's own podCIDRs; then the
  host-local network's reach sets decide, then the endpoint checks (reject/drop).
* prerouting (everything else): the source's network (`classify`) and its reach sets, then
  loadBalancerSourceRanges, then the endpoint checks. Pod-to-pod traffic is the CNI's.
* an address of the service CIDRs that no Service holds is dropped, whoever sends to it.

`check_kernel` compares what `explain` expects of the kernel's sets with what
`NftablesBackend.read_back()` reports, using the renderer's own element text.

Modules: `query` (the question and the state it is answered from), `decide` (the decision),
`reasons` (the words naming what is behind it), `kernel` (what the kernel must hold, and the
check), `explanation` (the answer, as text or JSON).
"""

from lace_proxy.explain.decide import explain
from lace_proxy.explain.explanation import (
    ALLOWED,
    DENIED,
    DROPPED,
    GOES_THROUGH,
    PASSES,
    REJECTED,
    UNPROXIED,
    BackendInfo,
    Expect,
    Explanation,
    KernelCheck,
)
from lace_proxy.explain.kernel import check_kernel
from lace_proxy.explain.query import (
    NODE,
    PROTOCOLS,
    NodeFacts,
    Query,
    QueryError,
    State,
    parse_query,
)

__all__ = [
    "ALLOWED",
    "DENIED",
    "DROPPED",
    "GOES_THROUGH",
    "NODE",
    "PASSES",
    "PROTOCOLS",
    "REJECTED",
    "UNPROXIED",
    "BackendInfo",
    "Expect",
    "Explanation",
    "KernelCheck",
    "NodeFacts",
    "Query",
    "QueryError",
    "State",
    "check_kernel",
    "explain",
    "parse_query",
]
