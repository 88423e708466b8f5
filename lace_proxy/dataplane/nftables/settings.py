"""What the nftables backend takes from the configuration, checked where it is made.

Names and CIDRs from here reach nft as text (table, interface prefix, set elements), so
they are validated before any rule is rendered from them; the egress SNAT table follows the
same rules for its names.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from lace_proxy.dataplane.nftables.parts import MAX_PARTS, PART_SIZE, parts_for

#: An nftables table name that needs no quoting.
TABLE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")
#: An interface name prefix (matched as `prefix*`) that needs no quoting.
IFNAME_PREFIX = re.compile(r"^[A-Za-z0-9._-]{1,15}$")


@dataclass(frozen=True)
class NftablesSettings:
    """What the backend needs from the configuration."""

    table: str = "lace-proxy"
    masquerade_all: bool = False
    masquerade_bit: int = 14
    cluster_cidrs: tuple[str, ...] = ()  # pod CIDRs: sources inside them are not masqueraded
    node_port_cidrs: tuple[str, ...] = ()  # empty: NodePorts on every local address
    # nodePortAddresses "primary": NodePorts only on the node's own addresses (from its Node
    # object), none until they are known.
    node_port_primary: bool = False
    # node.serviceCIDRs: with the Lace network model on, only ClusterIPs inside them are
    # proxied for the node's own traffic (the rest leave by its ordinary routes).
    service_cidrs: tuple[str, ...] = ()
    # detectLocal.interfaceNamePrefix: the node's pod interfaces. With the network model on,
    # the node's own connections out of them (to its local pods, e.g. kubelet probes) are
    # never refused; without it only its podCIDRs are exempt.
    pod_interface_prefix: str = ""
    # False in IPVS mode: IPVS translates (and remembers ClientIP affinity); nftables only
    # filters, marks for masquerade and enforces the network model.
    translate: bool = True
    # The parts of the biggest containers (parts.py): 0 for as many as the service ports
    # need at `part_size` each; else exactly this many (a power of two), as tests split a
    # small table.
    parts: int = 0
    part_size: int = PART_SIZE

    def parts_for(self, ports: int, current: int) -> int:
        """The parts of the biggest containers for `ports` service ports, split `current`
        ways now."""
        return self.parts or parts_for(ports, current, self.part_size)

    def __post_init__(self) -> None:
        if not TABLE_NAME.match(self.table):
            raise ValueError(f"invalid nftables table name {self.table!r}")
        if self.pod_interface_prefix and not IFNAME_PREFIX.match(self.pod_interface_prefix):
            raise ValueError(
                f"interface prefix {self.pod_interface_prefix!r}: only letters, digits, "
                "'.', '_' and '-' (at most 15) can be used in nftables rules"
            )
        if self.part_size < 1:
            raise ValueError(f"part size {self.part_size} is not positive")
        if self.parts and (self.parts > MAX_PARTS or self.parts & (self.parts - 1)):
            raise ValueError(f"parts {self.parts}: not a power of two up to {MAX_PARTS}")
        if not 0 <= self.masquerade_bit <= 31:
            raise ValueError(f"masqueradeBit {self.masquerade_bit} is not in 0-31")
        for cidr in (*self.cluster_cidrs, *self.node_port_cidrs, *self.service_cidrs):
            ipaddress.ip_network(cidr, strict=False)  # raises ValueError on bad input
