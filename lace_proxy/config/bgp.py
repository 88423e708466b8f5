"""lace.bgp: announcing service addresses to the cluster host network's routers by BGP.

The section's values (schema.py parses them); what is announced is lace_proxy/bgp's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: What lace.bgp.announce.clusterIPs may say: nothing, the service CIDRs (lace.serviceCIDRs)
#: as aggregates, or each ClusterIP as a route of its own.
CLUSTER_IP_MODES = ("none", "aggregate", "perService")


@dataclass(frozen=True, slots=True)
class BgpPeer:
    """One router this node peers with; `node_selector` (Node labels, all of them to match)
    limits the peering to some nodes (empty: every node)."""

    address: str
    asn: int
    port: int = 179
    password: str = ""  # TCP MD5 (RFC 2385); "" for none
    hold_time: float = 90.0
    node_selector: tuple[tuple[str, str], ...] = ()
    password_file: str = ""  # or the file holding it (a mounted Secret), read at each sync

    def selects(self, labels: dict[str, str]) -> bool:
        """Whether a Node with these labels peers with this router."""
        return all(labels.get(key) == value for key, value in self.node_selector)


#: The longest TCP MD5 key (TCP_MD5SIG_MAXKEYLEN).
KEY_BYTES = 80


def password_problem(text: str) -> str | None:
    """What is wrong with a TCP MD5 key, or None: it is written into the speaker's
    configuration, so printable ASCII without quotes or backslashes, at most 80 bytes."""
    if not all(" " <= c <= "~" and c not in '"\\' for c in text):
        return "may hold printable ASCII only, without quotes or backslashes"
    if len(text) > KEY_BYTES:
        return f"is longer than {KEY_BYTES} bytes (the TCP MD5 key's limit)"
    return None


@dataclass(frozen=True, slots=True)
class LaceBgpAnnounceConfig:
    """lace.bgp.announce: which kinds of service address are announced (a service's
    annotation lace-proxy.lace-cni.io/bgp-advertise turns its own on or off)."""

    load_balancer_ips: bool = True
    external_ips: bool = True
    cluster_ips: str = "none"  # one of CLUSTER_IP_MODES


@dataclass(frozen=True, slots=True)
class LaceBgpConfig:
    """lace.bgp: off unless `enabled`; then `asn` and at least one peer are required.
    `router_id` defaults to the node's InternalIP (IPv4). The speaker (BIRD) keeps its
    configuration and control socket in `directory`; routers keep a restarting node's
    routes for `graceful_restart_time`."""

    enabled: bool = False
    asn: int = 0
    router_id: str = ""
    peers: tuple[BgpPeer, ...] = ()
    announce: LaceBgpAnnounceConfig = field(default_factory=LaceBgpAnnounceConfig)
    graceful_restart_time: float = 120.0
    directory: str = "/run/lace-proxy/bgp"
