"""The nftables backend: plans in, nf_tables objects out, one atomic transaction per sync.

Dispatch is kube-proxy's (verdict maps keyed by `address . protocol . port`, and
`protocol . port` for NodePorts), but a service port is data, not chains, so that the
table stays fast at tens of thousands of services: the kernel's cost of a transaction
grows with the number of chains (nft re-reads them all; the kernel re-validates jumps),
and anonymous sets bound in rules cost quadratically when many are loaded at once.

- `service-ips-v4` sends a frontend to a shared chain `lb-v4-N` (N: its endpoint count),
  which DNATs by looking up `address . protocol . port . (numgen random mod N)` in the
  data map `endpoints-v4`. External frontends go through `ext-v4-N` (masquerade first),
  NodePorts through `np-v4-N` (map `nodeport-endpoints-v4`), and externalTrafficPolicy
  Local through `xl-v4-N-M` / `npl-v4-N-M` (pods and the node itself use the N cluster
  endpoints, others the M local ones in `local-endpoints-v4` / `nodeport-local-endpoints-v4`).
  These chains are shared by every service with the same counts.
- Hairpin traffic (a pod reaching itself through a service) is masqueraded in postrouting
  by the set `hairpin-v4` of `endpoint . endpoint` pairs.
- loadBalancerSourceRanges are the sets `firewall-ips-v4` and `firewall-allow-v4`.
- Services with ClientIP affinity keep kube-proxy's per-service layout (`svc-*`, `local-*`,
  `ext-*` chains, an `ep-*` chain and an affinity set per endpoint), since the choice
  must be remembered per endpoint; they are the only per-service chains.
- reject/drop for services without (local) endpoints happen in filter chains, before
  routing, because a DNAT never happens for them.
- A new connection to an address of the service CIDRs that no Service holds is dropped
  (`clusterip-ranges-v4`: the ServiceCIDR objects' ranges, else `lace.serviceCIDRs`), as in
  kube-proxy's nftables mode: it is neither forwarded nor sent out of the node's uplink.

Per-service chain names are hashes of the plan id (object names never reach nft as
identifiers); the plan id is attached as the chain's comment when it is made of safe
characters only. Rendering is deterministic, so the objects a plan produced can be
recomputed from the plan: an update diffs old against new and touches only what changed.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import logging
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from lace_proxy.dataplane import rescue
from lace_proxy.dataplane.base import NO_NETWORKS, FullSyncRequired
from lace_proxy.dataplane.conntrack import (
    Conntrack,
    Filter,
    StaleFlows,
    UdpFlow,
    stale_udp_filters,
    stale_udp_filters_by_elements,
)
from lace_proxy.dataplane.nft import Nft, NftError, TableListing, Transaction
from lace_proxy.networks.graph import NetworkLayout
from lace_proxy.prefixes import covered
from lace_proxy.table import Changeset

log = logging.getLogger(__name__)

#: Shared chain kinds: lb (DNAT by endpoint count), ext (masquerade, then lb), npc (NodePort
#: DNAT), np (masquerade, then npc), xl / npl (externalTrafficPolicy Local, by local count);
#: alb / aext / anp: the same with ClientIP affinity; arec-vF-T records affinity (T seconds).
SHARED_KINDS = ("lb", "ext", "npc", "np", "xl", "npl", "alb", "aext", "anp")
#: Shared chains that look up a data map declared with `typeof` (see PRECREATED_COUNTS).
FULL_SYNC_ONLY = ("lb", "npc", "xl", "npl")
#: Counts 1..this get their shared chains in every full sync. nft (1.0.6) cannot add a rule
#: that looks up a data map read back from the kernel, so a chain for a new count can only
#: be made together with the maps, in a full sync.
PRECREATED_COUNTS = 16
#: Entries of the ClientIP affinity maps: (client, service port's id) -> endpoint.
AFFINITY_SIZE = 1 << 20
#: Dynamic state a full sync keeps: clients' remembered endpoints, moved flows' replies.
KEPT = ("affinity-v4", "affinity-v6", *rescue.CONTAINERS)
#: Changes whenever what a table's skeleton means changes (see NftablesBackend._skeleton).
SKELETON_VERSION = 1
#: Every this many full syncs read every element back (see NftablesBackend.full_sync).
VERIFY_EVERY = 10
#: Chains the network model fills (see Renderer.render_networks); empty without it.
ACCESS_CHAINS = ("access", "host-access", "unproxied")
#: What a connection the network model does not allow gets: an ICMP error no other part of
#: the proxy sends (no endpoints is port-unreachable), so it is told apart on the wire.
DENY = "reject with icmpx admin-prohibited"
#: The node's own connection to a ClusterIP outside lace.serviceCIDRs, in IPVS mode: no route
#: to the proxy (nftables mode lets it leave by the node's routes).
UNROUTED = "reject with icmpx no-route"
SHARED_CHAIN = re.compile(rf"^(?:{'|'.join((*SHARED_KINDS, 'arec'))})-v[46]-[0-9]+$")
SAFE_COMMENT = re.compile(r"^[A-Za-z0-9._:/-]{1,128}$")
IFNAME_PREFIX = re.compile(r"^[A-Za-z0-9._-]{1,15}$")
TABLE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")
FAMILIES = (4, 6)
#: What adopting a previous process's affinity ids reads: the ids, then the endpoints.
AFFINITY_IDS = tuple(f"affinity{k}-ids-v{f}" for f in FAMILIES for k in ("", "-nodeport"))
AFFINITY_ENDPOINTS = tuple(f"{k}endpoints-v{f}" for f in FAMILIES for k in ("", "nodeport-"))


@dataclass(frozen=True)
class NftablesSettings:
    """What the backend needs from the configuration."""

    table: str = "lace-proxy"
    masquerade_all: bool = False
    masquerade_bit: int = 14
    cluster_cidrs: tuple[str, ...] = ()  # pod CIDRs: sources inside them are not masqueraded
    node_port_cidrs: tuple[str, ...] = ()  # empty: NodePorts on every local address
    # nodePortAddresses "primary": NodePorts only on the node's own addresses (from its Node
    # object), none until they are known.
    node_port_primary: bool = False
    # node.serviceCIDRs: with the Lace network model on, only ClusterIPs inside them are
    # proxied for the node's own traffic (the rest leave by its ordinary routes).
    service_cidrs: tuple[str, ...] = ()
    # detectLocal.interfaceNamePrefix: the node's pod interfaces. With the network model on,
    # the node's own connections out of them (to its local pods, e.g. kubelet probes) are
    # never refused; without it only its podCIDRs are exempt.
    pod_interface_prefix: str = ""
    # False in IPVS mode: IPVS translates (and remembers ClientIP affinity); nftables only
    # filters, marks for masquerade and enforces the network model.
    translate: bool = True

    def __post_init__(self) -> None:
        if not TABLE_NAME.match(self.table):
            raise ValueError(f"invalid nftables table name {self.table!r}")
        if self.pod_interface_prefix and not IFNAME_PREFIX.match(self.pod_interface_prefix):
            raise ValueError(
                f"interface prefix {self.pod_interface_prefix!r}: only letters, digits, "
                "'.', '_' and '-' (at most 15) can be used in nftables rules"
            )
        if not 0 <= self.masquerade_bit <= 31:
            raise ValueError(f"masqueradeBit {self.masquerade_bit} is not in 0-31")
        for cidr in (*self.cluster_cidrs, *self.node_port_cidrs, *self.service_cidrs):
            ipaddress.ip_network(cidr, strict=False)  # raises ValueError on bad input


def name_hash(*parts: object) -> str:
    """A short lowercase hash of `parts` for nft object names (names from the API never reach
    nft as identifiers); explain recomputes the names it looks for with it."""
    digest = hashlib.blake2b("\0".join(map(str, parts)).encode(), digest_size=10).digest()
    return base64.b32encode(digest).decode().lower()


def _ip(family: int) -> str:
    return "ip" if family == 4 else "ip6"


def _addr_type(family: int) -> str:
    return "ipv4_addr" if family == 4 else "ipv6_addr"


def _dnat_target(ip: str, port: int, family: int) -> str:
    return f"{ip}:{port}" if family == 4 else f"[{ip}]:{port}"


@dataclass
class Rendered:
    """The nf_tables objects of one plan: chains with their rules, map/set elements, sets."""

    chains: dict[str, tuple[str, ...]] = field(default_factory=dict)
    comments: dict[str, str] = field(default_factory=dict)
    elements: dict[str, set[str]] = field(default_factory=dict)  # map/set name -> elements
    sets: dict[str, str] = field(default_factory=dict)  # name -> spec
    # Elements several plans may hold (a ClusterIP of several ports, an endpoint of several
    # services): the backend counts references and programs each once.
    shared: set[tuple[str, str]] = field(default_factory=set)
    needs: set[str] = field(default_factory=set)  # shared chains (lb-*, ext-*, ...) used

    def element(self, container: str, value: str) -> None:
        self.elements.setdefault(container, set()).add(value)


class AffinityIds:
    """Unique 32-bit ids (conntrack marks) for service ports with ClientIP affinity.

    A client's remembered endpoint is keyed by (client, id), so two live service ports must
    never share an id. When an endpoint leaves a service port, the port gets a fresh id:
    every remembered choice of the old id is orphaned (and idles out), so no client is sent
    to an endpoint that is gone (clients of the remaining endpoints choose again).
    """

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._owners: dict[int, str] = {}
        self._backends: dict[str, frozenset[tuple[str, int]]] = {}
        self._serial = 0

    def assign(self, plan_id: str, backends: frozenset[tuple[str, int]]) -> None:
        if plan_id in self._ids:
            if self._backends[plan_id] <= backends:  # only additions: choices stay valid
                self._backends[plan_id] = backends
                return
            self.release(plan_id)
        self._serial += 1
        seed = f"{plan_id}#{self._serial}".encode()
        value = int.from_bytes(hashlib.blake2b(seed, digest_size=4).digest(), "big") or 1
        while value in self._owners:
            value = value % 0xFFFFFFFF + 1  # never 0: that is "no affinity"
        self._ids[plan_id] = value
        self._owners[value] = plan_id
        self._backends[plan_id] = backends

    def adopt(self, plan_id: str, value: int, backends: frozenset[tuple[str, int]]) -> None:
        """Take over the id a previous process gave the plan, with the endpoints it had."""
        if plan_id not in self._ids and value not in self._owners and 0 < value <= 0xFFFFFFFF:
            self._ids[plan_id] = value
            self._owners[value] = plan_id
            self._backends[plan_id] = backends

    def release(self, plan_id: str) -> None:
        value = self._ids.pop(plan_id, None)
        if value is not None:
            del self._owners[value]
            del self._backends[plan_id]

    def get(self, plan_id: str) -> str:
        return f"{self._ids[plan_id]:#010x}"

    def keep_only(self, plan_ids: set[str]) -> None:
        for plan_id in set(self._ids) - plan_ids:
            self.release(plan_id)


def _backend_set(plan: Any) -> frozenset[tuple[str, int]]:
    return frozenset((b.ip, b.port) for b in (*plan.cluster_backends, *plan.local_backends))


def _needs_id(plan: Any) -> bool:
    return bool(plan.affinity_timeout) and plan.family == 4 and not plan.external_local


class Renderer:
    """Turns a plan into nf_tables objects, deterministically."""

    def __init__(self, settings: NftablesSettings) -> None:
        self.s = settings
        self.affinity_ids = AffinityIds()
        # The node's InternalIPs: its NodePort addresses under node_port_primary, and
        # whether loadBalancerSourceRanges let the node in.
        self.node_addresses: tuple[str, ...] = ()
        self._has_cluster_cidrs = {
            f: bool(self._cidrs(settings.cluster_cidrs, f)) for f in FAMILIES
        }

    def render(self, plan: Any) -> Rendered:
        out = Rendered()
        fam = plan.family
        v = f"v{fam}"
        out.shared.add((f"cluster-ips-{v}", plan.cluster_ip))
        for b in (*plan.cluster_backends, *plan.local_backends):
            out.shared.add((f"hairpin-{v}", f"{b.ip} . {b.ip}"))
        if plan.affinity_timeout and (plan.external_local or fam == 6) and self.s.translate:
            # Per-endpoint state, as kube-proxy: affinity under externalTrafficPolicy Local
            # (rare), and IPv6 affinity (nft 1.0.6 cannot record an IPv6 address . port).
            self._render_chained(plan, out)
        else:
            self._render_data(plan, out)
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
                out.shared.add((f"ipvs-addresses-{v}", address))
        return out

    @staticmethod
    def render_access(plan: Any, out: Rendered) -> None:
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
                f"{self._nodeport_match(fam)} meta l4proto . th dport"
                f" @controlled-nodeports-v{fam} drop"
                for fam in FAMILIES
            ),
            # Pod networks host-local is not peered to, except this node's own pods.
            *(
                f"{_ip(fam)} daddr @host-unpeered-v{fam}"
                f" {_ip(fam)} daddr != @local-pod-cidrs-v{fam}{local_pods} {DENY}"
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
            f"{_ip(fam)} daddr @cluster-ips-v{fam} {_ip(fam)} daddr != @service-cidrs-v{fam}"
            f" {unproxied}"
            for fam in FAMILIES
        )
        for network in layout.networks:
            h = name_hash(network)
            rules = []
            for fam in FAMILIES:
                v, ip = f"v{fam}", _ip(fam)
                for name, spec in (
                    (f"reach-{h}-{v}", f"type {_addr_type(fam)} . inet_proto . inet_service;"),
                    (f"reach-nodeports-{h}-{v}", "type inet_proto . inet_service;"),
                ):
                    out.sets[name] = spec
                rules.append(f"{ip} daddr . meta l4proto . th dport @reach-{h}-{v} return")
                rules.append(
                    f"{self._nodeport_match(fam)} meta l4proto . th dport"
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

    def _render_data(self, plan: Any, out: Rendered) -> None:
        """A service port as map elements pointing at shared chains."""
        v = f"v{plan.family}"
        proto = plan.protocol.lower()
        key = f"{proto} . {plan.port}"
        cluster = _ordered(plan.cluster_backends)
        local = _ordered(plan.local_backends)

        def endpoints(container: str, prefix: str, backends: list[Any]) -> None:
            for i, b in enumerate(backends):
                out.element(container, f"{prefix} . {i} : {b.ip} . {b.port}")

        # ClientIP affinity: the "a" chains mark the connection with the plan's affinity id
        # and DNAT to the endpoint remembered for (client, frontend, id) if there is one;
        # postrouting records the endpoint chosen (see base()).
        affinity = plan.affinity_timeout if self.s.translate else 0
        a = "a" if affinity else ""
        aid = self.affinity_ids.get(plan.id) if affinity else ""
        if affinity:
            # jump, not goto: nat-postrouting must go on to masquerade after recording.
            out.element(f"affinity-record-{v}", f"{aid} : jump arec-{v}-{affinity}")
            out.needs.add(f"arec-{v}-{affinity}")

        internal = local if plan.internal_local else cluster
        cluster_key = f"{plan.cluster_ip} . {key}"
        if plan.internal_verdict is None and internal:
            count = len(internal)
            out.element(f"service-ips-{v}", f"{cluster_key} : goto {a}lb-{v}-{count}")
            out.needs.update({f"{a}lb-{v}-{count}", f"lb-{v}-{count}"})
            endpoints(f"endpoints-{v}", cluster_key, internal)
            if affinity:
                out.element(f"affinity-ids-{v}", f"{cluster_key} : {aid}")
        else:
            out.element(f"no-endpoint-services-{v}", f"{cluster_key} : {self._verdict(plan)}")

        external_addresses = (*plan.external_ips, *plan.lb_ips)
        if not (plan.node_port or external_addresses):
            return
        np_key = f"{proto} . {plan.node_port}"
        n, m = len(cluster), len(local)
        if plan.external_verdict is not None:
            verdict = self._verdict(plan, external=True)
            # A Local policy without local endpoints drops outside clients only: the node's
            # own traffic is translated in nat-output (to every endpoint) after filter-output,
            # so its drop lives in a map that output does not consult.
            container = (
                "no-local-endpoint-services"
                if plan.external_local and n
                else ("no-endpoint-services")
            )
            for address in external_addresses:
                out.element(f"{container}-{v}", f"{address} . {key} : {verdict}")
            if plan.node_port:
                out.element(f"no-endpoint-nodeports-{v}", f"{np_key} : {verdict}")
            if not (plan.external_local and n):
                return
            # Local policy without local endpoints: outside clients are dropped (above), but
            # pods and the node itself still reach every endpoint, as in kube-proxy; the
            # `xl`/`npl` chains with no local endpoints (m = 0) do just that.
        ext = f"xl-{v}-{m}" if plan.external_local else f"{a}ext-{v}-{n}"
        np = f"npl-{v}-{m}" if plan.external_local else f"{a}np-{v}-{n}"
        for address in external_addresses:
            out.element(f"service-ips-{v}", f"{address} . {key} : goto {ext}")
            if plan.external_local:
                endpoints(f"local-endpoints-{v}", f"{address} . {key}", local)
                if n:  # pods and the node itself still use every endpoint
                    route = f"{address} . {key} : goto lb-{v}-{n}"
                    out.element(f"cluster-route-{v}", route)
            if n:
                endpoints(f"endpoints-{v}", f"{address} . {key}", cluster)
            if affinity:
                out.element(f"affinity-ids-{v}", f"{address} . {key} : {aid}")
        if external_addresses:
            out.needs.add(ext)
            if n:
                out.needs.add(f"lb-{v}-{n}")
                if affinity:
                    out.needs.add(f"alb-{v}-{n}")
        if plan.node_port:
            out.element(f"service-nodeports-{v}", f"{np_key} : goto {np}")
            out.needs.add(np)
            if plan.external_local:
                endpoints(f"nodeport-local-endpoints-{v}", np_key, local)
                if n:
                    out.element(f"nodeport-cluster-route-{v}", f"{np_key} : goto npc-{v}-{n}")
            if n:
                out.needs.add(f"npc-{v}-{n}")
                endpoints(f"nodeport-endpoints-{v}", np_key, cluster)
            if affinity:
                out.element(f"affinity-nodeport-ids-{v}", f"{np_key} : {aid}")

    def shared_chain(self, name: str) -> tuple[str, ...]:
        """The rules of a shared chain, from its name (KIND-vF-COUNT; see SHARED_KINDS)."""
        kind, v, count = name.split("-")
        fam = int(v[1:])
        ip = _ip(fam)
        n = int(count)
        lookup = f"{ip} daddr . meta l4proto . th dport"
        np_lookup = "meta l4proto . th dport"

        def dnat(key: str, container: str) -> str:
            return f"dnat {ip} to {key} . numgen random mod {n} map @{container}-{v}"

        if not self.s.translate and kind in ("lb", "npc"):
            return ()  # IPVS translates: the packet goes on to it
        if kind == "lb":
            return (dnat(lookup, "endpoints"),)
        if kind == "arec":  # n is the affinity timeout here
            record = f"{ip} saddr . ct mark timeout {n}s"
            return (f"update @affinity-{v} {{ {record} : {ip} daddr . th dport }}",)
        if kind in ("alb", "anp"):
            ids = (
                f"{lookup} map @affinity-ids-{v}"
                if kind == "alb"
                else f"{np_lookup} map @affinity-nodeport-ids-{v}"
            )
            remembered = f"{ip} saddr . ct mark map @affinity-{v}"
            rules = ["jump mark-for-masquerade"] if kind == "anp" else []
            rules.append(f"ct mark set {ids}")
            rules += [f"meta l4proto {p} dnat {ip} to {remembered}" for p in ("tcp", "udp", "sctp")]
            rules.append(f"goto {'lb' if kind == 'alb' else 'npc'}-{v}-{n}")
            return tuple(rules)
        if kind == "aext":
            return ("jump mark-for-masquerade", f"goto alb-{v}-{n}")
        if kind == "ext":
            return ("jump mark-for-masquerade", f"goto lb-{v}-{n}")
        if kind == "npc":
            return (f"meta nfproto ipv{fam} {dnat(np_lookup, 'nodeport-endpoints')}",)
        if kind == "np":
            return ("jump mark-for-masquerade", f"goto npc-{v}-{n}")
        # xl / npl: externalTrafficPolicy Local. Pods and the node itself are routed to
        # every endpoint (the *cluster-route maps), other sources to the n local ones.
        route, local_map, key = (
            (f"{lookup} vmap @cluster-route-{v}", "local-endpoints", lookup)
            if kind == "xl"
            else (
                f"{np_lookup} vmap @nodeport-cluster-route-{v}",
                "nodeport-local-endpoints",
                np_lookup,
            )
        )
        rules = []
        if self._has_cluster_cidrs[fam]:
            rules.append(f"{ip} saddr @cluster-cidrs-{v} {route}")
        rules.append("fib saddr type local jump mark-for-masquerade")
        rules.append(f"fib saddr type local {route}")
        if n and self.s.translate:  # n = 0: only the short-circuit (the filter drops the rest)
            rules.append(f"meta nfproto ipv{fam} {dnat(key, local_map)}")
        return tuple(rules)

    def precreated(self) -> list[str]:
        """Shared chains every full sync makes, so that changes rarely need a new one."""
        return [
            f"{kind}-v{fam}-{n}"
            for fam in FAMILIES
            for kind in SHARED_KINDS
            for n in range(0 if kind in ("xl", "npl") else 1, PRECREATED_COUNTS + 1)
        ]

    def _render_chained(self, plan: Any, out: Rendered) -> None:
        """A service port with ClientIP affinity: kube-proxy's per-endpoint chains."""
        fam = plan.family
        ip = _ip(fam)
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
            out.sets[aff] = f"type {_addr_type(fam)}; flags dynamic,timeout; timeout {affinity}s;"
            out.chains[name] = (
                f"update @{aff} {{ {ip} saddr timeout {affinity}s }}",
                f"meta l4proto {proto} dnat {ip} to {_dnat_target(b.ip, b.port, fam)}",
            )

        def policy_chain(name: str, backends: tuple[Any, ...]) -> None:
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
            out.element(f"no-endpoint-services-{v}", f"{cluster_key} : {self._verdict(plan)}")

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
                if target and self._has_cluster_cidrs[fam]:
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
        ext_verdict = f"goto {ext}" if ext else self._verdict(plan, external=True)
        ext_map = "service-ips" if ext else "no-endpoint-services"
        for address in external_addresses:
            out.element(f"{ext_map}-{v}", f"{address} . {key} : {ext_verdict}")
        if plan.node_port:
            np_map = "service-nodeports" if ext else "no-endpoint-nodeports"
            out.element(f"{np_map}-{v}", f"{proto} . {plan.node_port} : {ext_verdict}")

    @staticmethod
    def _verdict(plan: Any, external: bool = False) -> str:
        verdict = plan.external_verdict if external else plan.internal_verdict
        return "goto reject-chain" if verdict in (None, "reject") else "drop"

    def base(self) -> list[str]:
        """The table's fixed skeleton: base chains, helper chains, maps and sets."""
        t = self.s.table
        mark = 1 << self.s.masquerade_bit
        # A hairpin pair after nftables' own DNAT; under IPVS (whose translation nftables
        # does not see as DNAT) the pair alone, as kube-proxy's IPVS mode does.
        dnatted = "ct status dnat " if self.s.translate else ""
        lines = [f"table inet {t} {{"]
        for fam in FAMILIES:
            v = f"v{fam}"
            ip = _ip(fam)
            at = _addr_type(fam)
            by_bucket = f"typeof {ip} daddr . meta l4proto . th dport . numgen random mod 1"
            np_by_bucket = "typeof meta l4proto . th dport . numgen random mod 1"
            target = f"{ip} daddr . th dport"
            lines += [
                f"  map endpoints-{v} {{ {by_bucket} : {target}; }}",
                f"  map local-endpoints-{v} {{ {by_bucket} : {target}; }}",
                f"  map nodeport-endpoints-{v} {{ {np_by_bucket} : {target}; }}",
                f"  map nodeport-local-endpoints-{v} {{ {np_by_bucket} : {target}; }}",
                f"  map cluster-route-{v} {{ type {at} . inet_proto . inet_service : verdict; }}",
                f"  map affinity-ids-{v} {{ type {at} . inet_proto . inet_service : mark; }}",
                f"  map affinity-nodeport-ids-{v} {{ type inet_proto . inet_service : mark; }}",
                f"  map affinity-record-{v} {{ type mark : verdict; }}",
                f"  map affinity-{v} {{ type {at} . mark : {at} . inet_service;"
                f" flags dynamic,timeout; size {AFFINITY_SIZE}; }}",
                f"  map nodeport-cluster-route-{v} {{ type inet_proto . inet_service : verdict; }}",
            ]
            lines += [
                f"  map service-ips-{v} {{ type {at} . inet_proto . inet_service : verdict; }}",
                f"  map no-endpoint-services-{v} {{ type {at} . inet_proto . inet_service"
                " : verdict; }",
                f"  map no-local-endpoint-services-{v} {{ type {at} . inet_proto . inet_service"
                " : verdict; }",
                f"  set firewall-ips-{v} {{ type {at} . inet_proto . inet_service; }}",
                f"  set firewall-allow-{v} {{ typeof {ip} daddr . meta l4proto . th dport"
                f" . {ip} saddr; flags interval; }}",
                f"  map service-nodeports-{v} {{ type inet_proto . inet_service : verdict; }}",
                f"  map no-endpoint-nodeports-{v} {{ type inet_proto . inet_service : verdict; }}",
                f"  set cluster-ips-{v} {{ type {at}; }}",
                f"  set hairpin-{v} {{ typeof {ip} saddr . {ip} daddr; }}",
                f"  set cluster-cidrs-{v} {{ type {at}; flags interval; "
                f"{self._elements(fam, self.s.cluster_cidrs)}}}",
                f"  set nodeport-cidrs-{v} {{ type {at}; flags interval; "
                f"{self._elements(fam, self._nodeport_cidrs())}}}",
                # IPVS mode: the frontends on the dummy interface, and its addresses.
                f"  set service-ports-{v} {{ type {at} . inet_proto . inet_service; }}",
                f"  set ipvs-addresses-{v} {{ type {at}; }}",
                f"  set service-cidrs-{v} {{ type {at}; flags interval; "
                f"{self._elements(fam, self.s.service_cidrs)}}}",
                f"  set clusterip-ranges-{v} {{ type {at}; flags interval; }}",
                f"  set controlled-{v} {{ type {at} . inet_proto . inet_service; }}",
                f"  set controlled-nodeports-{v} {{ type inet_proto . inet_service; }}",
                f"  map source-networks-{v} {{ type {at} : verdict; flags interval; }}",
                f"  set host-unpeered-{v} {{ type {at}; flags interval; }}",
                f"  set local-pod-cidrs-{v} {{ type {at}; flags interval; }}",
                *rescue.declarations(fam),
            ]
        lines += [
            "  chain mark-for-masquerade {",
            f"    meta mark set meta mark | {mark:#x}",
            "  }",
            "  chain masquerading {",
            f"    {dnatted}ip saddr . ip daddr @hairpin-v4 jump mark-for-masquerade",
            f"    {dnatted}ip6 saddr . ip6 daddr @hairpin-v6 jump mark-for-masquerade",
            f"    meta mark & {mark:#x} == 0 return",
            f"    meta mark set meta mark ^ {mark:#x}",
            "    masquerade fully-random",
            "  }",
            "  chain reject-chain {",
            "    reject",
            "  }",
            "  chain services {",
        ]
        for fam in FAMILIES:
            ip, v = _ip(fam), f"v{fam}"
            if self.s.masquerade_all:
                lines.append(f"    {ip} daddr @cluster-ips-{v} jump mark-for-masquerade")
            elif self._cidrs(self.s.cluster_cidrs, fam):
                lines.append(
                    f"    {ip} daddr @cluster-ips-{v} {ip} saddr != @cluster-cidrs-{v}"
                    " jump mark-for-masquerade"
                )
            lines.append(f"    {ip} daddr . meta l4proto . th dport vmap @service-ips-{v}")
            lines.append(
                f"    {self._nodeport_match(fam)} meta l4proto . th dport"
                f" vmap @service-nodeports-{v}"
            )
        lines += ["  }", "  chain service-endpoints-check {"]
        for fam in FAMILIES:
            ip, v = _ip(fam), f"v{fam}"
            lines.append(f"    {ip} daddr . meta l4proto . th dport vmap @no-endpoint-services-{v}")
        lines += ["  }", "  chain external-endpoints-check {"]
        for fam in FAMILIES:
            ip, v = _ip(fam), f"v{fam}"
            lines.append(
                f"    {ip} daddr . meta l4proto . th dport vmap @no-local-endpoint-services-{v}"
            )
        lines += ["  }", "  chain nodeport-endpoints-check {"]
        for fam in FAMILIES:
            lines.append(
                f"    {self._nodeport_match(fam)} meta l4proto . th dport"
                f" vmap @no-endpoint-nodeports-v{fam}"
            )
        lines += ["  }", "  chain firewall-check {"]
        for fam in FAMILIES:
            ip, v = _ip(fam), f"v{fam}"
            lines.append(
                f"    {ip} daddr . meta l4proto . th dport @firewall-ips-{v}"
                f" {ip} daddr . meta l4proto . th dport . {ip} saddr != @firewall-allow-{v} drop"
            )
        lines += ["  }", "  chain deny {"]
        for fam in FAMILIES:
            ip, v = _ip(fam), f"v{fam}"
            lines.append(f"    {ip} daddr . meta l4proto . th dport @controlled-{v} {DENY}")
            lines.append(
                f"    {self._nodeport_match(fam)} meta l4proto . th dport"
                f" @controlled-nodeports-{v} {DENY}"
            )
        lines += ["  }"]
        for name in ACCESS_CHAINS:
            lines += [f"  chain {name} {{", "  }"]
        if not self.s.translate:
            # Under IPVS the service addresses are the node's own: anything but a service
            # port must not reach the node's sockets (as kube-proxy's KUBE-IPVS-FILTER).
            lines += ["  chain ipvs-ports-check {"]
            for fam in FAMILIES:
                ip, v = _ip(fam), f"v{fam}"
                lines.append(
                    f"    {ip} daddr @ipvs-addresses-{v} {ip} daddr . meta l4proto . th dport"
                    f" != @service-ports-{v} goto reject-chain"
                )
            lines += ["  }"]
        lines += ["  chain cluster-ips-check {"]
        for fam in FAMILIES:
            ip, v = _ip(fam), f"v{fam}"
            # A ClusterIP answers only on its service ports: anything else is refused; an
            # address of the service CIDRs that no Service holds is dropped.
            lines.append(f"    {ip} daddr @cluster-ips-{v} goto reject-chain")
            lines.append(f"    {ip} daddr @clusterip-ranges-{v} drop")
        lines += [
            "  }",
            "  chain filter-prerouting {",
            "    type filter hook prerouting priority -110; policy accept;",
            "    ct state new jump access",
            "    ct state new jump firewall-check",
            "  }",
            "  chain filter-input {",
            "    type filter hook input priority -110; policy accept;",
            "    ct state new jump nodeport-endpoints-check",
            "    ct state new jump service-endpoints-check",
            "    ct state new jump external-endpoints-check",
            *(() if self.s.translate else ("    ct state new jump ipvs-ports-check",)),
            "  }",
            "  chain filter-forward {",
            "    type filter hook forward priority -110; policy accept;",
            "    ct state new jump service-endpoints-check",
            "    ct state new jump external-endpoints-check",
            "    ct state new jump cluster-ips-check",
            "  }",
            "  chain filter-output {",
            "    type filter hook output priority -110; policy accept;",
            "    ct state new jump unproxied",
            # The node's own connections (IPVS also sends what it forwards through output).
            "    ct state new fib saddr type local jump host-access",
            "    ct state new jump service-endpoints-check",
            "    ct state new jump firewall-check",
            "  }",
            "  chain filter-output-post-dnat {",
            "    type filter hook output priority -90; policy accept;",
            "    ct state new jump unproxied",
            "    ct state new jump cluster-ips-check",
            "  }",
            "  chain nat-prerouting {",
            "    type nat hook prerouting priority dstnat; policy accept;",
            "    jump services",
            "  }",
            "  chain nat-output {",
            "    type nat hook output priority -100; policy accept;",
            "    jump unproxied",
            "    jump services",
            "  }",
            "  chain nat-postrouting {",
            "    type nat hook postrouting priority srcnat; policy accept;",
            # Remember the endpoint of a ClientIP-affinity connection (before masquerade
            # rewrites the client's address).
            "    meta nfproto ipv4 ct status dnat ct mark vmap @affinity-record-v4",
            "    meta nfproto ipv6 ct status dnat ct mark vmap @affinity-record-v6",
            "    jump masquerading",
            "  }",
            *rescue.chains(),
            "}",
        ]
        return lines

    def base_chains(self) -> set[str]:
        """The chains base() declares."""
        return set(self.base_rule_counts())

    def base_rule_counts(self) -> dict[str, int]:
        """The chains base() declares, with the number of rules in each."""
        counts: dict[str, int] = {}
        chain = None
        for line in self.base():
            if line.startswith("  chain "):
                chain = line.split()[1]
                counts[chain] = 0
            elif line == "  }":
                chain = None
            elif chain is not None and not line.lstrip().startswith("type "):
                counts[chain] += 1
        return counts

    def base_containers(self) -> set[str]:
        """The maps and sets base() declares."""
        return {line.split()[1] for line in self.base() if line.startswith(("  map ", "  set "))}

    def base_elements(self) -> dict[str, set[str]]:
        """The elements base() declares with its sets (the configured CIDRs)."""
        out: dict[str, set[str]] = {}
        for fam in FAMILIES:
            for name, cidrs in (
                ("cluster-cidrs", self.s.cluster_cidrs),
                ("nodeport-cidrs", self._nodeport_cidrs()),
                ("service-cidrs", self.s.service_cidrs),
            ):
                out[f"{name}-v{fam}"] = set(self._cidrs(cidrs, fam))
        return out

    def _nodeport_cidrs(self) -> tuple[str, ...]:
        if self.s.node_port_primary:
            return tuple(f"{a}/{32 if ':' not in a else 128}" for a in self.node_addresses)
        return self.s.node_port_cidrs

    def _elements(self, family: int, cidrs: tuple[str, ...]) -> str:
        mine = self._cidrs(cidrs, family)
        return f"elements = {{ {', '.join(mine)} }}; " if mine else ""

    @staticmethod
    def _cidrs(cidrs: tuple[str, ...], family: int) -> list[str]:
        nets = (ipaddress.ip_network(c, strict=False) for c in cidrs)
        return [str(n) for n in nets if n.version == family]

    def _nodeport_match(self, family: int) -> str:
        ip = _ip(family)
        loopback = "127.0.0.0/8" if family == 4 else "::1"
        match = f"meta nfproto ipv{family} fib daddr type local {ip} daddr != {loopback}"
        if self.s.node_port_cidrs or self.s.node_port_primary:
            match += f" {ip} daddr @nodeport-cidrs-v{family}"
        return match


