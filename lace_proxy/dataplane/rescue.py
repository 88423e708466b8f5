"""Replies in flight when a UDP flow moves: delivered, not dropped.

A UDP flow leaves an endpoint that stopped serving when its conntrack entry is deleted
(conntrack.py): the client's next datagram is balanced anew. A reply the old endpoint sends
after that instant, to a query sent just before it, finds no entry to translate it back: it
reaches the client from the pod's address (a connected socket drops it), or, masqueraded,
not at all. kube-proxy's cleanup loses such a query; lace-proxy does not.

Before the entries are deleted, their translations are written into short-lived maps
(`SECONDS`), and the node translates the old endpoint's replies itself, statelessly: in
prerouting, before conntrack, the reply's destination (the masqueraded address, if it was)
becomes the client's again and the packet is left untracked; after routing (postrouting,
or input for the node's own client) its source becomes the frontend the client sent to. The
client's next datagram makes a new entry to a serving endpoint as before: only packets from
the old endpoint to that client's port are translated so, and only for `SECONDS`.

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
from lace_proxy.dataplane.nftables.transaction import Elements, Transaction

log = logging.getLogger(__name__)

#: How long a moved flow's old endpoint can still answer: longer than any reply in flight.
SECONDS = 5
#: Flows rescued per sync at most (the rest are deleted without, as kube-proxy's are): the
#: batch is built before the deletion, which waits for it.
LIMIT = 10_000
FAMILIES = (4, 6)
KINDS = ("daddr", "dport", "sport", "saddr")
CONTAINERS = tuple(f"rescue-{kind}-v{fam}" for fam in FAMILIES for kind in KINDS)


def declarations(family: int) -> list[str]:
    """The family's four maps (nft table body lines)."""
    at = "ipv4_addr" if family == 4 else "ipv6_addr"
    key = f"{at} . inet_service . {at} . inet_service"
    values = {"daddr": at, "dport": "inet_service", "sport": "inet_service", "saddr": at}
    return [
        f"  map rescue-{kind}-v{family} {{ type {key} : {values[kind]};"
        f" flags timeout; timeout {SECONDS}s; }}"
        for kind in KINDS
    ]


def chains() -> list[str]:
    """The base chains that translate a rescued reply (nft table body lines)."""
    pre, post = [], []
    for fam in FAMILIES:
        ip, v = ("ip" if fam == 4 else "ip6"), f"v{fam}"
        key = f"{ip} saddr . udp sport . {ip} daddr . udp dport"
        pre.append(
            f"    {ip} daddr set {key} map @rescue-daddr-{v}"
            f" udp dport set {key} map @rescue-dport-{v} notrack"
        )
        post.append(
            f"    ct state untracked udp sport set {key} map @rescue-sport-{v}"
            f" {ip} saddr set {key} map @rescue-saddr-{v}"
        )
    return [
        "  chain rescue-prerouting {",
        "    type filter hook prerouting priority raw; policy accept;",
        *pre,
        "  }",
        "  chain rescue-postrouting {",
        "    type filter hook postrouting priority srcnat; policy accept;",
        *post,
        "  }",
        "  chain rescue-input {",
        "    type filter hook input priority 100; policy accept;",
        *post,
        "  }",
    ]


def transaction(table: str, flows: Iterable[UdpFlow], limit: int = LIMIT) -> Transaction:
    """The batch that rescues these flows' replies (empty for none). A key still held from a
    move less than SECONDS ago with another value makes the kernel refuse the batch: the
    caller then moves the flows unrescued, as kube-proxy does."""
    elements: dict[str, dict[str, str]] = {c: {} for c in CONTAINERS}
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
