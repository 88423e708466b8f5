"""Plans and the network layout as nf_tables objects, deterministically.

Dispatch is kube-proxy's (verdict maps keyed by `address . protocol . port`, and
`protocol . port` for NodePorts), but a service port is data, not chains, so that the
table stays fast at tens of thousands of services: the kernel's cost of a transaction
grows with the number of chains (nft re-reads them all; the kernel re-validates jumps),
and anonymous sets bound in rules cost quadratically when many are loaded at once.

- A frontend is in the set of its service's kind, whose rule sends it to the shared chain
  of that kind (skeleton.py): `frontends-lb-v4` to `lb-v4` (DNAT), `frontends-ext-v4` to
  `ext-v4` (external: masquerade first), `xl` (externalTrafficPolicy Local), `alb` / `aext`
  (ClientIP affinity); NodePorts `nodeports-np-v4` to `np-v4`, `npl`, `anp`. The element
  stays while its service does, endpoints or none, and it is data: the kernel re-validates
  every chain a goto or jump element leads to when one is added (seconds at 30k services on
  a 6.1 kernel), so neither a service nor an endpoint change adds one.
- Counts are data (shared.py): a frontend with N endpoints is in the set
  `endpoints-count-N-v4`, which picks the rule of `lb-v4` that chooses one of N by
  `numgen random`; the I-th endpoint is in the map `endpoints-I-v4`. A frontend without
  endpoints is in no count set: it falls through untranslated, and the filter chains
  reject or drop it (`no-endpoint-reject-v4`, ...).
- At scale the containers every ClusterIP frontend is in (`cluster-ips`, `frontends-lb`,
  `lb`'s count sets and endpoint maps) are split into parts by the frontend address's low
  bits (parts.py: `endpoints-0-v4-p3`), so that the kernel reads each back in linear time.
- Hairpin traffic (a pod reaching itself through a service) is masqueraded in postrouting
  by the set `hairpin-v4` of `endpoint . endpoint` pairs: this node's endpoints only (as
  kube-proxy's IPVS mode and kube-router), since only those can send to themselves here.
- loadBalancerSourceRanges are the sets `firewall-ips-v4` and `firewall-allow-v4`.
- Services with ClientIP affinity keep kube-proxy's per-service layout (`svc-*`, `local-*`,
  `ext-*` chains, an `ep-*` chain and an affinity set per endpoint) under
  externalTrafficPolicy Local and for IPv6, since the choice must be remembered per
  endpoint there; they are the only per-service chains. IPv4 affinity is data too
  (affinity.py).
- reject/drop for services without (local) endpoints happen in filter chains, before
  routing, because a DNAT never happens for them.
- A new connection to an address of the service CIDRs that no Service holds is dropped
  (`clusterip-ranges-v4`: the ServiceCIDR objects' ranges, else `lace.serviceCIDRs`), as in
  kube-proxy's nftables mode: it is neither forwarded nor sent out of the node's uplink.

Per-service chain names are hashes of the plan id (object names never reach nft as
identifiers); the plan id is attached as the chain's comment when it is made of safe
characters only. Rendering is deterministic, so the objects a plan produced can be
recomputed from the plan: an update diffs old against new and touches only what changed.
The chains and maps all of this runs in are the skeleton's (skeleton.py).
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import operator
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from lace_proxy.dataplane.nftables import parts
from lace_proxy.dataplane.nftables.affinity import AffinityIds
from lace_proxy.dataplane.nftables.settings import NftablesSettings
from lace_proxy.dataplane.nftables.shared import COUNTED, ENDPOINT_MAP, SharedChains
from lace_proxy.dataplane.nftables.skeleton import (
    ACCESS_CHAINS,
    DENY,
    FAMILIES,
    Skeleton,
    addr_type,
    ip_keyword,
)
from lace_proxy.networks.graph import NetworkLayout
from lace_proxy.prefixes import covered
from lace_proxy.table import Backend, Plan

#: The node's own connection to a ClusterIP outside lace.serviceCIDRs, in IPVS mode: no route
#: to the proxy (nftables mode lets it leave by the node's routes).
UNROUTED = "reject with icmpx no-route"
#: A comment nft takes without quoting trouble (plan ids and network names usually are).
SAFE_COMMENT = re.compile(r"^[A-Za-z0-9._:/-]{1,128}$")


def name_hash(*parts: object) -> str:
    """A short lowercase hash of `parts` for nft object names (names from the API never reach
    nft as identifiers); explain recomputes the names it looks for with it."""
    digest = hashlib.blake2b("\0".join(map(str, parts)).encode(), digest_size=10).digest()
    return base64.b32encode(digest).decode().lower()


def _dnat_target(ip: str, port: int, family: int) -> str:
    return f"{ip}:{port}" if family == 4 else f"[{ip}]:{port}"


@dataclass
class Rendered:
    """The nf_tables objects of a plan (merged: of a table): chains with their rules, map and
    set elements, sets."""

    chains: dict[str, tuple[str, ...]] = field(default_factory=dict)
    comments: dict[str, str] = field(default_factory=dict)
    elements: dict[str, set[str]] = field(default_factory=dict)  # map/set name -> elements
    sets: dict[str, str] = field(default_factory=dict)  # name -> spec
    # Elements several plans may hold (a ClusterIP of several ports, an endpoint of several
    # services): the backend counts references and programs each once.
    shared: set[tuple[str, str]] = field(default_factory=set)
    needs: set[str] = field(default_factory=set)  # counts and affinity timeouts used
    # A full sync's table defers its endpoint maps (70% of its elements): (map, suffix) ->
    # endpoint count -> each frontend with its ordered backends; their elements are made one
    # map at a time (endpoint_elements), so that the table's are never all held as strings.
    deferred: dict[tuple[str, str], dict[int, list[tuple[str, list[Backend]]]]] | None = None

    def element(self, container: str, value: str) -> None:
        self.elements.setdefault(container, set()).add(value)

    def endpoint_maps(self) -> list[str]:
        """The deferred endpoint maps' names (MAP-I-vF)."""
        return [
            f"{m}-{i}-{v}"
            for (m, v), by_count in (self.deferred or {}).items()
            for i in range(max(by_count, default=0))
        ]

    def endpoint_elements(self, container: str) -> set[str]:
        """A deferred endpoint map's elements: the I-th backend of each frontend with more."""
        match = ENDPOINT_MAP.match(container)
        assert match is not None and self.deferred is not None
        index = int(match[2])
        suffix = parts.tag(int(match[3]), None if match[4] is None else int(match[4]))
        out = set()
        for count, frontends in self.deferred.get((match[1], suffix), {}).items():
            if count > index:
                for frontend, backends in frontends:
                    b = backends[index]
                    out.add(f"{frontend} : {b.ip} . {b.port}")
        return out

    def swap(self, before: Rendered, after: Rendered) -> None:
        """A plan's elements as rendered `after`, in place of those `before` (a new affinity
        id): elements a plan renders for itself alone (not its shared ones), endpoint maps
        aside (deferred in a full sync's table, and the same whatever the id)."""
        for container, values in before.elements.items():
            if not ENDPOINT_MAP.match(container):
                self.elements.get(container, set()).difference_update(values)
        for container, values in after.elements.items():
            if not ENDPOINT_MAP.match(container):
                self.elements.setdefault(container, set()).update(values)

    def merge(self, other: Rendered) -> None:
        """Add `other`'s objects: several plans' (and the layout's) make one table."""
        self.chains.update(other.chains)
        self.comments.update(other.comments)
        self.sets.update(other.sets)
        self.shared |= other.shared
        self.needs |= other.needs
        for container, values in other.elements.items():
            self.elements.setdefault(container, set()).update(values)


