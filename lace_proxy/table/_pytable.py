"""The pure-Python twin of the service table (ext/table.pyx is the compiled one).

Both twins have the same API and semantics; tests run every table test against both.
The semantics follow kube-proxy's pkg/proxy: EndpointSliceCache (merge, dedupe) and
CategorizeEndpoints (ready → serving+terminating fallback, Local policies, topology hints).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import NamedTuple

from lace_proxy.model.endpointslice import Endpoint, EndpointSlice
from lace_proxy.model.service import BgpAnnotations, Service
from lace_proxy.table.changeset import Access, Changeset, Frontend, plan_frontends
from lace_proxy.table.claims import (
    Claims,
    FrontendKey,
    describe_conflicts,
    format_key,
    service_frontend_keys,
)

IMPLEMENTATION = "pure"

log = logging.getLogger("lace_proxy.table")


class Backend(NamedTuple):
    """One endpoint a frontend may forward to, with the conditions it was chosen under."""

    ip: str
    port: int
    local: bool
    ready: bool
    serving: bool
    terminating: bool


class Plan(NamedTuple):
    """Everything the dataplane needs for one service port in one IP family.

    `cluster_backends` are the endpoints for policy Cluster (used by ClusterIP unless
    internalTrafficPolicy is Local, by external kinds unless externalTrafficPolicy is Local,
    and for short-circuited in-cluster traffic to external addresses); `local_backends` are
    this node's endpoints, for the Local policies. A verdict of "reject"/"drop" replaces
    load balancing for internal (ClusterIP) or external (NodePort, ExternalIP, LB) traffic.
    `access` says which Lace networks may reach the frontends (None: no network model).
    `scheduler` is the IPVS scheduler the service asks for ("": the configured default),
    `bgp` its BGP annotations (None: none set).
    `standby_backends` are the serving endpoints neither set uses (terminating ones while
    others are ready, those left out by topology or a Local policy): no new flow goes to
    them, but the flows they already have stay (UDP conntrack cleanup spares them, as
    kube-proxy's reconciler keeps every flow whose endpoint is serving).
    """

    id: str
    service: str
    port_name: str
    protocol: str
    family: int
    cluster_ip: str
    port: int
    node_port: int
    external_ips: tuple[str, ...]
    lb_ips: tuple[str, ...]
    lb_source_ranges: tuple[str, ...]
    affinity_timeout: int
    internal_local: bool
    external_local: bool
    cluster_backends: tuple[Backend, ...]
    local_backends: tuple[Backend, ...]
    internal_verdict: str | None
    external_verdict: str | None
    health_check_node_port: int
    access: Access | None = None
    scheduler: str = ""
    standby_backends: tuple[Backend, ...] = ()
    bgp: BgpAnnotations | None = None

    @property
    def internal_backends(self) -> tuple[Backend, ...]:
        return self.local_backends if self.internal_local else self.cluster_backends

    @property
    def external_backends(self) -> tuple[Backend, ...]:
        return self.local_backends if self.external_local else self.cluster_backends

    def frontends(self) -> Iterator[Frontend]:
        """Each address . protocol . port this plan answers on, ClusterIP first."""
        return plan_frontends(self)


def _family(address: str) -> int:
    return 6 if ":" in address else 4


class _Candidate(NamedTuple):
    """A merged endpoint before categorization; keeps the hints that topology needs."""

    ip: str
    port: int
    local: bool
    ready: bool
    serving: bool
    terminating: bool
    zone_hints: tuple[str, ...] | None
    node_hints: tuple[str, ...] | None


class ServiceTable:
    """This node's service table: services and slices in, changesets of plans out.

    Updates only mark a service dirty; `build()` recomputes the dirty services (cost
    proportional to their size) and diffs them against what was last committed.
    `commit()` records a build as applied once the dataplane has programmed it; a build
    that is not committed is recomputed by the next one.
    """

    implementation = IMPLEMENTATION

    def __init__(self, node_name: str, zone: str | None = None) -> None:
        self._node = node_name
        self._zone = zone
        self._services: dict[str, Service] = {}
        self._slices: dict[str, EndpointSlice] = {}
        self._slices_by_service: dict[str, dict[str, EndpointSlice]] = {}
        self._applied: dict[str, dict[str, Plan]] = {}
        self._dirty: dict[str, int] = {}
        self._generation = 0
        self._pending: dict[str, tuple[int, dict[str, Plan]]] = {}
        self._claims = Claims()
        self._access: dict[str, Access] = {}

    @property
    def node_name(self) -> str:
        return self._node

    @property
    def zone(self) -> str | None:
        return self._zone

    def set_node(self, node_name: str, zone: str | None) -> None:
        """Topology and Local policies depend on the node: a change recomputes everything."""
        if (node_name, zone) == (self._node, self._zone):
            return
        self._node, self._zone = node_name, zone
        for key in {*self._services, *self._slices_by_service, *self._applied}:
            self._mark(key)

    def _mark(self, key: str) -> None:
        self._generation += 1
        self._dirty[key] = self._generation

    def upsert_service(self, svc: Service) -> None:
        self._services[svc.key] = svc
        self._claim(svc.key, service_frontend_keys(svc))
        self._mark(svc.key)

    def delete_service(self, key: str) -> None:
        self._access.pop(key, None)
        if self._services.pop(key, None) is not None:
            self._claim(key, frozenset())
            self._mark(key)

    def set_access(self, key: str, access: Access | None) -> None:
        """Who may reach a service (from the network model); None lifts every restriction."""
        if self._access.get(key) == access:
            return
        if access is None:
            del self._access[key]
        else:
            self._access[key] = access
        self._mark(key)

    def _claim(self, key: str, keys: frozenset[FrontendKey]) -> None:
        was = self._claims.losers.get(key)
        for other in self._claims.update(key, keys):
            self._mark(other)  # it inherited a frontend
        lost = self._claims.losers.get(key)
        if lost and lost != was:
            owners = sorted({self._claims.owner(k) or "?" for k in lost})
            log.warning(
                "service %s: %s already served by %s; not serving it here until released",
                key,
                ", ".join(sorted(format_key(k) for k in lost)),
                ", ".join(owners),
            )

    def upsert_slice(self, sl: EndpointSlice) -> None:
        old = self._slices.get(sl.key)
        if old is not None and old.service_key != sl.service_key:
            self.delete_slice(sl.key)
        self._slices[sl.key] = sl
        self._slices_by_service.setdefault(sl.service_key, {})[sl.name] = sl
        self._mark(sl.service_key)

    def delete_slice(self, key: str) -> None:
        sl = self._slices.pop(key, None)
        if sl is None:
            return
        by_name = self._slices_by_service[sl.service_key]
        del by_name[sl.name]
        if not by_name:
            del self._slices_by_service[sl.service_key]
        self._mark(sl.service_key)

    def service(self, key: str) -> Service | None:
        return self._services.get(key)

    def service_keys(self) -> list[str]:
        return list(self._services)

    def slices_of(self, service_key: str) -> list[EndpointSlice]:
        return list(self._slices_by_service.get(service_key, {}).values())

    @property
    def pending(self) -> int:
        """Services changed since the last commit."""
        return len(self._dirty)

    def build(self) -> Changeset:
        """Recompute the dirty services and diff them against the committed state."""
        added: list[Plan] = []
        removed: list[Plan] = []
        updated: list[tuple[Plan, Plan]] = []
        pending: dict[str, tuple[int, dict[str, Plan]]] = {}
        losers = self._claims.losers
        for key, generation in self._dirty.items():
            new = self._compute(key)
            lost = losers.get(key)
            if lost:
                new = _without(new, lost)
            old = self._applied.get(key, {})
            for pid, plan in new.items():
                prev = old.get(pid)
                if prev is None:
                    added.append(plan)
                elif prev != plan:
                    updated.append((prev, plan))
            for pid, plan in old.items():
                if pid not in new:
                    removed.append(plan)
            pending[key] = (generation, new)
        self._pending = pending
        return Changeset(tuple(added), tuple(removed), tuple(updated))

    @property
    def conflicts(self) -> dict[str, tuple[str, ...]]:
        """Services not serving some frontends because another service claimed them first."""
        return describe_conflicts(self._claims.losers)

    def commit(self) -> None:
        """Record the last build as programmed; changes that arrived since stay dirty."""
        for key, (generation, plans) in self._pending.items():
            if plans:
                self._applied[key] = plans
            else:
                self._applied.pop(key, None)
            if self._dirty.get(key) == generation:
                del self._dirty[key]
        self._pending = {}

    def plans(self) -> Iterator[Plan]:
        """The committed plans, service by service."""
        for plans in self._applied.values():
            yield from plans.values()

    def _compute(self, key: str) -> dict[str, Plan]:
        svc = self._services.get(key)
        if svc is None or not svc.proxied:
            return {}
        merged = self._merge(self._slices_by_service.get(key, {}))
        plans: dict[str, Plan] = {}
        access = self._access.get(key)
        scheduler = svc.ipvs_scheduler or ""
        external_capable = svc.type in ("NodePort", "LoadBalancer")
        for cluster_ip in svc.cluster_ips:
            family = _family(cluster_ip)
            external_ips = tuple(a for a in svc.external_ips if _family(a) == family)
            lb_ips = (
                tuple(a for a in svc.lb_ingress_ips if _family(a) == family)
                if svc.type == "LoadBalancer"
                else ()
            )
            ranges = tuple(r for r in svc.lb_source_ranges if _family(r) == family)
            for sp in svc.ports:
                node_port = sp.node_port if external_capable else 0
                accessible = bool(node_port or external_ips or lb_ips)
                external_local = (
                    accessible
                    and svc.external_traffic_policy == "Local"
                    and (external_capable or bool(external_ips))
                )
                internal_local = svc.internal_traffic_policy == "Local"
                candidates = merged.get((sp.name, sp.protocol, family), ())
                cluster, local, has_any = self._categorize(
                    candidates, not internal_local or accessible, internal_local or external_local
                )
                internal = local if internal_local else cluster
                internal_verdict: str | None
                external_verdict: str | None
                if not has_any:
                    internal_verdict = external_verdict = "reject"
                else:
                    internal_verdict = None if internal else "drop"
                    external_verdict = "drop" if external_local and not local else None
                used = {(b.ip, b.port) for b in (*cluster, *local)}
                standby = tuple(
                    _backend(c) for c in candidates if c.serving and (c.ip, c.port) not in used
                )
                pid = f"{key}:{sp.name}/{sp.protocol}/v{family}"
                plans[pid] = Plan(
                    pid,
                    key,
                    sp.name,
                    sp.protocol,
                    family,
                    cluster_ip,
                    sp.port,
                    node_port,
                    external_ips,
                    lb_ips,
                    ranges,
                    svc.affinity_timeout if svc.session_affinity else 0,
                    internal_local,
                    external_local,
                    cluster,
                    local,
                    internal_verdict,
                    external_verdict,
                    svc.health_check_node_port if external_local else 0,
                    access,
                    scheduler,
                    standby,
                    svc.bgp,
                )
        return plans

    def _merge(
        self, slices: dict[str, EndpointSlice]
    ) -> dict[tuple[str, str, int], list[_Candidate]]:
        """Endpoints per (port name, protocol, family), deduplicated by ip:port.

        Slices are read in name order so the result does not depend on arrival order; of
        two duplicates the non-terminating one wins, then the local one, then the first.
        """
        node = self._node
        buckets: dict[tuple[str, str, int], dict[tuple[str, int], _Candidate]] = {}
        for name in sorted(slices):
            sl = slices[name]
            if sl.address_type == "IPv4":
                family = 4
            elif sl.address_type == "IPv6":
                family = 6
            else:
                continue
            for ep_port in sl.ports:
                port = ep_port.port
                if port is None:
                    continue
                bucket = buckets.setdefault((ep_port.name, ep_port.protocol, family), {})
                for ep in sl.endpoints:
                    cand = _candidate(ep, port, ep.node_name == node)
                    ident = (cand.ip, port)
                    prev = bucket.get(ident)
                    if prev is None or _better(cand, prev):
                        bucket[ident] = cand
        return {k: list(v.values()) for k, v in buckets.items()}

    def _categorize(
        self, candidates: list[_Candidate] | tuple[()], uses_cluster: bool, uses_local: bool
    ) -> tuple[tuple[Backend, ...], tuple[Backend, ...], bool]:
        """kube-proxy's CategorizeEndpoints: (cluster endpoints, local endpoints, any usable)."""
        cluster: tuple[Backend, ...] = ()
        local: tuple[Backend, ...] = ()
        has_any = False
        if uses_cluster:
            mode = self._topology_mode(candidates)
            cluster = tuple(_backend(c) for c in candidates if c.ready and self._available(c, mode))
            if not cluster:
                cluster = tuple(
                    _backend(c)
                    for c in candidates
                    if c.serving and c.terminating and self._available(c, mode)
                )
            has_any = bool(cluster)
        if uses_local:
            local_ready = local_terminating = False
            for c in candidates:
                if c.ready:
                    has_any = True
                    local_ready = local_ready or c.local
                elif c.serving and c.terminating:
                    has_any = True
                    local_terminating = local_terminating or c.local
            if local_ready:
                local = tuple(_backend(c) for c in candidates if c.local and c.ready)
            elif local_terminating:
                local = tuple(
                    _backend(c) for c in candidates if c.local and c.serving and c.terminating
                )
        return cluster, local, has_any

    def _topology_mode(self, candidates: list[_Candidate] | tuple[()]) -> str:
        """ "node" or "zone" when every ready endpoint carries hints and one matches us."""
        all_node_hints = all_zone_hints = True
        for_node = for_zone = False
        seen = False
        for c in candidates:
            if not c.ready:
                continue
            seen = True
            if not c.node_hints:
                all_node_hints = False
            elif self._node in c.node_hints:
                for_node = True
            if not c.zone_hints:
                all_zone_hints = False
            elif self._zone is not None and self._zone in c.zone_hints:
                for_zone = True
        if not seen:
            return ""
        if all_node_hints and for_node:
            return "node"
        if all_zone_hints and for_zone:
            return "zone"
        return ""

    def _available(self, c: _Candidate, mode: str) -> bool:
        if mode == "zone":
            return c.zone_hints is not None and self._zone in c.zone_hints
        if mode == "node":
            return c.node_hints is not None and self._node in c.node_hints
        return True


def _candidate(ep: Endpoint, port: int, local: bool) -> _Candidate:
    return _Candidate(
        ep.addresses[0],
        port,
        local,
        ep.ready,
        ep.serving,
        ep.terminating,
        ep.hint_zones,
        ep.hint_nodes,
    )


def _better(cand: _Candidate, prev: _Candidate) -> bool:
    """Dedupe: a non-terminating duplicate beats a terminating one, then local beats remote."""
    if cand.terminating != prev.terminating:
        return prev.terminating
    return cand.local and not prev.local


def _without(plans: dict[str, Plan], lost: frozenset[FrontendKey]) -> dict[str, Plan]:
    """The plans minus frontends another service owns; no ClusterIP means no plan at all."""
    out: dict[str, Plan] = {}
    for pid, p in plans.items():
        if (p.family, p.cluster_ip, p.protocol, p.port) in lost:
            continue
        out[pid] = p._replace(
            external_ips=tuple(
                a for a in p.external_ips if (p.family, a, p.protocol, p.port) not in lost
            ),
            lb_ips=tuple(a for a in p.lb_ips if (p.family, a, p.protocol, p.port) not in lost),
            node_port=0 if (p.family, "", p.protocol, p.node_port) in lost else p.node_port,
        )
    return out


def _backend(c: _Candidate) -> Backend:
    return Backend(c.ip, c.port, c.local, c.ready, c.serving, c.terminating)
