"""Node: what the proxy needs to know about the node it runs on (and, later, its peers)."""

from __future__ import annotations

from dataclasses import dataclass

ZONE_LABEL = "topology.kubernetes.io/zone"
#: The MTU of the node's pod network uplink, as the Lace CNI publishes it (doctor node
#: compares the nodes').
MTU_ANNOTATION = "lace-cni.io/mtu"


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    zone: str | None = None  # from ZONE_LABEL
    addresses: tuple[tuple[str, str], ...] = ()  # (type, canonical address)
    pod_cidrs: tuple[str, ...] = ()  # canonical CIDRs
    deleting: bool = False  # metadata.deletionTimestamp is set
    labels: tuple[tuple[str, str], ...] = ()
    mtu: int | None = None  # from MTU_ANNOTATION
