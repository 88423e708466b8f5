"""What the table sees of each service under the Lace network model.

Between the sources and the table: a service is bound to a network (an explicit binding,
else the pod network that holds its endpoints), and its EndpointSlices are narrowed to the
endpoints inside that network, each exclusion recorded with a reason. The table then
computes plans exactly as kube-proxy would from what remains, so its endpoint rules (ready,
terminating fallback, Local policies, topology) apply within the bound network. Without
Network objects nothing is narrowed: plain kube-proxy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from lace_proxy.model import EndpointSlice, LaceObject, Service
from lace_proxy.networks.graph import Condition, NetworkGraph, ServiceRef

ADDRESS_TYPES = ("IPv4", "IPv6")  # FQDN slices are never proxied


@dataclass(frozen=True)
class Binding:
    """A service's network, the sources allowed to reach it, and the endpoints left out."""

    network: str | None  # None: its endpoints lie in no network, so it carries nothing
    sources: frozenset[str]
    excluded: tuple[tuple[str, str], ...]  # (address, reason)
    bound_by: str | None = None  # the NetworkBindingPolicy; None: its endpoints' network
    conditions: tuple[Condition, ...] = ()  # e.g. matched by two bindings


def _ref(svc: Service) -> ServiceRef:
    return ServiceRef(svc.namespace, svc.name, dict(svc.labels))


@dataclass
class _Scan:
    """A service's endpoints as last examined: their pod network, and the narrowed slices."""

    prefix_token: tuple[object, ...]
    slices: tuple[EndpointSlice, ...]
    pod_network: str | None
    pod_networks: tuple[str, ...]  # every pod network holding some of its endpoints
    network: str | None = None  # the network `narrowed` was computed for
    narrowed: list[EndpointSlice] | None = None
    excluded: tuple[tuple[str, str], ...] = ()

    def valid(self, prefix_token: tuple[object, ...], slices: list[EndpointSlice]) -> bool:
        """Still true of these slices (the very same objects) under these prefixes."""
        return (
            prefix_token == self.prefix_token
            and len(slices) == len(self.slices)
            and all(a is b for a, b in zip(slices, self.slices, strict=True))
        )


class NetworkView:
    """Binds services to networks and narrows their slices accordingly."""

    def __init__(self, objects: Iterable[LaceObject] = ()) -> None:
        self.graph = NetworkGraph(objects)
        self.bindings: dict[str, Binding] = {}
        # What a service's endpoints were found to be, while its slices and the networks'
        # prefixes stay the same: a policy change then costs no endpoint scan.
        self._scans: dict[str, _Scan] = {}
        self._members: dict[str | None, set[str]] = {}  # network -> services bound to it

    @property
    def enabled(self) -> bool:
        return self.graph.enabled

    def set_objects(self, objects: Iterable[LaceObject]) -> None:
        """Networks or policies changed: every binding must be worked out again (`narrow`).

        The old bindings stay until then, so that callers can tell which ones changed.
        """
        self.graph = NetworkGraph(objects)

    def narrow(self, svc: Service | None, slices: list[EndpointSlice]) -> list[EndpointSlice]:
        """The slices as the table should see them (unchanged without networks)."""
        if not self.graph.enabled or svc is None:
            if svc is not None:
                self.forget(svc.key)
            return slices
        ref = _ref(svc)
        matches = self.graph.service_bindings(ref)
        scan = self._scans.get(svc.key)
        if scan is None or not scan.valid(self.graph.prefix_token, slices):
            scan = _Scan(self.graph.prefix_token, tuple(slices), *self._network_of(slices))
            self._scans[svc.key] = scan
        network = matches[0][1] if matches else scan.pod_network
        sources = self.graph.allowed_sources(ref, network) if network else frozenset()
        conditions: tuple[Condition, ...] = ()
        if not matches and len(scan.pod_networks) > 1:
            conditions = (
                Condition(
                    "split_endpoints",
                    f"Service/{svc.key}",
                    f"its endpoints lie in pod networks {', '.join(scan.pod_networks)}: bound to "
                    f"{scan.pod_network} (most endpoints, then name order); the others are "
                    "excluded unless a NetworkBindingPolicy says otherwise",
                ),
            )
        if len(matches) > 1:
            others = ", ".join(f"{policy} ({net})" for policy, net in matches[1:])
            conditions = (
                Condition(
                    "two_bindings",
                    f"Service/{svc.key}",
                    f"bound by NetworkBindingPolicy {matches[0][0]} to {matches[0][1]} and "
                    f"also matched by {others}: the first in name order wins",
                ),
            )
        if scan.narrowed is None or scan.network != network:
            scan.network = network
            scan.narrowed, scan.excluded = self._narrowed(network, slices)
        binding = Binding(
            network, sources, scan.excluded, matches[0][0] if matches else None, conditions
        )
        self._set_binding(svc.key, binding)
        return scan.narrowed

    def _narrowed(
        self, network: str | None, slices: list[EndpointSlice]
    ) -> tuple[list[EndpointSlice], tuple[tuple[str, str], ...]]:
        """The slices with only the endpoints inside `network`, and the others with reasons."""
        excluded: list[tuple[str, str]] = []
        narrowed = []
        for sl in slices:
            if sl.address_type not in ADDRESS_TYPES:  # FQDN: never proxied (the table skips it)
                narrowed.append(sl)
                continue
            kept = []
            for ep in sl.endpoints:
                address = ep.addresses[0]
                if network is not None and self.graph.contains(network, address):
                    kept.append(ep)
                elif network is None:
                    excluded.append((address, "in no network; bind the service to one"))
                else:
                    excluded.append((address, f"outside network {network}"))
            narrowed.append(
                sl if len(kept) == len(sl.endpoints) else replace(sl, endpoints=tuple(kept))
            )
        return narrowed, tuple(excluded)

    def forget(self, service_key: str) -> None:
        """The service is gone."""
        self._set_binding(service_key, None)
        self._scans.pop(service_key, None)

    def members(self, networks: Iterable[str]) -> set[str]:
        """The services bound to any of these networks."""
        out: set[str] = set()
        for network in networks:
            out |= self._members.get(network, set())
        return out

    def _set_binding(self, service_key: str, binding: Binding | None) -> None:
        old = self.bindings.pop(service_key, None)
        if old is not None:
            members = self._members[old.network]
            members.discard(service_key)
            if not members:
                del self._members[old.network]
        if binding is not None:
            self.bindings[service_key] = binding
            self._members.setdefault(binding.network, set()).add(service_key)

    @property
    def conditions(self) -> list[Condition]:
        """Every condition: the graph's and the services'."""
        out = list(self.graph.conditions)
        for binding in self.bindings.values():
            out += binding.conditions
        return out

    def _network_of(self, slices: list[EndpointSlice]) -> tuple[str | None, tuple[str, ...]]:
        """The pod network holding most of the service's endpoints (ties: the first name),
        and every pod network that holds some: the choice must not depend on arrival order."""
        counts: dict[str, int] = {}
        for sl in slices:
            if sl.address_type not in ADDRESS_TYPES:
                continue
            for ep in sl.endpoints:
                network = self.graph.classify(ep.addresses[0])
                if network is not None and self.graph.networks[network].type in ("l3", "l2"):
                    counts[network] = counts.get(network, 0) + 1
        if not counts:
            return None, ()
        ranked = sorted(counts, key=lambda n: (-counts[n], n))
        return ranked[0], tuple(sorted(counts))
