"""EndpointSlice: the validated, immutable view of a discovery.k8s.io/v1 EndpointSlice."""

from __future__ import annotations

from dataclasses import dataclass

#: Label naming the Service a slice belongs to.
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
#: Annotation the endpoints controller sets to the time of the change that produced the slice.
LAST_CHANGE_TRIGGER_TIME = "endpoints.kubernetes.io/last-change-trigger-time"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One endpoint; the API's nil `ready`/`serving` are already resolved to True."""

    addresses: tuple[str, ...]  # canonical; the proxy uses addresses[0], as kube-proxy does
    ready: bool = True
    serving: bool = True
    terminating: bool = False
    node_name: str | None = None
    zone: str | None = None
    hint_zones: tuple[str, ...] | None = None  # hints.forZones; None when no hints
    hint_nodes: tuple[str, ...] | None = None  # hints.forNodes; None when absent


@dataclass(frozen=True, slots=True)
class EndpointPort:
    """One entry of a slice's ports; `port` None means "all ports" (unusable for a proxy)."""

    name: str
    protocol: str
    port: int | None


@dataclass(frozen=True, slots=True)
class EndpointSlice:
    """An EndpointSlice of one Service and one address family."""

    namespace: str
    name: str
    service_name: str  # from SERVICE_NAME_LABEL; required
    address_type: str  # "IPv4" | "IPv6" | "FQDN"
    endpoints: tuple[Endpoint, ...]
    ports: tuple[EndpointPort, ...]
    trigger_time: float | None = None  # LAST_CHANGE_TRIGGER_TIME as a UNIX timestamp
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def service_key(self) -> str:
        return f"{self.namespace}/{self.service_name}"