class NftablesBackend:
    """Programs plans into this node's nftables table; never decides policy."""

    family = "inet"

    def __init__(
        self,
        settings: NftablesSettings,
        nft: Nft | None = None,
        conntrack: Conntrack | None = None,
        *,
        verify_every: int = VERIFY_EVERY,
        udp_flows_moved: Callable[[int, int], None] | None = None,
    ) -> None:
        self.settings = settings
        self.verify_every = verify_every
        self.nft = nft or Nft()
        self.conntrack = conntrack
        # Told (rescued, unrescued) after each sync that moved UDP flows (rescue.py).
        self._udp_flows_moved = udp_flows_moved
        self.renderer = Renderer(settings)
        self._refs: Counter[tuple[str, str]] = Counter()  # shared element -> plans holding it
        self._shared_chains: set[str] = set()
        # The network model's objects as programmed (the caller hands the wanted layout to
        # each sync, taken together with the plans, so the two always agree).
        self._programmed_layout = NO_NETWORKS
        self._networks = self.renderer.render_networks(NO_NETWORKS)
        # The first full sync adopts the affinity ids a previous process left in the kernel.
        self._synced = False
        # Whether the kernel holds what this process programmed (no batch refused since the
        # last verified full sync), and how many full syncs ago that one was.
        self._trusted = False
        self._since_verified = 0

    @property
    def table(self) -> str:
        return self.settings.table

    def full_sync(
        self,
        plans: Iterable[Any],
        changes: Changeset | None = None,
        layout: NetworkLayout = NO_NETWORKS,
    ) -> int:
        """Bring the table to these plans by diff; returns the command count.

        Used for the first sync (also after a restart) and the periodic reconcile. The first
        one of a process, the one after a refused transaction, and every `verify_every`-th
        read every element back (seconds at 30k services: nft lists ~40k elements a second)
        and program only what differs, in one atomic batch: nothing is flushed, so a
        restarted proxy adopts what its predecessor made (affinity ids and clients' pinned
        endpoints included) and drift is repaired element by element. The others program
        `changes` as `apply` does and check the table's structure (chains, rules, sets: read
        in milliseconds) against the plans, verifying every element only if it differs.
        """
        plans = list(plans)
        if (
            self._synced
            and self._trusted
            and changes is not None
            and self._since_verified + 1 < self.verify_every
        ):
            try:
                count = self.apply(changes, layout)
            except FullSyncRequired:
                pass
            else:
                merged = self._render_all(plans, layout, None)[0]
                kernel = self._read(elements=False)
                tx = None if kernel is None else self._reconcile(merged, kernel, {})
                if tx is not None and not tx.commands:
                    self._since_verified += 1
                    return count
                log.warning("nftables: table %s is not as programmed; verifying it", self.table)
        return self._verified_sync(plans, changes, layout)

    def _verified_sync(
        self, plans: list[Any], changes: Changeset | None, layout: NetworkLayout
    ) -> int:
        """full_sync with every element read back (see there)."""
        kernel = self._read(elements=True)
        if kernel is not None and not self._synced:
            self._load(kernel, AFFINITY_IDS)
            if any(kernel.elements.get(c) for c in AFFINITY_IDS):
                self._load(kernel, AFFINITY_ENDPOINTS)
            ids = self.renderer.affinity_ids
            adoptable = _kernel_affinity_ids(kernel)
            for plan in plans:
                found = adoptable.get(f"{plan.cluster_ip} . {plan.protocol.lower()} . {plan.port}")
                if found is not None and _needs_id(plan):
                    ids.adopt(plan.id, *found)
        merged, refs, shared, networks = self._render_all(plans, layout, kernel)
        diff: dict[str, tuple[set[str], set[str]]] = {}
        tx = None
        if kernel is not None:
            diff = self._element_diff(merged, kernel)
            tx = self._reconcile(merged, kernel, diff)
        if tx is None:
            tx = self._rewrite(merged, networks, kernel)
        self._apply(tx)
        self._refs = refs
        self._shared_chains = shared
        self._networks, self._programmed_layout = networks, layout
        self._synced = self._trusted = True
        self._since_verified = 0
        if kernel is not None:
            # What the kernel held is known: only flows it translated to endpoints now
            # gone, or left alone for frontends now served, are stale.
            self._move_udp_flows(stale_udp_filters_by_elements(diff, plans))
        elif changes is not None:
            self._move_udp_flows(stale_udp_filters(changes))
        return len(tx)

    def _render_all(
        self, plans: list[Any], layout: NetworkLayout, kernel: KernelState | None
    ) -> tuple[Rendered, Counter[tuple[str, str]], set[str], Rendered]:
        """Every plan's objects merged, with the shared elements and chains and the network
        model's objects: what the table must hold (and its shared-element counts)."""
        ids = self.renderer.affinity_ids
        ids.keep_only({p.id for p in plans if _needs_id(p)})
        for plan in sorted(plans, key=lambda p: p.id):  # deterministic probing
            if _needs_id(plan):
                ids.assign(plan.id, _backend_set(plan))
        merged = Rendered()
        refs: Counter[tuple[str, str]] = Counter()
        for plan in plans:
            r = self.renderer.render(plan)
            refs.update(r.shared)
            _merge_into(merged, r)
        for container, element in refs:
            merged.element(container, element)
        shared = merged.needs | set(self.renderer.precreated()) | self._shared_chains
        if kernel is not None:  # shared chains stay once made, as after `apply`
            shared |= {name for name in kernel.rules if SHARED_CHAIN.match(name)}
        for name in shared:
            merged.chains[name] = self.renderer.shared_chain(name)
        networks = self.renderer.render_networks(layout)
        _merge_into(merged, networks)
        return merged, refs, shared, networks

    def _read(self, *, elements: bool) -> KernelState | None:
        """Our table as the kernel holds it (None if absent); with `elements`, the listing
        its maps' and sets' elements are parsed from (`_load`)."""
        t = self.settings.table
        raw = self.nft.table_objects(self.family, t)
        if raw is None:
            return None
        state = KernelState.from_json(raw)
        if elements:
            state.listing = self.nft.list_table_text(self.family, t)
        return state

    @staticmethod
    def _load(kernel: KernelState, containers: Iterable[str]) -> None:
        """Parse these containers' elements (those the kernel has) into `kernel`."""
        for name in containers:
            if name in kernel.containers and kernel.listing is not None:
                kernel.elements[name] = set(kernel.listing.elements(name))

    def _apply(self, tx: Transaction) -> None:
        """Apply a batch; one the kernel refused leaves the table's state unknown to us, so
        the next full sync verifies every element."""
        try:
            self.nft.apply(tx)
        except Exception:
            self._trusted = False
            raise

    def _element_diff(
        self, merged: Rendered, kernel: KernelState
    ) -> dict[str, tuple[set[str], set[str]]]:
        """Per container: the kernel's elements that are not wanted, and the wanted ones it
        lacks (dynamic state excluded), each container's parsed from the listing now unless
        `kernel` holds them already (and dropped from it). Elements are compared as text
        first; the few left over canonically (nft prints a /32 in an interval set as an
        address, a range that is a prefix as the prefix, a mark as a decimal number)."""
        wanted = {**merged.elements}
        for container, values in self.renderer.base_elements().items():
            wanted.setdefault(container, set()).update(values)
        out: dict[str, tuple[set[str], set[str]]] = {}
        for container in sorted(wanted.keys() | kernel.containers.keys()):
            kind = kernel.containers.get(container)
            if _dynamic(container) or kind is None:
                continue
            # One map at a time, dropped once compared: at 30k services they hold ~1M.
            have = kernel.elements.pop(container, None)
            if have is None:
                listing = kernel.listing
                have = set() if listing is None else set(listing.elements(container))
            want = wanted.get(container, set())
            gone, new = have - want, want - have
            if gone and new:
                by_canon = {_canonical(e): e for e in gone}
                for e in list(new):
                    match = by_canon.pop(_canonical(e), None)
                    if match is not None:
                        gone.discard(match)
                        new.discard(e)
            if gone or new:
                out[container] = (gone, new)
        return out

    def _reconcile(
        self,
        merged: Rendered,
        kernel: KernelState,
        diff: dict[str, tuple[set[str], set[str]]],
    ) -> Transaction | None:
        """The batch that turns the kernel's table into `merged`, or None where only a
        rewrite can (see full_sync)."""
        r = self.renderer
        counts = r.base_rule_counts()  # the skeleton's chains
        base_containers = r.base_containers()
        skeleton = self._skeleton()
        if skeleton not in kernel.rules:
            return None
        for name, count in counts.items():
            # (The network model's chains are declared by the skeleton, filled by plans.)
            if name not in merged.chains and len(kernel.rules.get(name, ())) != count:
                return None
        if not base_containers <= kernel.containers.keys():
            return None
        missing = {n for n in merged.chains if n not in kernel.rules}
        changed = {
            n
            for n, rules in merged.chains.items()
            if n in kernel.rules and kernel.rules[n] != [_rule_hash(x) for x in rules]
        }
        if any(n.split("-")[0] in FULL_SYNC_ONLY for n in missing | changed):
            return None
        t = self.settings.table
        tx = Transaction()
        for name, spec in sorted(merged.sets.items()):
            if name not in kernel.containers:
                tx.add(f"add set inet {t} {name} {{ {spec} }}")
        tx.extend(self._chain_decl(n, merged.comments.get(n)) for n in sorted(missing))
        for name in sorted(missing | changed, key=_chain_order):
            if name in changed:
                tx.add(f"flush chain inet {t} {name}")
            self._add_rules(tx, name, merged.chains[name])
        for container, (gone, new) in sorted(diff.items()):
            if gone:
                keys = ", ".join(sorted({element_key(e) for e in gone}))
                tx.add(f"delete element inet {t} {container} {{ {keys} }}")
            if new:
                tx.add(f"add element inet {t} {container} {{ {', '.join(sorted(new))} }}")
        keep = merged.chains.keys() | counts.keys() | {skeleton}
        gone_chains = sorted(kernel.rules.keys() - keep, key=_chain_order, reverse=True)
        tx.extend(f"flush chain inet {t} {name}" for name in gone_chains)
        tx.extend(f"delete chain inet {t} {name}" for name in gone_chains)
        for name, kind in sorted(kernel.containers.items()):
            if name not in merged.sets and name not in base_containers:
                tx.add(f"delete {kind} inet {t} {name}")
        return tx

    def _rewrite(
        self, merged: Rendered, networks: Rendered, kernel: KernelState | None
    ) -> Transaction:
        """One batch that flushes every chain, replaces every map and set, deletes what is
        no longer wanted and fills in the rest; the affinity state stays."""
        tx = Transaction()
        t = self.settings.table
        if kernel is not None:
            chains, containers = kernel.rules.keys(), kernel.containers
            tx.extend(f"flush chain inet {t} {name}" for name in sorted(chains))
            # Maps and sets are made anew (nft must see their definitions in the batch
            # that adds the rules using them); only the affinity state stays.
            tx.extend(
                f"delete {kind} inet {t} {name}"
                for name, kind in sorted(containers.items())
                if not _dynamic(name)
            )
            keep = merged.chains.keys() | self.renderer.base_chains() | {self._skeleton()}
            tx.extend(f"delete chain inet {t} {name}" for name in sorted(chains - keep))
            tx.extend(
                f"delete {kind} inet {t} {name}"
                for name, kind in sorted(containers.items())
                if name.startswith("aff-") and name not in merged.sets
            )
        # nft 1.0.6 refuses an interval map element naming a chain declared after the map in
        # the same batch, so the network chains are declared before the table's skeleton.
        tx.add(f"add table inet {t}")
        tx.extend(
            self._chain_decl(name, networks.comments.get(name))
            for name in sorted(networks.chains.keys() - set(ACCESS_CHAINS))
        )
        tx.extend(self.renderer.base())
        tx.add(self._chain_decl(self._skeleton(), None))
        self._add_objects(tx, merged)
        return tx

    def _skeleton(self) -> str:
        """The name of an empty chain that marks the skeleton the table was made with: a
        table of another skeleton (another version or configuration) is rewritten."""
        return f"skeleton-{name_hash(SKELETON_VERSION, *self.renderer.base())}"

    def apply(self, changes: Changeset, layout: NetworkLayout = NO_NETWORKS) -> int:
        """Program one changeset (and the network model's `layout`, if it changed) as one
        atomic transaction; returns the command count."""
        ids = self.renderer.affinity_ids
        old, new = Rendered(), Rendered()
        delta: Counter[tuple[str, str]] = Counter()  # shared element -> change in holders
        for plan in (*changes.removed, *(before for before, _ in changes.updated)):
            r = self.renderer.render(plan)  # with the ids they were programmed with
            delta.subtract(r.shared)
            _merge_into(old, r)
        for plan in (*changes.added, *(after for _, after in changes.updated)):
            if _needs_id(plan):
                ids.assign(plan.id, _backend_set(plan))
        for plan in (*changes.added, *(after for _, after in changes.updated)):
            r = self.renderer.render(plan)
            delta.update(r.shared)
            _merge_into(new, r)
        networks = self._networks
        if layout != self._programmed_layout:
            networks = self.renderer.render_networks(layout)
            _merge_into(old, self._networks)
            _merge_into(new, networks)
        tx = Transaction()
        t = self.settings.table
        # 1. New sets and chains exist before anything refers to them.
        for name, spec in sorted(new.sets.items()):
            if name not in old.sets:
                tx.add(f"add set inet {t} {name} {{ {spec} }}")
        missing = new.needs - self._shared_chains
        full_only = sorted(n for n in missing if n.split("-")[0] in FULL_SYNC_ONLY)
        if full_only:
            raise FullSyncRequired(f"new shared chains needed: {', '.join(full_only)}")
        created = sorted(missing, key=_chain_order)
        tx.extend(self._chain_decl(name, None) for name in created)
        for name in created:
            self._add_rules(tx, name, self.renderer.shared_chain(name))
        changed = {n: r for n, r in new.chains.items() if old.chains.get(n) != r}
        for name in sorted(changed):
            tx.add(self._chain_decl(name, new.comments.get(name)))
        # 2. Chains whose rules changed: endpoint chains first, then what jumps to them.
        for name in sorted(changed, key=_chain_order):
            if name in old.chains:
                tx.add(f"flush chain inet {t} {name}")
            self._add_rules(tx, name, changed[name])
        # 3. Elements: obsolete ones out, then new ones in (a changed value is both).
        for container in sorted(old.elements.keys() | new.elements.keys()):
            before = old.elements.get(container, set())
            after = new.elements.get(container, set())
            delete = sorted({element_key(e) for e in before - after})
            if delete:
                tx.add(f"delete element inet {t} {container} {{ {', '.join(delete)} }}")
            add = sorted(after - before)
            if add:
                tx.add(f"add element inet {t} {container} {{ {', '.join(add)} }}")
        # 4. Shared elements appear with their first holder and go with their last.
        for shared, change in sorted(delta.items()):
            container, element = shared
            was = self._refs[shared] > 0
            now = self._refs[shared] + change > 0
            if was and not now:
                tx.add(f"delete element inet {t} {container} {{ {element} }}")
            elif now and not was:
                tx.add(f"add element inet {t} {container} {{ {element} }}")
        # 5. Chains and sets nothing refers to any more (shared chains stay: they are few).
        gone = sorted(old.chains.keys() - new.chains.keys(), key=_chain_order, reverse=True)
        tx.extend(f"flush chain inet {t} {name}" for name in gone)
        tx.extend(f"delete chain inet {t} {name}" for name in gone)
        for name in sorted(old.sets.keys() - new.sets.keys()):
            tx.add(f"delete set inet {t} {name}")
        self._apply(tx)
        self._networks, self._programmed_layout = networks, layout
        still = {after.id for _, after in changes.updated if _needs_id(after)}
        for plan in (*changes.removed, *(before for before, _ in changes.updated)):
            if _needs_id(plan) and plan.id not in still:
                ids.release(plan.id)
        self._shared_chains |= missing
        for shared, change in delta.items():
            count = self._refs[shared] + change
            if count > 0:
                self._refs[shared] = count
            else:
                del self._refs[shared]
        self._move_udp_flows(stale_udp_filters(changes))
        return len(tx)

    def _move_udp_flows(self, stale: StaleFlows) -> None:
        """Delete the stale UDP conntrack entries, once the replies in flight on those that
        leave an endpoint are rescued."""
        if self.conntrack is None or not stale:
            return
        self.rescue_udp_replies(stale.moved)
        self.conntrack.delete_udp([*stale.moved, *stale.untranslated])

    def rescue_udp_replies(self, moved: list[Filter]) -> list[UdpFlow]:
        """Rescue the replies in flight of the UDP flows these filters select, which are
        about to lose their translation: their conntrack entries deleted here, or in IPVS
        mode their real server (rescue.py). Returns the flows."""
        if self.conntrack is None or not moved:
            return []
        flows = self.conntrack.list_udp(moved)
        rescued = min(len(flows), rescue.LIMIT)
        tx = rescue.transaction(self.settings.table, flows)
        if tx:
            try:
                self.nft.apply(tx)
            except NftError as exc:
                rescued = 0
                log.warning("nftables: replies in flight of moved UDP flows not rescued: %s", exc)
        if flows and self._udp_flows_moved is not None:
            self._udp_flows_moved(rescued, len(flows) - rescued)
        return flows

    def node_addresses_changed(self, addresses: tuple[str, ...]) -> bool:
        """The node's own addresses changed; True when the next sync must be a full one.

        They are the NodePort addresses under nodePortAddresses "primary" (in the table's
        fixed part), and they decide whether loadBalancerSourceRanges let the node's own
        traffic in (plans' elements): the next full sync reads every element back.
        """
        if addresses == self.renderer.node_addresses:
            return False
        self.renderer.node_addresses = addresses
        self._trusted = False
        return True

    def cleanup(self) -> bool:
        """Remove everything this backend made (the whole table)."""
        return self.nft.delete_table(self.family, self.settings.table)

    def read_back(self) -> KernelState | None:
        """What the kernel holds in our table, for the CLI, adoption and tests."""
        state = self._read(elements=True)
        if state is not None:
            self._load(state, state.containers)
        return state

    def _chain_decl(self, name: str, comment: str | None) -> str:
        body = f' {{ comment "{comment}"; }}' if comment else ""
        return f"add chain inet {self.settings.table} {name}{body}"

    def _add_rules(self, tx: Transaction, chain: str, rules: Iterable[str]) -> None:
        """Each rule carries a hash of its text, so a read-back tells whether a chain's rules
        are the wanted ones (nft prints rules in a form of its own)."""
        t = self.settings.table
        tx.extend(f'add rule inet {t} {chain} {r} comment "{_rule_hash(r)}"' for r in rules)

    def _add_objects(self, tx: Transaction, r: Rendered) -> None:
        t = self.settings.table
        for name, spec in sorted(r.sets.items()):
            tx.add(f"add set inet {t} {name} {{ {spec} }}")
        for name in r.chains:
            tx.add(self._chain_decl(name, r.comments.get(name)))
        for name in sorted(r.chains, key=_chain_order):
            self._add_rules(tx, name, r.chains[name])
        for container, values in sorted(r.elements.items()):
            if values:
                tx.add(f"add element inet {t} {container} {{ {', '.join(sorted(values))} }}")


