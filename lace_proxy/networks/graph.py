"""The Lace networks resolved: which network a source is in, and which networks may reach which.

DESIGN.md §3 in code. Networks are isolated by default; a NetworkRoutingPolicy peers source
networks to destination networks (one direction; replies follow conntrack), granting their
pods and services; a ServiceRoutingPolicy grants source networks the services of
destination networks (optionally only those its serviceSelector picks), not their pods.
A source is classified as: locally originated → the hostLocal network (if one is declared);
an address in a pod network's prefixes → that network; otherwise the external network with
the longest matching prefix; otherwise no network at all (it reaches nothing).

The graph is rebuilt from the objects when a policy or network changes (there are tens of
them, not thousands); what it answers per service is cheap.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from lace_proxy.model.lace import (
    POD_NETWORK_TYPES,
    LaceObject,
    Network,
    NetworkBindingPolicy,
    NetworkRoutingPolicy,
    ServiceRoutingPolicy,
)
from lace_proxy.prefixes import disjoint_ranges

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def _address(address: str) -> tuple[int, int]:
    """(IP version, integer value) of an address, faster than ipaddress for the hot path."""
    if ":" in address:
        return 6, int.from_bytes(socket.inet_pton(socket.AF_INET6, address), "big")
    return 4, int.from_bytes(socket.inet_pton(socket.AF_INET, address), "big")


def _span(prefix: IPNetwork) -> tuple[int, int, int]:
    return prefix.version, int(prefix.network_address), int(prefix.broadcast_address)


def _selects_nothing(policy: Any, sources: set[str], dests: set[str]) -> list[Condition]:
    missing = [
        side for side, chosen in (("srcSelector", sources), ("destSelector", dests)) if not chosen
    ]
    if not missing:
        return []
    return [
        Condition(
            "selects_nothing",
            f"{policy.kind}/{policy.name}",
            f"{' and '.join(missing)} select no network: the policy grants nothing",
        )
    ]


@dataclass(frozen=True)
class NetworkLayout:
    """What the kernel needs of the network model besides the plans.

    How to classify a packet's source (disjoint address ranges, each with its network: the
    longest-prefix match precomputed, since an nftables interval map refuses overlaps), which
    network locally originated traffic belongs to, and, for policy routes, the pod networks'
    prefixes and those of them node-originated traffic may enter. Empty: no network model.
    `local_pod_cidrs` are this node's podCIDRs (a node fact the proxier adds): the node
    reaches its own pods whatever the peering, for kubelet probes. `service_cidrs` are the
    cluster's ServiceCIDR objects' ranges (the proxier adds them, with or without a network
    model): a new connection to an address in them that no Service holds is dropped.
    """

    networks: tuple[str, ...] = ()
    host_local: str | None = None
    ranges: tuple[tuple[int, str, str, str], ...] = ()  # (family, first, last, network)
    pod_prefixes: tuple[tuple[str, str], ...] = ()  # (prefix, network)
    host_peers: tuple[str, ...] = ()  # pod networks host-local is peered to
    local_pod_cidrs: tuple[str, ...] = ()
    service_cidrs: tuple[str, ...] = ()

    @property
    def enabled(self) -> bool:
        return bool(self.networks)


@dataclass(frozen=True, order=True)
class Condition:
    """Something wrong across objects, which no single object's validation can see.

    Never fatal: each has a documented, deterministic outcome (in `message`), and is
    logged, exported as a metric and shown by `lace-proxy explain`.
    """

    code: str  # see lace_proxy.metrics.CONDITION_CODES
    subject: str  # "Kind/name" (or "Service namespace/name")
    message: str


@dataclass(frozen=True)
class ServiceRef:
    """What bindings and service selectors look at."""

    namespace: str
    name: str
    labels: Mapping[str, str]


class NetworkGraph:
    """Networks, bindings and routing policies, resolved for questions about traffic."""

    def __init__(self, objects: Iterable[LaceObject]) -> None:
        objects = list(objects)
        self.networks: dict[str, Network] = {o.name: o for o in objects if isinstance(o, Network)}
        self._bindings = sorted(
            (o for o in objects if isinstance(o, NetworkBindingPolicy)), key=lambda o: o.name
        )
        self._labels = {name: dict(net.labels) for name, net in self.networks.items()}
        routing = [o for o in objects if isinstance(o, NetworkRoutingPolicy)]
        self._service_routing = [o for o in objects if isinstance(o, ServiceRoutingPolicy)]
        self.host_local = next(
            (
                n.name
                for n in sorted(self.networks.values(), key=lambda n: n.name)
                if n.type == "hostLocal"
            ),
            None,
        )
        self._pod_prefixes: list[tuple[IPNetwork, str]] = []
        self._external_prefixes: list[tuple[IPNetwork, str]] = []
        for net in self.networks.values():
            target = (
                self._pod_prefixes
                if net.type in POD_NETWORK_TYPES
                else (self._external_prefixes if net.type == "external" else None)
            )
            if target is not None:
                target.extend((ipaddress.ip_network(p), net.name) for p in net.prefixes)
        # Longest prefix first, then name: classification is deterministic.
        for prefixes in (self._pod_prefixes, self._external_prefixes):
            prefixes.sort(key=lambda item: (-item[0].prefixlen, item[1]))
        # The same, as one dict lookup per distinct prefix length (endpoints are classified
        # by the hundred thousand): [(family, shift, {masked address: network})], pods first.
        self._lpm: list[tuple[int, int, dict[int, str]]] = []
        for prefixes in (self._pod_prefixes, self._external_prefixes):
            for prefix, name in prefixes:
                bits = prefix.max_prefixlen - prefix.prefixlen
                if not self._lpm or self._lpm[-1][:2] != (prefix.version, bits):
                    self._lpm.append((prefix.version, bits, {}))
                self._lpm[-1][2].setdefault(int(prefix.network_address) >> bits, name)
        # Equal for two graphs with the same networks: what endpoints belong to is unchanged.
        self.prefix_token = tuple(
            (n.name, n.type, n.prefixes)
            for n in sorted(self.networks.values(), key=lambda n: n.name)
        )
        self._peers: dict[str, set[str]] = {name: set() for name in self.networks}
        conditions: list[Condition] = []
        for policy in routing:
            sources = self._select(policy.src_selector)
            dests = self._select(policy.dest_selector)
            conditions += _selects_nothing(policy, sources, dests)
            for src in sources:
                self._peers[src] |= dests
        # Per network: who reaches it by peering; per ServiceRoutingPolicy: what it grants.
        self._peered_from: dict[str, frozenset[str]] = {
            name: frozenset(src for src, dests in self._peers.items() if name in dests)
            for name in self.networks
        }
        self._grants: list[tuple[frozenset[str], frozenset[str], Any]] = []
        for srp in self._service_routing:
            sources = self._select(srp.src_selector)
            dests = self._select(srp.dest_selector)
            conditions += _selects_nothing(srp, sources, dests)
            self._grants.append((frozenset(dests), frozenset(sources), srp.service_selector))
        self._spans: dict[str, list[tuple[int, int, int]]] = {
            name: [_span(ipaddress.ip_network(p)) for p in net.prefixes]
            for name, net in self.networks.items()
        }
        conditions += self._binding_conditions() + self._overlaps()
        self.conditions: tuple[Condition, ...] = tuple(sorted(conditions))
        self._layout: NetworkLayout | None = None

    @property
    def enabled(self) -> bool:
        """Without Network objects, lace-proxy behaves as plain kube-proxy."""
        return bool(self.networks)

    def _select(self, selector: Any) -> set[str]:
        return {name for name, labels in self._labels.items() if selector.matches(labels)}

    def affected_by(self, old: NetworkGraph) -> frozenset[str] | None:
        """The networks whose services are reached differently than under `old` (None: any
        service may be bound or reached differently, so all must be worked out again)."""
        if (
            self.prefix_token != old.prefix_token
            or self._bindings != old._bindings
            or self.host_local != old.host_local
        ):
            return None
        changed = {n for n in self.networks if self._peered_from.get(n) != old._peered_from.get(n)}
        for dests, _, _ in set(self._grants) ^ set(old._grants):
            changed |= dests
        return frozenset(changed)

    def peers(self, source: str) -> frozenset[str]:
        """The networks `source` is peered to (their pods and services)."""
        return frozenset(self._peers.get(source, ()))

    def classify(self, address: str, *, local: bool = False) -> str | None:
        """The network a packet from `address` belongs to (None: no identity)."""
        if local:
            return self.host_local
        family, value = _address(address)
        for version, bits, table in self._lpm:
            if version == family:
                name = table.get(value >> bits)
                if name is not None:
                    return name
        return None

    def service_binding(self, service: ServiceRef) -> str | None:
        """The network a service is explicitly bound to (matchKind service), if any.

        Policies are read in name order and rules in written order; the first match wins.
        """
        matches = self.service_bindings(service, first_only=True)
        return matches[0][1] if matches else None

    def service_bindings(
        self, service: ServiceRef, *, first_only: bool = False
    ) -> list[tuple[str, str]]:
        """Every (policy, network) binding the service, in the order they take precedence."""
        found: list[tuple[str, str]] = []
        for policy in self._bindings:
            if "service" not in policy.match_kinds:
                continue
            for rule in policy.rules:
                if rule.network in self.networks and rule.selector.matches(
                    service.namespace, service.name, service.labels
                ):
                    found.append((policy.name, rule.network))
                    if first_only:
                        return found
                    break  # a policy's first matching rule is its binding
        return found

    def allowed_sources(self, service: ServiceRef, network: str) -> frozenset[str]:
        """The source networks that may reach a service bound to `network`.

        Its own network, every network peered to it, and every network a
        ServiceRoutingPolicy grants its services to (if the policy's serviceSelector picks it).
        """
        allowed = {network} | self._peered_from.get(network, frozenset())
        for dests, sources, selector in self._grants:
            if network in dests and (selector.everything or selector.matches(service.labels)):
                allowed |= sources
        return frozenset(allowed)

    def layout(self) -> NetworkLayout:
        """The model as the kernel needs it (see NetworkLayout); the graph never changes, so
        it is worked out once (every sync asks for it)."""
        if self._layout is None:
            self._layout = self._make_layout()
        return self._layout

    def _make_layout(self) -> NetworkLayout:
        if not self.enabled:
            return NetworkLayout()
        ranges: list[tuple[int, str, str, str]] = []
        for family in (4, 6):
            ranges.extend(self._ranges(family))
        pod = sorted((str(p), name) for p, name in self._pod_prefixes)
        peers = self.peers(self.host_local) if self.host_local else frozenset()
        return NetworkLayout(
            networks=tuple(sorted(self.networks)),
            host_local=self.host_local,
            ranges=tuple(ranges),
            pod_prefixes=tuple(pod),
            host_peers=tuple(sorted(n for n in peers if n in {name for _, name in pod})),
        )

    def _ranges(self, family: int) -> list[tuple[int, str, str, str]]:
        """Disjoint (family, first, last, network) ranges that classify as `classify` does.

        The prefixes' longest-prefix match flattened (`lace_proxy.prefixes`).
        """
        prefixes = (p for p, _ in (*self._pod_prefixes, *self._external_prefixes))
        ranges = disjoint_ranges(family, prefixes, self.classify)
        return [(family, first, last, network) for first, last, network in ranges]

    def contains(self, network: str, address: str) -> bool:
        """Whether an endpoint address lies in a network's prefixes."""
        family, value = _address(address)
        return any(
            version == family and first <= value <= last
            for version, first, last in self._spans.get(network, ())
        )

    def _binding_conditions(self) -> list[Condition]:
        out = []
        for policy in self._bindings:
            for i, rule in enumerate(policy.rules):
                if rule.network not in self.networks:
                    out.append(
                        Condition(
                            "unknown_network",
                            f"NetworkBindingPolicy/{policy.name}",
                            f"rule {i} binds to network {rule.network!r}, which does not "
                            "exist: the rule is ignored until it does",
                        )
                    )
        return out

    def _overlaps(self) -> list[Condition]:
        """Pod networks whose prefixes overlap: the longer prefix (then the name) wins.

        Prefixes either nest or are disjoint, so a sweep in address order finds every
        overlap among the prefixes still open.
        """
        out = []
        spans = sorted((_span(p), -p.prefixlen, name, p) for p, name in self._pod_prefixes)
        open_: list[tuple[tuple[int, int, int], int, str, IPNetwork]] = []
        for item in spans:
            (version, first, _), _, name, prefix = item
            open_ = [o for o in open_ if o[0][0] == version and o[0][2] >= first]
            for (_, _, _), _, other, outer in open_:
                if other == name:
                    continue
                winner = name if (-prefix.prefixlen, name) < (-outer.prefixlen, other) else other
                narrow = prefix if winner == name else outer
                a, b = sorted([(other, outer), (name, prefix)])
                out.append(
                    Condition(
                        "overlapping_prefixes",
                        f"Network/{a[0]}",
                        f"{a[1]} overlaps {b[1]} of Network {b[0]}: addresses in both belong to "
                        f"{winner} (longer prefix {narrow}, then name order)",
                    )
                )
            open_.append(item)
        return out
