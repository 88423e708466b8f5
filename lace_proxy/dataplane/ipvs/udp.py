"""UDP real servers leave at once (no graceful termination for UDP, as kube-proxy), their
flows moved to the servers that stay with as few lost packets as the kernel allows."""

from __future__ import annotations

import errno
import logging
import time

from lace_proxy.dataplane.conntrack import delete_requests
from lace_proxy.dataplane.ipvs import kernel
from lace_proxy.dataplane.ipvs.model import VirtualServer
from lace_proxy.dataplane.ipvs.netlink import IpvsChannel
from lace_proxy.dataplane.netlink import NETLINK_NETFILTER, NetlinkSocket, send_together
from lace_proxy.dataplane.nftables.backend import NftablesBackend

log = logging.getLogger(__name__)


def remove_udp_servers(
    channel: IpvsChannel,
    nft: NftablesBackend,
    gone: list[tuple[VirtualServer, tuple[str, int]]],
    failed: list[str],
) -> int:
    """Delete UDP real servers (`gone`) at once: a flow's next packet then finds its
    connection's server gone and is balanced anew. Returns how many were deleted; each
    refusal is logged and added to `failed`.

    IPVS drops that packet instead if it still has the flow's old, confirmed conntrack
    entry (ip_vs_in, expire_nodest_conn: "old conntrack"), until the kernel's own flush
    of the server's connections deletes the entry a moment later. So:
    1. The leaving servers get weight 0, so that no new flow picks them; their flows
       keep them, and the listing that follows holds every flow they will ever have.
    2. The replies on their way from those servers are rescued (nftables translates
       them once IPVS no longer does), and the flows' deletion requests are encoded.
    3. With nothing in between (netlink.send_together): the flows' entries are deleted,
       the servers (one buffer), then the flows' entries again (those a packet made in
       between, sent on to the old server, which is still there). A flow loses a packet
       only if it sends two inside that moment; streams (conntrack's ASSURED flows) are
       deleted last the first time and first the second, so theirs is the shortest.
    Whatever flow the listing missed is deleted last, by endpoint (`conntrack -D`)."""
    if not gone:
        return 0
    weights = channel.batch()
    for vs, server in gone:
        weights.change_server(vs, server, 0)
    for refusal in channel.send(weights):
        log.warning("%s", refusal)
    listed = nft.rescue_udp_replies([kernel.flows_to(vs, s) for vs, s in gone])
    # Lone queries first and streams last, then streams first: a flow's moment between
    # its two deletions is the shorter the nearer it is to the servers' deletion.
    flows = sorted(listed, key=lambda f: f.assured)
    first = delete_requests(flows, 1)
    again = delete_requests(flows[::-1], len(flows) + 1)
    deletions = channel.batch()
    for vs, server in gone:
        deletions.delete_server(vs, server)
    servers, sequences = channel.whole(deletions)
    with NetlinkSocket(NETLINK_NETFILTER, answers=2 * len(flows)) as ct:
        started = time.perf_counter()
        send_together(
            [*((ct, c) for c in first), (channel.sock, servers), *((ct, c) for c in again)]
        )
        log.debug(
            "IPVS: %d UDP real servers and %d flows' entries deleted in %.3f ms",
            len(gone),
            len(flows),
            (time.perf_counter() - started) * 1000,
        )
        for sequence, code in ct.answers().items():
            if sequence <= len(flows) and code != errno.ENOENT:
                log.warning("conntrack: deleting %s failed: %s", flows[sequence - 1], code)
    refused = deletions.refusals(channel.sock.replies(), sequences)
    for refusal in refused:
        log.error("%s", refusal)
    failed += map(str, refused)
    if nft.conntrack is not None:
        nft.conntrack.delete_udp(sorted({kernel.flows_to(None, s) for _, s in gone}))
    return len(gone) - len(refused)