def _merge_into(acc: Rendered, r: Rendered) -> None:
    acc.chains.update(r.chains)
    acc.comments.update(r.comments)
    acc.sets.update(r.sets)
    acc.shared |= r.shared
    acc.needs |= r.needs
    for container, values in r.elements.items():
        acc.elements.setdefault(container, set()).update(values)


def _ordered(backends: Iterable[Any]) -> list[Any]:
    """Backends in a stable order, so that the same set always renders the same elements."""
    return sorted(backends, key=lambda b: (b.ip, b.port))


def _chain_order(name: str) -> tuple[int, str]:
    """Endpoint chains first, then policy chains, then the chains that jump to those."""
    rank = {"ep": 0, "svc": 1, "local": 1, "lb": 1, "npc": 1, "arec": 1, "ext": 2, "xl": 2}
    rank |= {"np": 2, "alb": 2, "anp": 2, "aext": 3}
    return rank.get(name.split("-", 1)[0], 9), name


def _collapsed(cidrs: Iterable[str]) -> list[str]:
    """CIDRs without overlaps (an interval set refuses them), per family."""
    nets = [ipaddress.ip_network(c, strict=False) for c in cidrs]
    out: list[str] = []
    for version in FAMILIES:
        mine = [n for n in nets if n.version == version]
        out += [str(n) for n in ipaddress.collapse_addresses(mine)]  # type: ignore[arg-type]
    return out


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