class Renderer(Skeleton):
    """Turns plans and the network layout into nf_tables objects, on the skeleton's."""

    def __init__(self, settings: NftablesSettings) -> None:
        super().__init__(settings)
        self.affinity_ids = AffinityIds()
        self.shared = SharedChains(settings, self)

    def part_tag(self, family: int, address: str) -> str:
        """The suffix of a split container that holds `address`'s frontends."""
        if self.parts == 1:
            return f"v{family}"
        return parts.tag(family, parts.part_of(address, self.parts))

    def render(self, plan: Plan, into: Rendered | None = None) -> Rendered:
        """The plan's objects (its affinity id, if it needs one, assigned already).

        With `into` (a full sync's whole table) they are written there, no per-plan copy
        merged, and the Rendered returned holds only the plan's shared elements, whose
        holders the caller counts.
        """
        out = Rendered() if into is None else into
        shared: set[tuple[str, str]] = set()
        fam = plan.family
        v = f"v{fam}"
        part = self.part_tag(fam, plan.cluster_ip)
        shared.add((f"cluster-ips-{part}", plan.cluster_ip))
        for b in (*plan.cluster_backends, *plan.local_backends):
            if b.local:  # only a pod of this node can reach itself through this node
                shared.add((f"hairpin-{v}", f"{b.ip} . {b.ip}"))
        if plan.affinity_timeout and (plan.external_local or fam == 6) and self.s.translate:
            # Per-endpoint state, as kube-proxy: affinity under externalTrafficPolicy Local
            # (rare), and IPv6 affinity (nft 1.0.6 cannot record an IPv6 address . port).
            self._render_chained(plan, out)
        else:
            self._render_data(plan, out, part)
        if plan.lb_ips and plan.lb_source_ranges and not allows_all(plan.lb_source_ranges):
            key = f"{plan.protocol.lower()} . {plan.port}"
            sources = plan.lb_source_ranges
            if any(covered(a, sources) for a in self.node_addresses):
                # The ranges let the node in. A VIP-style load balancer puts its IP on the
                # node, whose own connection to it then has the LB IP as its source (as
                # kube-proxy's allowFromNode).
                sources = (*sources, *plan.lb_ips)
            # Per frontend (one owner each: claims), and without overlaps, which an
            # interval set refuses.
            ranges = _collapsed(sources)
            for address in plan.lb_ips:
                out.element(f"firewall-ips-{v}", f"{address} . {key}")
                for cidr in ranges:
                    out.element(f"firewall-allow-{v}", f"{address} . {key} . {cidr}")
        if plan.access is not None:
            self.render_access(plan, out)
        if not self.s.translate:
            # IPVS mode: these addresses are the node's own (on the dummy interface); only
            # their service ports may pass (ipvs-ports-check).
            key = f"{plan.protocol.lower()} . {plan.port}"
            for address in (plan.cluster_ip, *plan.external_ips, *plan.lb_ips):
                out.element(f"service-ports-{v}", f"{address} . {key}")
                shared.add((f"ipvs-addresses-{v}", address))
        if into is not None:
            return Rendered(shared=shared)
        out.shared = shared
        return out

    @staticmethod
    def render_access(plan: Plan, out: Rendered) -> None:
        """The Lace network model: every frontend is controlled, reachable from its sources.

        Static, so that explain can run it on a stand-in plan to learn the elements it writes.
        """
        v = f"v{plan.family}"
        proto = plan.protocol.lower()
        frontends = [
            f"{address} . {proto} . {plan.port}"
            for address in (plan.cluster_ip, *plan.external_ips, *plan.lb_ips)
        ]
        node_port = f"{proto} . {plan.node_port}" if plan.node_port else None
        for frontend in frontends:
            out.element(f"controlled-{v}", frontend)
        if node_port:
            out.element(f"controlled-nodeports-{v}", node_port)
        assert plan.access is not None, "render_access needs a plan under the network model"
        for source in plan.access.sources:
            h = name_hash(source)
            for frontend in frontends:
                out.element(f"reach-{h}-{v}", frontend)
            if node_port:
                out.element(f"reach-nodeports-{h}-{v}", node_port)

    def render_networks(self, layout: NetworkLayout) -> Rendered:
        """The layout's objects: the service CIDRs, and the network model's source
        classification and per-network checks.

        A new connection's source is classified by one interval-map lookup into a chain
        `from-<network>`, which lets it through to the frontends its network may reach (sets
        filled by the plans) and sends it to `deny` otherwise, where only frontends are refused.
        The node's own traffic is checked in output, as host-local (or no identity).
        """
        out = Rendered()
        for cidr in clusterip_ranges(layout, self.s):
            out.element(f"clusterip-ranges-v{ipaddress.ip_network(cidr).version}", cidr)
        if not layout.enabled:
            for name in ACCESS_CHAINS:
                out.chains[name] = ()  # emptied, not deleted: the base chains jump to them
            return out
        out.chains["access"] = (
            'iif "lo" return',  # the node's own traffic, checked in output already
            "ip saddr vmap @source-networks-v4",
            "ip6 saddr vmap @source-networks-v6",
            "goto deny",  # no identity: reaches no frontend
        )
        host = f"goto from-{name_hash(layout.host_local)}" if layout.host_local else "goto deny"
        prefix = self.s.pod_interface_prefix
        local_pods = f' oifname != "{prefix}*"' if prefix else ""
        out.chains["host-access"] = (
            # A NodePort on the node's own address is never answered from the node itself.
            *(
                f"{self.nodeport_match(fam)} meta l4proto . th dport"
                f" @controlled-nodeports-v{fam} drop"
                for fam in FAMILIES
            ),
            # Pod networks host-local is not peered to, except this node's own pods.
            *(
                f"{ip_keyword(fam)} daddr @host-unpeered-v{fam}"
                f" {ip_keyword(fam)} daddr != @local-pod-cidrs-v{fam}{local_pods} {DENY}"
                for fam in FAMILIES
            ),
            host,
        )
        # The addresses that classify into such a network (a peered longer prefix inside an
        # unpeered network's stays reachable), from the same disjoint ranges as the sources.
        pod_networks = {n for _, n in layout.pod_prefixes}
        for fam, first, last, network in layout.ranges:
            if network in pod_networks and network not in layout.host_peers:
                span = first if first == last else f"{first}-{last}"
                out.element(f"host-unpeered-v{fam}", span)
        for cidr in _collapsed(layout.local_pod_cidrs):
            out.element(f"local-pod-cidrs-v{ipaddress.ip_network(cidr).version}", cidr)
        # Not proxied: nftables lets the packet go by the node's routes; IPVS would take it
        # anyway (the address is local), so it is refused as unroutable there.
        unproxied = "accept" if self.s.translate else UNROUTED
        out.chains["unproxied"] = tuple(
            f"{g}{ip_keyword(fam)} daddr @cluster-ips-{t}"
            f" {ip_keyword(fam)} daddr != @service-cidrs-v{fam} {unproxied}"
            for fam in FAMILIES
            for g, t in self.split(fam)
        )
        for network in layout.networks:
            h = name_hash(network)
            rules = []
            for fam in FAMILIES:
                v, ip = f"v{fam}", ip_keyword(fam)
                for name, spec in (
                    (f"reach-{h}-{v}", f"type {addr_type(fam)} . inet_proto . inet_service;"),
                    (f"reach-nodeports-{h}-{v}", "type inet_proto . inet_service;"),
                ):
                    out.sets[name] = spec
                rules.append(f"{ip} daddr . meta l4proto . th dport @reach-{h}-{v} return")
                rules.append(
                    f"{self.nodeport_match(fam)} meta l4proto . th dport"
                    f" @reach-nodeports-{h}-{v} return"
                )
            rules.append("goto deny")
            out.chains[f"from-{h}"] = tuple(rules)
            if SAFE_COMMENT.match(network):
                out.comments[f"from-{h}"] = network
        for fam, first, last, network in layout.ranges:
            span = first if first == last else f"{first}-{last}"
            out.element(f"source-networks-v{fam}", f"{span} : goto from-{name_hash(network)}")
        return out

    def _render_data(self, plan: Plan, out: Rendered, part: str) -> None:
        """A service port as elements: a dispatch element per frontend that only the
        service's spec decides, and its endpoints with their count as data; `part` is the
        suffix of the split containers that hold its ClusterIP's frontend."""
        v = f"v{plan.family}"
        proto = plan.protocol.lower()
        key = f"{proto} . {plan.port}"
        # In order for the endpoint maps' indices; under IPVS (no maps) only counted.
        order = _ordered if self.s.translate else list
        cluster, local = order(plan.cluster_backends), order(plan.local_backends)

        def endpoints(kind: str, frontend: str, backends: list[Backend], t: str = v) -> None:
            """The frontend's I-th backend in KIND's endpoint map I, and the frontend in
            the set of its count (which picks the chain's rule that chooses among them),
            the containers' suffix `t` (`lb`'s: the frontend's part). Not under IPVS,
            which translates: nothing would look them up."""
            if not self.s.translate:
                return
            m = COUNTED[kind]
            if out.deferred is not None:
                if backends:
                    by_count = out.deferred.setdefault((m, t), {})
                    by_count.setdefault(len(backends), []).append((frontend, backends))
            else:
                for i, b in enumerate(backends):
                    out.element(f"{m}-{i}-{t}", f"{frontend} : {b.ip} . {b.port}")
            if backends:
                out.element(f"{m}-count-{len(backends)}-{t}", frontend)
                out.needs.add(f"{kind}-{v}-{len(backends)}")

        # ClientIP affinity: the "a" chains mark the connection with the plan's affinity id
        # and DNAT to the endpoint remembered for (client, frontend, id) if there is one;
        # postrouting records the endpoint chosen (arec, by the id's timeout).
        affinity = plan.affinity_timeout if self.s.translate else 0
        a = "a" if affinity else ""
        aid = self.affinity_ids.get(plan.id) if affinity else ""
        if affinity:
            out.element(f"affinity-timeout-{affinity}-{v}", aid)
            out.needs.add(f"arec-{v}-{affinity}")

        internal = local if plan.internal_local else cluster
        cluster_key = f"{plan.cluster_ip} . {key}"
        out.element(f"frontends-alb-{v}" if affinity else f"frontends-lb-{part}", cluster_key)
        if plan.internal_verdict is None and internal:
            endpoints("lb", cluster_key, internal, part)
            if affinity:
                out.element(f"affinity-ids-{v}", f"{cluster_key} : {aid}")
        else:
            out.element(f"no-endpoint-{self._verdict(plan)}-{v}", cluster_key)

        external_addresses = (*plan.external_ips, *plan.lb_ips)
        if not (plan.node_port or external_addresses):
            return
        np_key = f"{proto} . {plan.node_port}"
        n = len(cluster)
        # A Local policy without local endpoints drops outside clients only; pods and the
        # node itself still reach every endpoint, as in kube-proxy (xl / npl route them).
        served = plan.external_verdict is None or (plan.external_local and n > 0)
        if plan.external_verdict is not None:
            verdict = self._verdict(plan, external=True)
            # The node's own traffic is translated in nat-output (to every endpoint) after
            # filter-output, so a Local policy's drop lives in a set output does not consult.
            container = "no-local-endpoint" if served else "no-endpoint"
            for address in external_addresses:
                out.element(f"{container}-{verdict}-{v}", f"{address} . {key}")
            if plan.node_port:
                out.element(f"no-endpoint-nodeport-{verdict}-{v}", np_key)
        ext = "xl" if plan.external_local else f"{a}ext"
        np = "npl" if plan.external_local else f"{a}np"
        for address in external_addresses:
            frontend = f"{address} . {key}"
            out.element(f"frontends-{ext}-{v}", frontend)
            if plan.external_local:
                out.element(f"cluster-route-{v}", frontend)
            if not served:
                continue
            if plan.external_local:
                endpoints("xl", frontend, local)
            endpoints("lb", frontend, cluster, self.part_tag(plan.family, address))
            if affinity:
                out.element(f"affinity-ids-{v}", f"{frontend} : {aid}")
        if plan.node_port:
            out.element(f"nodeports-{np}-{v}", np_key)
            if plan.external_local:
                out.element(f"nodeport-cluster-route-{v}", np_key)
            if served:
                if plan.external_local:
                    endpoints("npl", np_key, local)
                endpoints("npc", np_key, cluster)
                if affinity:
                    out.element(f"affinity-nodeport-ids-{v}", f"{np_key} : {aid}")

    def _render_chained(self, plan: Plan, out: Rendered) -> None:
        """A service port with ClientIP affinity: kube-proxy's per-endpoint chains."""
        fam = plan.family
        ip = ip_keyword(fam)
        v = f"v{fam}"
        proto = plan.protocol.lower()
        h = name_hash(plan.id)
        affinity = plan.affinity_timeout

        ep_chains: dict[tuple[str, int], str] = {}
        for b in _ordered((*plan.cluster_backends, *plan.local_backends)):
            ident = (b.ip, b.port)
            if ident in ep_chains:
                continue
            name = f"ep-{name_hash(plan.id, b.ip, b.port)}"
            ep_chains[ident] = name
            aff = f"aff-{name[3:]}"
            out.sets[aff] = f"type {addr_type(fam)}; flags dynamic,timeout; timeout {affinity}s;"
            out.chains[name] = (
                f"update @{aff} {{ {ip} saddr timeout {affinity}s }}",
                f"meta l4proto {proto} dnat {ip} to {_dnat_target(b.ip, b.port, fam)}",
            )

        def policy_chain(name: str, backends: tuple[Backend, ...]) -> None:
            targets = [ep_chains[(b.ip, b.port)] for b in _ordered(backends)]
            rules = [f"{ip} saddr @aff-{t[3:]} goto {t}" for t in targets]
            # Uniform without an anonymous set: rule i takes 1/(N-i) of what reaches it.
            count = len(targets)
            rules += [
                f"numgen random mod {count - i} == 0 goto {t}" for i, t in enumerate(targets[:-1])
            ]
            rules.append(f"goto {targets[-1]}")
            out.chains[name] = tuple(rules)
            if SAFE_COMMENT.match(plan.id):
                out.comments[name] = plan.id

        svc = f"svc-{h}" if plan.cluster_backends else None
        local = (
            f"local-{h}"
            if plan.local_backends and (plan.internal_local or plan.external_local)
            else None
        )
        if svc:
            policy_chain(svc, plan.cluster_backends)
        if local:
            policy_chain(local, plan.local_backends)

        key = f"{proto} . {plan.port}"
        cluster_key = f"{plan.cluster_ip} . {key}"
        internal = local if plan.internal_local else svc
        if plan.internal_verdict is None and internal:
            out.element(f"service-ips-{v}", f"{cluster_key} : goto {internal}")
        else:
            out.element(f"no-endpoint-{self._verdict(plan)}-{v}", cluster_key)

        external_addresses = (*plan.external_ips, *plan.lb_ips)
        if not (plan.node_port or external_addresses):
            return
        ext = None
        # A Local policy without local endpoints still short-circuits pods and the node to
        # every endpoint; its chain drops everyone else.
        if plan.external_verdict is None or (plan.external_local and svc):
            ext = f"ext-{h}"
            target = svc or local
            if plan.external_local:
                rules = []
                if target and self.shared.has_cluster_cidrs[fam]:
                    rules.append(f"{ip} saddr @cluster-cidrs-{v} goto {target}")
                rules.append("fib saddr type local jump mark-for-masquerade")
                if target:
                    rules.append(f"fib saddr type local goto {target}")
                rules.append(f"goto {local}" if local else "drop")
            else:
                rules = ["jump mark-for-masquerade", f"goto {target}"]
            out.chains[ext] = tuple(rules)
            if SAFE_COMMENT.match(plan.id):
                out.comments[ext] = plan.id
        np_key = f"{proto} . {plan.node_port}"
        if ext:
            for address in external_addresses:
                out.element(f"service-ips-{v}", f"{address} . {key} : goto {ext}")
            if plan.node_port:
                out.element(f"service-nodeports-{v}", f"{np_key} : goto {ext}")
        else:
            verdict = self._verdict(plan, external=True)
            for address in external_addresses:
                out.element(f"no-endpoint-{verdict}-{v}", f"{address} . {key}")
            if plan.node_port:
                out.element(f"no-endpoint-nodeport-{verdict}-{v}", np_key)

    @staticmethod
    def _verdict(plan: Plan, external: bool = False) -> str:
        """How a frontend without (local) endpoints is refused: "reject" or "drop"."""
        verdict = plan.external_verdict if external else plan.internal_verdict
        return "reject" if verdict in (None, "reject") else "drop"


