"""The nftables backend: plans in, nf_tables objects out, one atomic transaction per sync.

The layout follows kube-proxy's nftables mode so operators can read it:

- dispatch is O(1): verdict maps keyed by `address . protocol . port` (`service-ips-v4`,
  `no-endpoint-services-v4`, `firewall-ips-v4`) and `protocol . port` for NodePorts;
- each service port has a cluster policy chain `svc-*` (and `local-*` for Local policies,
  `ext-*` for external traffic, `fw-*` for loadBalancerSourceRanges) that picks an
  endpoint chain `ep-*` at random (`numgen random`), or by ClientIP affinity first;
- an endpoint chain marks hairpin traffic for masquerade, records affinity, and DNATs;
- reject/drop for services without (local) endpoints happen in filter chains, before
  routing, because a DNAT never happens for them.

Chain names are hashes of the plan id (object names never reach nft as identifiers); the
plan id is attached as the chain's comment when it is made of safe characters only.
Rendering is deterministic, so the objects a plan produced can be recomputed from the
plan: an update diffs old against new and touches only what changed.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from lace_proxy.dataplane.conntrack import Conntrack, stale_udp_filters
from lace_proxy.dataplane.nft import Nft, Transaction
from lace_proxy.table import Changeset

SAFE_COMMENT = re.compile(r"^[A-Za-z0-9._:/-]{1,128}$")
TABLE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")
FAMILIES = (4, 6)


@dataclass(frozen=True)
class NftablesSettings:
    """What the backend needs from the configuration."""

    table: str = "lace-proxy"
    masquerade_all: bool = False
    masquerade_bit: int = 14
    cluster_cidrs: tuple[str, ...] = ()  # pod CIDRs: sources inside them are not masqueraded
    node_port_cidrs: tuple[str, ...] = ()  # empty: NodePorts on every local address

    def __post_init__(self) -> None:
        if not TABLE_NAME.match(self.table):
            raise ValueError(f"invalid nftables table name {self.table!r}")
        if not 0 <= self.masquerade_bit <= 31:
            raise ValueError(f"masqueradeBit {self.masquerade_bit} is not in 0-31")
        for cidr in (*self.cluster_cidrs, *self.node_port_cidrs):
            ipaddress.ip_network(cidr, strict=False)  # raises ValueError on bad input


def _h(*parts: object) -> str:
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

    def element(self, container: str, value: str) -> None:
        self.elements.setdefault(container, set()).add(value)


class Renderer:
    """Turns a plan into nf_tables objects, deterministically."""

    def __init__(self, settings: NftablesSettings) -> None:
        self.s = settings
        self._has_cluster_cidrs = {
            f: bool(self._cidrs(settings.cluster_cidrs, f)) for f in FAMILIES
        }

    def render(self, plan: Any) -> Rendered:
        out = Rendered()
        fam = plan.family
        ip = _ip(fam)
        v = f"v{fam}"
        proto = plan.protocol.lower()
        h = _h(plan.id)
        affinity = plan.affinity_timeout

        ep_chains: dict[tuple[str, int], str] = {}
        for b in (*plan.cluster_backends, *plan.local_backends):
            ident = (b.ip, b.port)
            if ident in ep_chains:
                continue
            name = f"ep-{_h(plan.id, b.ip, b.port)}"
            ep_chains[ident] = name
            rules = [f"{ip} saddr {b.ip} jump mark-for-masquerade"]
            if affinity:
                aff = f"aff-{name[3:]}"
                out.sets[aff] = (
                    f"type {_addr_type(fam)}; flags dynamic,timeout; timeout {affinity}s;"
                )
                rules.append(f"update @{aff} {{ {ip} saddr }}")
            rules.append(f"meta l4proto {proto} dnat {ip} to {_dnat_target(b.ip, b.port, fam)}")
            out.chains[name] = tuple(rules)

        def policy_chain(name: str, backends: tuple[Any, ...]) -> None:
            rules: list[str] = []
            targets = [ep_chains[(b.ip, b.port)] for b in backends]
            if affinity:
                rules.extend(f"{ip} saddr @aff-{t[3:]} goto {t}" for t in targets)
            if len(targets) == 1:
                rules.append(f"goto {targets[0]}")
            else:
                vmap = ", ".join(f"{i} : goto {t}" for i, t in enumerate(targets))
                rules.append(f"numgen random mod {len(targets)} vmap {{ {vmap} }}")
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
            return out
        ext = None
        if plan.external_verdict is None:
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
        if plan.lb_ips and plan.lb_source_ranges and not _allows_all(plan.lb_source_ranges):
            fw = f"fw-{h}"
            ranges = ", ".join(plan.lb_source_ranges)
            out.chains[fw] = (f"{ip} saddr != {{ {ranges} }} drop",)
            for address in plan.lb_ips:
                out.element(f"firewall-ips-{v}", f"{address} . {key} : goto {fw}")
        return out

    @staticmethod
    def _verdict(plan: Any, external: bool = False) -> str:
        verdict = plan.external_verdict if external else plan.internal_verdict
        return "goto reject-chain" if verdict in (None, "reject") else "drop"

    def base(self) -> list[str]:
        """The table's fixed skeleton: base chains, helper chains, maps and sets."""
        t = self.s.table
        mark = 1 << self.s.masquerade_bit
        lines = [f"table inet {t} {{"]
        for fam in FAMILIES:
            v = f"v{fam}"
            at = _addr_type(fam)
            lines += [
                f"  map service-ips-{v} {{ type {at} . inet_proto . inet_service : verdict; }}",
                f"  map no-endpoint-services-{v} {{ type {at} . inet_proto . inet_service"
                " : verdict; }",
                f"  map firewall-ips-{v} {{ type {at} . inet_proto . inet_service : verdict; }}",
                f"  map service-nodeports-{v} {{ type inet_proto . inet_service : verdict; }}",
                f"  map no-endpoint-nodeports-{v} {{ type inet_proto . inet_service : verdict; }}",
                f"  set cluster-ips-{v} {{ type {at}; }}",
                f"  set cluster-cidrs-{v} {{ type {at}; flags interval; {self._elements(fam, 1)}}}",
                f"  set nodeport-cidrs-{v} {{ type {at}; flags interval; "
                f"{self._elements(fam, 2)}}}",
            ]
        lines += [
            "  chain mark-for-masquerade {",
            f"    meta mark set meta mark | {mark:#x}",
            "  }",
            "  chain masquerading {",
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
        lines += ["  }", "  chain nodeport-endpoints-check {"]
        for fam in FAMILIES:
            lines.append(
                f"    {self._nodeport_match(fam)} meta l4proto . th dport"
                f" vmap @no-endpoint-nodeports-v{fam}"
            )
        lines += ["  }", "  chain firewall-check {"]
        for fam in FAMILIES:
            ip, v = _ip(fam), f"v{fam}"
            lines.append(f"    {ip} daddr . meta l4proto . th dport vmap @firewall-ips-{v}")
        lines += ["  }", "  chain cluster-ips-check {"]
        for fam in FAMILIES:
            ip, v = _ip(fam), f"v{fam}"
            # A ClusterIP answers only on its service ports: anything else is refused.
            lines.append(f"    {ip} daddr @cluster-ips-{v} goto reject-chain")
        lines += [
            "  }",
            "  chain filter-prerouting {",
            "    type filter hook prerouting priority -110; policy accept;",
            "    ct state new jump firewall-check",
            "  }",
            "  chain filter-input {",
            "    type filter hook input priority -110; policy accept;",
            "    ct state new jump nodeport-endpoints-check",
            "    ct state new jump service-endpoints-check",
            "  }",
            "  chain filter-forward {",
            "    type filter hook forward priority -110; policy accept;",
            "    ct state new jump service-endpoints-check",
            "    ct state new jump cluster-ips-check",
            "  }",
            "  chain filter-output {",
            "    type filter hook output priority -110; policy accept;",
            "    ct state new jump service-endpoints-check",
            "    ct state new jump firewall-check",
            "  }",
            "  chain filter-output-post-dnat {",
            "    type filter hook output priority -90; policy accept;",
            "    ct state new jump cluster-ips-check",
            "  }",
            "  chain nat-prerouting {",
            "    type nat hook prerouting priority dstnat; policy accept;",
            "    jump services",
            "  }",
            "  chain nat-output {",
            "    type nat hook output priority -100; policy accept;",
            "    jump services",
            "  }",
            "  chain nat-postrouting {",
            "    type nat hook postrouting priority srcnat; policy accept;",
            "    jump masquerading",
            "  }",
            "}",
        ]
        return lines

    def _elements(self, family: int, which: int) -> str:
        mine = self._cidrs(self.s.cluster_cidrs if which == 1 else self.s.node_port_cidrs, family)
        return f"elements = {{ {', '.join(mine)} }}; " if mine else ""

    @staticmethod
    def _cidrs(cidrs: tuple[str, ...], family: int) -> list[str]:
        nets = (ipaddress.ip_network(c, strict=False) for c in cidrs)
        return [str(n) for n in nets if n.version == family]

    def _nodeport_match(self, family: int) -> str:
        ip = _ip(family)
        loopback = "127.0.0.0/8" if family == 4 else "::1"
        match = f"meta nfproto ipv{family} fib daddr type local {ip} daddr != {loopback}"
        if self.s.node_port_cidrs:
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
    ) -> None:
        self.settings = settings
        self.nft = nft or Nft()
        self.conntrack = conntrack
        self.renderer = Renderer(settings)
        self._refs: Counter[tuple[int, str]] = Counter()  # (family, ClusterIP) -> plans

    @property
    def table(self) -> str:
        return self.settings.table

    def full_sync(self, plans: Iterable[Any]) -> int:
        """Replace the whole table atomically with these plans; returns the command count.

        Used for the first sync and the periodic reconcile: `add table; delete table;
        table {...}` in one batch, so there is no moment without rules.
        """
        tx = Transaction()
        t = self.settings.table
        tx.add(f"add table inet {t}")
        tx.add(f"delete table inet {t}")
        tx.extend(self.renderer.base())
        merged = Rendered()
        refs: Counter[tuple[int, str]] = Counter()
        for plan in plans:
            refs[(plan.family, plan.cluster_ip)] += 1
            r = self.renderer.render(plan)
            merged.chains.update(r.chains)
            merged.comments.update(r.comments)
            merged.sets.update(r.sets)
            for container, values in r.elements.items():
                merged.elements.setdefault(container, set()).update(values)
        for family, ip in refs:
            merged.element(f"cluster-ips-v{family}", ip)
        self._add_objects(tx, merged)
        self.nft.apply(tx)
        self._refs = refs
        return len(tx)

    def apply(self, changes: Changeset) -> int:
        """Program one changeset as one atomic transaction; returns the command count."""
        old, new = Rendered(), Rendered()
        for plan in changes.removed:
            _merge_into(old, self.renderer.render(plan))
        for plan in changes.added:
            _merge_into(new, self.renderer.render(plan))
        for before, after in changes.updated:
            _merge_into(old, self.renderer.render(before))
            _merge_into(new, self.renderer.render(after))
        tx = Transaction()
        t = self.settings.table
        # 1. New sets and chains exist before anything refers to them.
        for name, spec in sorted(new.sets.items()):
            if name not in old.sets:
                tx.add(f"add set inet {t} {name} {{ {spec} }}")
        changed = {n: r for n, r in new.chains.items() if old.chains.get(n) != r}
        for name in sorted(changed):
            tx.add(self._chain_decl(name, new.comments.get(name)))
        # 2. Chains whose rules changed: endpoint chains first, then what jumps to them.
        for name in sorted(changed, key=_chain_order):
            if name in old.chains:
                tx.add(f"flush chain inet {t} {name}")
            tx.extend(f"add rule inet {t} {name} {rule}" for rule in changed[name])
        # 3. Elements: obsolete ones out, then new ones in (a changed value is both).
        for container in sorted(old.elements.keys() | new.elements.keys()):
            before = old.elements.get(container, set())
            after = new.elements.get(container, set())
            delete = sorted({_key(e) for e in before - after})
            if delete:
                tx.add(f"delete element inet {t} {container} {{ {', '.join(delete)} }}")
            add = sorted(after - before)
            if add:
                tx.add(f"add element inet {t} {container} {{ {', '.join(add)} }}")
        self._cluster_ip_changes(tx, changes)
        # 4. Chains and sets nothing refers to any more.
        for name in sorted(old.chains.keys() - new.chains.keys(), key=_chain_order, reverse=True):
            tx.add(f"flush chain inet {t} {name}")
        for name in sorted(old.chains.keys() - new.chains.keys(), key=_chain_order, reverse=True):
            tx.add(f"delete chain inet {t} {name}")
        for name in sorted(old.sets.keys() - new.sets.keys()):
            tx.add(f"delete set inet {t} {name}")
        self.nft.apply(tx)
        if self.conntrack is not None:
            self.conntrack.delete_udp(stale_udp_filters(changes))
        return len(tx)

    def _cluster_ip_changes(self, tx: Transaction, changes: Changeset) -> None:
        """Keep `cluster-ips-v*` in step: a ClusterIP stays while any of its ports has a plan."""
        before = dict(self._refs)
        for plan in (*changes.removed, *(old for old, _ in changes.updated)):
            self._refs[(plan.family, plan.cluster_ip)] -= 1
        for plan in (*changes.added, *(new for _, new in changes.updated)):
            self._refs[(plan.family, plan.cluster_ip)] += 1
        t = self.settings.table
        for ref in sorted(self._refs.keys() | before.keys()):
            was, now = before.get(ref, 0) > 0, self._refs[ref] > 0
            if was and not now:
                tx.add(f"delete element inet {t} cluster-ips-v{ref[0]} {{ {ref[1]} }}")
            elif now and not was:
                tx.add(f"add element inet {t} cluster-ips-v{ref[0]} {{ {ref[1]} }}")
        for ref in [r for r, n in self._refs.items() if n <= 0]:
            del self._refs[ref]

    def cleanup(self) -> bool:
        """Remove everything this backend made (the whole table)."""
        return self.nft.delete_table(self.family, self.settings.table)

    def read_back(self) -> KernelState | None:
        """What the kernel holds in our table, for the CLI, adoption and tests."""
        raw = self.nft.list_table(self.family, self.settings.table)
        return None if raw is None else KernelState.from_json(raw)

    def _chain_decl(self, name: str, comment: str | None) -> str:
        body = f' {{ comment "{comment}"; }}' if comment else ""
        return f"add chain inet {self.settings.table} {name}{body}"

    def _add_objects(self, tx: Transaction, r: Rendered) -> None:
        t = self.settings.table
        for name, spec in sorted(r.sets.items()):
            tx.add(f"add set inet {t} {name} {{ {spec} }}")
        for name in r.chains:
            tx.add(self._chain_decl(name, r.comments.get(name)))
        for name in sorted(r.chains, key=_chain_order):
            tx.extend(f"add rule inet {t} {name} {rule}" for rule in r.chains[name])
        for container, values in sorted(r.elements.items()):
            if values:
                tx.add(f"add element inet {t} {container} {{ {', '.join(sorted(values))} }}")


