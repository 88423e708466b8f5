"""The dataplane contract, as kube-proxy's pkg/proxy/types.go: what the proxier calls on a
backend, and the types a sync speaks.

The table (`lace_proxy.table`) computes a `Plan` per service port and IP family, holding all
that the kernel needs of it, and hands over what changed since its last committed build as a
`Changeset`. The proxier gives a backend those, with the network model's `NetworkLayout` of
the same moment, from one thread (pyroute2 and the nft subprocess stay off the event loop).
A backend turns them into kernel transactions and never decides policy. Two implement the
contract: `nftables.backend.NftablesBackend` (mode nftables), and `ipvs.IpvsBackend` (mode
ipvs: IPVS translates, and an NftablesBackend without translation does the rest).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from lace_proxy.networks.graph import NetworkLayout
from lace_proxy.table import Changeset, Plan

__all__ = ["NO_NETWORKS", "Changeset", "Dataplane", "NetworkLayout", "Plan"]

#: The layout without Network objects: plain kube-proxy.
NO_NETWORKS = NetworkLayout()


class Dataplane(Protocol):
    """What the proxier needs of a backend; `lace-proxy cleanup` also calls `cleanup`.

    A sync that raises failed: the proxier keeps serving what the kernel holds and makes
    its next sync a full one (after a backoff).
    """

    def full_sync(
        self, plans: Iterable[Plan], changes: Changeset | None, layout: NetworkLayout
    ) -> int:
        """Bring the kernel to exactly `plans` (all of the table's) and `layout`; returns
        the number of kernel operations it took.

        The first sync of a process adopts what the kernel holds by diff (no flush: a
        restart drops no connection); the later ones repair drift. `changes` are what
        changed since the last sync, when known, so that a backend may program only those
        and check the rest cheaply.
        """
        ...

    def apply(self, changes: Changeset, layout: NetworkLayout) -> int:
        """Program `changes` (and `layout`, if it differs from the last one taken); returns
        the number of kernel operations."""
        ...

    def node_addresses_changed(self, addresses: tuple[str, ...]) -> bool:
        """The node's InternalIPs (from its Node object) are now `addresses`; True when the
        next sync must be a full one."""
        ...

    def cleanup(self) -> bool:
        """Remove everything this backend made; True when something was there."""
        ...