_BY_ADDRESS = operator.attrgetter("ip", "port")


def _ordered(backends: Iterable[Backend]) -> list[Backend]:
    """Backends in a stable order, so that the same set always renders the same elements."""
    return sorted(backends, key=_BY_ADDRESS)


def _collapsed(cidrs: Iterable[str]) -> list[str]:
    """CIDRs without overlaps (an interval set refuses them), per family (IPv4 first)."""
    nets = [ipaddress.ip_network(c, strict=False) for c in cidrs]
    v4 = ipaddress.collapse_addresses(n for n in nets if isinstance(n, ipaddress.IPv4Network))
    v6 = ipaddress.collapse_addresses(n for n in nets if isinstance(n, ipaddress.IPv6Network))
    return [str(n) for n in (*v4, *v6)]


def clusterip_ranges(layout: NetworkLayout, settings: NftablesSettings) -> list[str]:
    """Where ClusterIPs are allocated: the ServiceCIDR objects' ranges, or where the cluster
    has none (or the API serves none), lace.serviceCIDRs; without overlaps."""
    return _collapsed(layout.service_cidrs or settings.service_cidrs)


def allows_all(ranges: tuple[str, ...]) -> bool:
    """A /0 range lets every source in, as kube-proxy treats it: no firewall at all."""
    return any(r.endswith("/0") for r in ranges)


def element_key(element: str) -> str:
    """The key of a rendered element: a map's `key : value` without the value; a set's whole."""
    return element.split(" : ", 1)[0]