def _merge_into(acc: Rendered, r: Rendered) -> None:
    acc.chains.update(r.chains)
    acc.comments.update(r.comments)
    acc.sets.update(r.sets)
    for container, values in r.elements.items():
        acc.elements.setdefault(container, set()).update(values)


def _chain_order(name: str) -> tuple[int, str]:
    """Endpoint chains first, then policy chains, then the chains that jump to those."""
    rank = {"ep": 0, "svc": 1, "local": 1, "ext": 2, "fw": 3}
    return rank.get(name.split("-", 1)[0], 9), name


def _allows_all(ranges: tuple[str, ...]) -> bool:
    """A /0 range lets every source in, as kube-proxy treats it: no firewall at all."""
    return any(r.endswith("/0") for r in ranges)


def _key(element: str) -> str:
    return element.split(" : ", 1)[0]


@dataclass
class KernelState:
    """Our table as the kernel reports it: chains (with rule counts) and map/set elements."""

    chains: dict[str, int]
    comments: dict[str, str]
    elements: dict[str, set[str]]

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> KernelState:
        chains: dict[str, int] = {}
        comments: dict[str, str] = {}
        elements: dict[str, set[str]] = {}
        for item in raw.get("nftables", []):
            if "chain" in item:
                chains.setdefault(item["chain"]["name"], 0)
                if "comment" in item["chain"]:
                    comments[item["chain"]["name"]] = item["chain"]["comment"]
            elif "rule" in item:
                chains[item["rule"]["chain"]] = chains.get(item["rule"]["chain"], 0) + 1
            elif "map" in item or "set" in item:
                obj = item.get("map") or item.get("set")
                elements[obj["name"]] = {_render_json(e) for e in obj.get("elem", [])}
        return cls(chains, comments, elements)


def _render_json(element: Any) -> str:
    """A map/set element from nft's JSON in the text form the renderer writes."""
    if isinstance(element, list) and len(element) == 2 and isinstance(element[1], dict):
        return f"{_render_json(element[0])} : {_render_verdict(element[1])}"
    if isinstance(element, dict):
        if "concat" in element:
            return " . ".join(_render_json(p) for p in element["concat"])
        if "prefix" in element:
            return f"{element['prefix']['addr']}/{element['prefix']['len']}"
        if "elem" in element:
            return _render_json(element["elem"]["val"])
    return str(element)


def _render_verdict(verdict: dict[str, Any]) -> str:
    if "goto" in verdict:
        return f"goto {verdict['goto']['target']}"
    if "jump" in verdict:
        return f"jump {verdict['jump']['target']}"
    return next(iter(verdict))