def _rule_hash(rule: str) -> str:
    return "r:" + hashlib.blake2b(rule.encode(), digest_size=6).hexdigest()


def _dynamic(container: str) -> bool:
    """State the packet path writes (clients' remembered endpoints): never diffed."""
    return container in KEPT or container.startswith("aff-")


def _canonical(element: str) -> tuple[tuple[object, ...], ...]:
    """An element's meaning, whichever way nft or the renderer spells it."""
    return tuple(
        tuple(_canonical_token(token) for token in side.split(" . "))
        for side in element.split(" : ", 1)
    )


def _canonical_token(token: str) -> object:
    try:
        return int(token, 0)
    except ValueError:
        pass
    try:
        if "/" in token:
            net = ipaddress.ip_network(token, strict=False)
            return (int(net.network_address), int(net.broadcast_address))
        first, sep, last = token.partition("-")
        if sep:
            return (int(ipaddress.ip_address(first)), int(ipaddress.ip_address(last)))
        address = int(ipaddress.ip_address(token))
        return (address, address)
    except ValueError:
        return token


def _kernel_affinity_ids(kernel: KernelState) -> dict[str, tuple[int, frozenset[tuple[str, int]]]]:
    """The affinity ids a previous process programmed, by frontend, each with the endpoints
    its frontends held (the clients' remembered endpoints, keyed by id, are among those)."""
    frontends: dict[int, list[str]] = {}
    for fam in FAMILIES:
        for container in (f"affinity-ids-v{fam}", f"affinity-nodeport-ids-v{fam}"):
            for element in kernel.elements.get(container, ()):
                key, _, value = element.partition(" : ")
                try:
                    frontends.setdefault(int(value, 0), []).append(key)
                except ValueError:
                    continue
    if not frontends:
        return {}
    endpoints: dict[str, set[tuple[str, int]]] = {}
    for fam in FAMILIES:
        for container in (f"endpoints-v{fam}", f"nodeport-endpoints-v{fam}"):
            for element in kernel.elements.get(container, ()):
                key, _, value = element.partition(" : ")
                ip, _, port = value.partition(" . ")
                if port.isdigit():
                    frontend = key.rpartition(" . ")[0]
                    endpoints.setdefault(frontend, set()).add((ip, int(port)))
    out = {}
    for value, keys in frontends.items():
        backends = frozenset().union(*(endpoints.get(k, set()) for k in keys))
        out.update((k, (value, backends)) for k in keys)
    return out


