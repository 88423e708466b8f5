"""What one table build hands to a dataplane: the service ports that changed since the last commit.

Shared by both table twins: it is built once per sync, so it need not be compiled. `Plan` and
`Backend` are the contract both twins' classes meet (the pure twin's NamedTuples in
`_pytable.py`, the compiled core's classes typed by `_ctable.pyi`): what the dataplane, the
proxier and explain read of them. They are read-only; neither twin's extras (tuple indexing,
`_replace`) are part of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from lace_proxy.model.service import BgpAnnotations

#: Frontend kinds, in the order `Plan.frontends()` yields them.
CLUSTER_IP = "ClusterIP"
NODE_PORT = "NodePort"
EXTERNAL_IP = "ExternalIP"
LOAD_BALANCER = "LoadBalancer"


class Backend(Protocol):
    """One endpoint a frontend may forward to, with the conditions it was chosen under."""

    @property
    def ip(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def local(self) -> bool: ...
    @property
    def ready(self) -> bool: ...
    @property
    def serving(self) -> bool: ...
    @property
    def terminating(self) -> bool: ...


class Plan(Protocol):
    """Everything the dataplane needs for one service port in one IP family.

    The fields' meaning is documented on the pure twin's `Plan` (`_pytable.py`).
    """

    @property
    def id(self) -> str: ...
    @property
    def service(self) -> str: ...
    @property
    def port_name(self) -> str: ...
    @property
    def protocol(self) -> str: ...
    @property
    def family(self) -> int: ...
    @property
    def cluster_ip(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def node_port(self) -> int: ...
    @property
    def external_ips(self) -> tuple[str, ...]: ...
    @property
    def lb_ips(self) -> tuple[str, ...]: ...
    @property
    def lb_source_ranges(self) -> tuple[str, ...]: ...
    @property
    def affinity_timeout(self) -> int: ...
    @property
    def internal_local(self) -> bool: ...
    @property
    def external_local(self) -> bool: ...
    @property
    def cluster_backends(self) -> tuple[Backend, ...]: ...
    @property
    def local_backends(self) -> tuple[Backend, ...]: ...
    @property
    def internal_verdict(self) -> str | None: ...
    @property
    def external_verdict(self) -> str | None: ...
    @property
    def health_check_node_port(self) -> int: ...
    @property
    def access(self) -> Access | None: ...
    @property
    def scheduler(self) -> str: ...
    @property
    def bgp(self) -> BgpAnnotations | None: ...
    @property
    def standby_backends(self) -> tuple[Backend, ...]: ...
    @property
    def internal_backends(self) -> tuple[Backend, ...]: ...
    @property
    def external_backends(self) -> tuple[Backend, ...]: ...
    def frontends(self) -> Iterator[Frontend]: ...


class Frontend(NamedTuple):
    """One address . protocol . port a service port answers on, with what happens there.

    `address` is None for a NodePort: it answers on every configured node port address.
    `verdict` is None when traffic is load-balanced over `backends`, else "reject" or "drop".
    `masquerade` says which sources get SNAT: "off-cluster" (ClusterIP), "always" (external
    kinds under externalTrafficPolicy Cluster) or "node" (Local: only node-originated traffic).
    """

    kind: str
    address: str | None
    protocol: str
    port: int
    family: int
    backends: tuple[Backend, ...]
    verdict: str | None
    masquerade: str
    affinity_timeout: int


class Access(NamedTuple):
    """Who may reach a service port under the Lace network model (a plan without one: anyone).

    `network` is the network the service is bound to (None: bound to none, so it carries
    nothing); `sources` are the source networks allowed to reach its frontends, sorted.
    """

    network: str | None
    sources: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Changeset:
    """Plans added, removed and updated (old, new) since the last committed build.

    Plans are keyed by `Plan.id`; a dataplane programs exactly these and nothing else.
    """

    added: tuple[Plan, ...] = ()
    removed: tuple[Plan, ...] = ()
    updated: tuple[tuple[Plan, Plan], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.updated)

    def __len__(self) -> int:
        return len(self.added) + len(self.removed) + len(self.updated)


def backend_state(backend: Backend) -> dict[str, Any]:
    """A backend as operators read it (the CLI's JSON): address and conditions."""
    b = backend
    return {
        "ip": b.ip,
        "port": b.port,
        "ready": b.ready,
        "serving": b.serving,
        "terminating": b.terminating,
        "local": b.local,
    }


def plan_frontends(plan: Plan) -> Iterator[Frontend]:
    """Each frontend of a plan, ClusterIP first; shared by both twins (reads public attributes)."""
    p = plan
    yield Frontend(
        CLUSTER_IP,
        p.cluster_ip,
        p.protocol,
        p.port,
        p.family,
        p.internal_backends,
        p.internal_verdict,
        "off-cluster",
        p.affinity_timeout,
    )
    ext = p.external_backends
    masq = "node" if p.external_local else "always"
    if p.node_port:
        yield Frontend(
            NODE_PORT,
            None,
            p.protocol,
            p.node_port,
            p.family,
            ext,
            p.external_verdict,
            masq,
            p.affinity_timeout,
        )
    for kind, addresses in ((EXTERNAL_IP, p.external_ips), (LOAD_BALANCER, p.lb_ips)):
        for address in addresses:
            yield Frontend(
                kind,
                address,
                p.protocol,
                p.port,
                p.family,
                ext,
                p.external_verdict,
                masq,
                p.affinity_timeout,
            )
