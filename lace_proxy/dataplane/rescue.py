"""Replies in flight when a UDP flow moves: delivered, not dropped.

A UDP flow leaves an endpoint that stopped serving when its conntrack entry is deleted
(conntrack.py): the client's next datagram is balanced anew. A reply the old endpoint sends
after that instant, to a query sent just before it, finds no entry to translate it back: it
reaches the client from the pod's address (a connected socket drops it), or, masqueraded,
not at all. kube-proxy's cleanup loses such a query; lace-proxy does not.

Before the entries are deleted, their translations are written into short-lived maps
(`RESCUE_SECONDS`), and the node translates the old endpoint's replies itself, statelessly:
in prerouting, before conntrack, the reply's destination (the masqueraded address, if it
was) becomes the client's again and the packet is left untracked; after routing
(postrouting, or input for the node's own client) its source becomes the frontend the client
sent to. The client's next datagram makes a new entry to a serving endpoint as before: only
packets from the old endpoint to that client's port are translated so, and only for
`RESCUE_SECONDS`. The maps and those chains are the table's fixed part, declared with it
(nftables/skeleton.py); this module fills the maps.

Keys and values, with a flow's original tuple `client:cport -> frontend:fport` and its reply
tuple `pod:pport -> dst:dport` (dst:dport is the client's, or the masqueraded, address):
- `rescue-daddr`: pod . pport . dst . dport -> client
- `rescue-dport`: pod . pport . client . dport -> cport (the destination just rewritten)
- `rescue-sport`: pod . pport . client . cport -> fport
- `rescue-saddr`: pod . fport . client . cport -> frontend (the source port just rewritten)
A missing key ends its rule (a map lookup that fails), so no packet is rewritten halfway.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from lace_proxy.dataplane.conntrack import UdpFlow
from lace_proxy.dataplane.nftables.skeleton import RESCUE_CONTAINERS
from lace_proxy.dataplane.nftables.transaction import Elements, Transaction

log = logging.getLogger(__name__)

#: Flows rescued per sync at most (the rest are deleted without, as kube-proxy's are): the
#: batch is built before the deletion, which waits for it.
LIMIT = 10_000


def transaction(table: str, flows: Iterable[UdpFlow], limit: int = LIMIT) -> Transaction:
    """The batch that rescues these flows' replies (empty for none). A key still held from a
    move less than RESCUE_SECONDS ago with another value makes the kernel refuse the batch:
    the caller then moves the flows unrescued, as kube-proxy does."""
    elements: dict[str, dict[str, str]] = {c: {} for c in RESCUE_CONTAINERS}
    for count, f in enumerate(flows):
        if count == limit:
            log.info("conntrack: more than %d UDP flows moved at once; the rest unrescued", limit)
            break
        v = f"v{f.family}"
        pod = f"{f.pod} . {f.pod_port}"
        to_client = f"{f.client} . {f.client_port}"
        elements[f"rescue-daddr-{v}"][f"{pod} . {f.reply_dst} . {f.reply_dst_port}"] = f.client
        elements[f"rescue-dport-{v}"][f"{pod} . {f.client} . {f.reply_dst_port}"] = str(
            f.client_port
        )
        elements[f"rescue-sport-{v}"][f"{pod} . {to_client}"] = str(f.frontend_port)
        elements[f"rescue-saddr-{v}"][f"{f.pod} . {f.frontend_port} . {to_client}"] = f.frontend
    tx = Transaction()
    for container, pairs in elements.items():
        if pairs:
            body = tuple(f"{k} : {pairs[k]}" for k in sorted(pairs))
            tx.add(Elements("add", "inet", table, container, body))
    return tx