@dataclass
class KernelState:
    """Our table as the kernel reports it: chains (with rule counts and each rule's hash
    comment), maps and sets with their kind, and their elements in the renderer's text."""

    chains: dict[str, int]
    comments: dict[str, str]
    elements: dict[str, set[str]]
    rules: dict[str, list[str | None]] = field(default_factory=dict)
    containers: dict[str, str] = field(default_factory=dict)  # name -> "map" | "set"
    # Where `elements` are parsed from, when read.
    listing: TableListing | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> KernelState:
        comments: dict[str, str] = {}
        elements: dict[str, set[str]] = {}
        rules: dict[str, list[str | None]] = {}
        containers: dict[str, str] = {}
        for item in raw.get("nftables", []):
            if "chain" in item:
                rules.setdefault(item["chain"]["name"], [])
                if "comment" in item["chain"]:
                    comments[item["chain"]["name"]] = item["chain"]["comment"]
            elif "rule" in item:
                rules.setdefault(item["rule"]["chain"], []).append(item["rule"].get("comment"))
            elif "map" in item or "set" in item:
                kind = "map" if "map" in item else "set"
                obj = item[kind]
                containers[obj["name"]] = kind  # elements: read one by one (_read, _load)
        chains = {name: len(r) for name, r in rules.items()}
        return cls(chains, comments, elements, rules, containers)
