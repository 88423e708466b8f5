"""ServiceCIDR (networking.k8s.io/v1): a range the cluster allocates ClusterIPs from.

kube-proxy's nftables mode drops new connections to an address inside these ranges that no
Service holds (an unallocated ClusterIP), so they are neither forwarded nor sent out of the
node's uplink. Where the API has none (or serves none), `lace.serviceCIDRs` stands in.
"""

from __future__ import annotations

from dataclasses import dataclass

SERVICE_CIDR_API_VERSION = "networking.k8s.io/v1"


@dataclass(frozen=True, slots=True)
class ServiceCIDR:
    name: str
    # Canonical, at most one per family (as the API enforces). One being deleted still
    # counts: its finalizer holds it while Services still have addresses in it.
    cidrs: tuple[str, ...]

    @property
    def key(self) -> str:
        return self.name
