"""Service: the validated, immutable view of a core/v1 Service that the table needs."""

from __future__ import annotations

from dataclasses import dataclass

#: Label that hands a service to another proxy (kube-proxy skips such services).
SERVICE_PROXY_NAME_LABEL = "service.kubernetes.io/service-proxy-name"
#: Label set by the endpoints controller on headless services' slices and services.
HEADLESS_LABEL = "service.kubernetes.io/headless"

DEFAULT_AFFINITY_TIMEOUT = 10800

#: IPVS schedulers for ipvs.scheduler and the per-service annotation: those kube-proxy's
#: validation accepts, plus mh (Maglev hashing, which kube-proxy refuses only by omission).
IPVS_SCHEDULERS = ("rr", "wrr", "lc", "wlc", "lblc", "lblcr", "sh", "dh", "sed", "nq", "mh")
#: Annotation choosing the service's IPVS scheduler (ipvs mode); unset means ipvs.scheduler.
IPVS_SCHEDULER_ANNOTATION = "lace-proxy.lace-cni.io/ipvs-scheduler"
#: kube-router's annotation for the same, read when IPVS_SCHEDULER_ANNOTATION is unset, so
#: services annotated for kube-router keep their scheduler.
KUBE_ROUTER_SCHEDULER_ANNOTATION = "kube-router.io/service.scheduler"
#: Annotation turning the BGP announcement of the service's addresses on ("true") or off
#: ("false"); unset means what lace.bgp.announce says for its kind of address.
BGP_ADVERTISE_ANNOTATION = "lace-proxy.lace-cni.io/bgp-advertise"
#: Annotation giving the BGP communities of the service's routes, comma-separated: standard
#: ("65000:100"), large ("65000:1:2") or well-known by name (WELL_KNOWN_COMMUNITIES).
BGP_COMMUNITIES_ANNOTATION = "lace-proxy.lace-cni.io/bgp-communities"
WELL_KNOWN_COMMUNITIES = {
    "no-export": "65535:65281",
    "no-advertise": "65535:65282",
    "no-export-subconfed": "65535:65283",
    "blackhole": "65535:666",
}


def community(text: str) -> str:
    """A BGP community in its canonical form ("65000:100", "65000:1:2"), from the forms
    BGP_COMMUNITIES_ANNOTATION accepts; ValueError names what is wrong."""
    text = text.strip()
    if text in WELL_KNOWN_COMMUNITIES:
        return WELL_KNOWN_COMMUNITIES[text]
    parts = text.split(":")
    if len(parts) not in (2, 3) or not all(p.isascii() and p.isdigit() for p in parts):
        names = ", ".join(WELL_KNOWN_COMMUNITIES)
        raise ValueError(f"{text!r} is not a community (ASN:VALUE, ASN:X:Y, or one of {names})")
    limit = 0xFFFF if len(parts) == 2 else 0xFFFFFFFF
    if any(int(p) > limit for p in parts):
        kind = "standard community's parts" if len(parts) == 2 else "large community's parts"
        raise ValueError(f"{text!r}: a {kind} are at most {limit}")
    return ":".join(str(int(p)) for p in parts)


@dataclass(frozen=True, slots=True)
class BgpAnnotations:
    """A service's BGP annotations: whether to announce its addresses (None: as configured
    for their kind) and the communities of its routes (canonical, sorted)."""

    advertise: bool | None = None
    communities: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ServicePort:
    """One entry of spec.ports. `node_port` is 0 when none is allocated."""

    name: str
    protocol: str  # "TCP" | "UDP" | "SCTP"
    port: int
    target_port: int | str | None
    node_port: int = 0


@dataclass(frozen=True, slots=True)
class Service:
    """A Service, reduced to what proxying needs; addresses are canonical strings."""

    namespace: str
    name: str
    type: str  # "ClusterIP" | "NodePort" | "LoadBalancer" | "ExternalName"
    cluster_ips: tuple[str, ...]  # empty for headless ("None") and ExternalName
    ports: tuple[ServicePort, ...]
    external_ips: tuple[str, ...] = ()
    lb_ingress_ips: tuple[str, ...] = ()
    lb_source_ranges: tuple[str, ...] = ()  # canonical CIDRs
    external_traffic_policy: str = "Cluster"  # "Cluster" | "Local"
    internal_traffic_policy: str = "Cluster"  # "Cluster" | "Local"
    traffic_distribution: str | None = None
    session_affinity: bool = False  # sessionAffinity: ClientIP
    affinity_timeout: int = DEFAULT_AFFINITY_TIMEOUT  # seconds, meaningful with affinity
    health_check_node_port: int = 0
    headless: bool = False  # clusterIP "None"
    proxy_name: str | None = None  # value of SERVICE_PROXY_NAME_LABEL
    labels: tuple[tuple[str, str], ...] = ()  # sorted (key, value) pairs
    ipvs_scheduler: str | None = None  # one of IPVS_SCHEDULERS; None: the default
    bgp: BgpAnnotations | None = None  # None: neither BGP annotation set

    @property
    def key(self) -> str:
        """`namespace/name`, the identity used across the proxy."""
        return f"{self.namespace}/{self.name}"

    @property
    def proxied(self) -> bool:
        """False for services kube-proxy ignores: headless, ExternalName, other proxies'."""
        return bool(self.cluster_ips) and not (
            self.headless or self.type == "ExternalName" or self.proxy_name is not None
        )
