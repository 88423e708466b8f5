"""`doctor node`: whether this node is fit for lace-proxy. The kernel's features for the
mode, sysctls, MTUs against the other nodes' and kube-proxy's leftovers, read as data
(`read_node_facts`) and then judged (`diagnose_node`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lace_proxy.dataplane.ipvs import virtual_services
from lace_proxy.dataplane.netns import enter_netns
from lace_proxy.dataplane.nft import Nft
from lace_proxy.dataplane.nftables.transaction import NftError
from lace_proxy.dataplane.rtnetlink import RtnlChannel
from lace_proxy.doctor.severity import NOTE, OK, PROBLEM
from lace_proxy.egress.routing import read_snapshot
from lace_proxy.migration import kube_proxy_chain

#: Sysctls doctor node reads (/proc/sys/net of the reading thread's namespace).
NODE_SYSCTLS = (
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.rp_filter",
    "net.ipv4.conf.all.route_localnet",
    "net.netfilter.nf_conntrack_max",
    "net.netfilter.nf_conntrack_count",
)


@dataclass(frozen=True)
class NodeFacts:
    """What doctor node reads of the kernel, as data (`read_node_facts`)."""

    nft_error: str | None = None  # why `nft list tables` failed; None: nftables works
    tables: tuple[tuple[str, str], ...] = ()  # (family, name)
    kube_chains: tuple[str, ...] = ()  # "family table chain" of chains named KUBE-*
    sysctls: Mapping[str, int | None] = field(default_factory=dict)  # None: absent
    ipvs: bool = False  # /proc/net/ip_vs exists
    modules: frozenset[str] = frozenset()  # loaded or built-in kernel modules
    interfaces: tuple[tuple[str, int], ...] = ()  # (name, MTU)
    uplink: str | None = None  # the interface of the default route (IPv4, else IPv6)
    kube_ipvs0_services: int | None = None  # None: no kube-ipvs0; else IPVS services on it


@dataclass(frozen=True)
class Check:
    check: str
    status: str  # ok, problem, note
    message: str
    action: str = ""

    def to_dict(self) -> dict[str, str]:
        return {k: v for k, v in vars(self).items() if v}


@dataclass(frozen=True)
class NodeReport:
    mode: str
    checks: tuple[Check, ...]

    @property
    def exit_code(self) -> int:
        return 1 if any(c.status == PROBLEM for c in self.checks) else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "checks": [c.to_dict() for c in self.checks],
            "ok": self.exit_code == 0,
        }

    def to_text(self) -> str:
        lines = [f"mode         {self.mode}"]
        for c in self.checks:
            lines.append(f"{c.status:<12} {c.check}: {c.message}")
            if c.action:
                lines.append(f"{'':<12} what to do: {c.action}")
        return "\n".join(lines)


@dataclass(frozen=True)
class NodeSettingsView:
    """What doctor node needs of the configuration and the Node objects."""

    mode: str = "nftables"
    scheduler: str = "rr"
    pod_interface_prefix: str = ""
    node_mtus: Mapping[str, int] = field(default_factory=dict)  # other nodes' published MTUs
    own_mtu: int | None = None  # this node's published MTU (its Node's annotation)


def diagnose_node(facts: NodeFacts, s: NodeSettingsView) -> NodeReport:
    """Kernel features for the mode, sysctls, MTUs, and kube-proxy's leftovers."""
    checks = [_nftables(facts), _conntrack(facts)]
    if s.mode == "ipvs":
        checks += _ipvs(facts, s.scheduler)
    checks += _sysctls(facts)
    checks += _mtus(facts, s)
    checks += _leftovers(facts)
    return NodeReport(s.mode, tuple(checks))


def _nftables(facts: NodeFacts) -> Check:
    if facts.nft_error is not None:
        return Check(
            "nftables",
            PROBLEM,
            f"nftables does not answer: {facts.nft_error}",
            "install nftables (the nft binary) and load nf_tables (modprobe nf_tables)",
        )
    return Check("nftables", OK, f"nftables answers ({len(facts.tables)} tables)")


def _conntrack(facts: NodeFacts) -> Check:
    count = facts.sysctls.get("net.netfilter.nf_conntrack_count")
    limit = facts.sysctls.get("net.netfilter.nf_conntrack_max")
    if count is None or limit is None:
        return Check(
            "conntrack",
            NOTE,
            "connection tracking is not loaded yet (net.netfilter.nf_conntrack_max is missing;"
            " nftables loads it with the first rule that needs it)",
            "where modules cannot be loaded on demand: modprobe nf_conntrack (NAT and the "
            "service rules need it)",
        )
    if limit and count > 0.9 * limit:
        return Check(
            "conntrack",
            PROBLEM,
            f"the conntrack table is {count}/{limit} full: new connections will be dropped",
            "raise conntrack.maxPerCore / conntrack.min (or net.netfilter.nf_conntrack_max)",
        )
    return Check("conntrack", OK, f"{count} of {limit} conntrack entries in use")


def _ipvs(facts: NodeFacts, scheduler: str) -> list[Check]:
    if not facts.ipvs:
        return [
            Check(
                "ipvs",
                PROBLEM,
                "mode ipvs, but the kernel has no IPVS (/proc/net/ip_vs is missing)",
                "load ip_vs (modprobe ip_vs), or use mode nftables",
            )
        ]
    checks = [Check("ipvs", OK, "IPVS is loaded")]
    if f"ip_vs_{scheduler}" not in facts.modules:
        checks.append(
            Check(
                "ipvs_scheduler",
                NOTE,
                f"the scheduler module ip_vs_{scheduler} is not loaded yet (the kernel loads it "
                "with the first virtual service, where module loading is allowed)",
                f"modprobe ip_vs_{scheduler} where modules cannot be loaded on demand",
            )
        )
    return checks


def _sysctls(facts: NodeFacts) -> list[Check]:
    get = facts.sysctls.get
    checks = []
    if get("net.ipv4.ip_forward") != 1:
        checks.append(
            Check(
                "ip_forward",
                PROBLEM,
                f"net.ipv4.ip_forward is {get('net.ipv4.ip_forward')}: the node does not route "
                "pod or service traffic",
                "set net.ipv4.ip_forward=1",
            )
        )
    else:
        checks.append(Check("ip_forward", OK, "net.ipv4.ip_forward is 1"))
    keys = ["net.ipv4.conf.all.rp_filter"]
    if facts.uplink is not None:
        keys.append(f"net.ipv4.conf.{facts.uplink}.rp_filter")
    # The kernel applies the larger of `all` and the interface's own; 1 is strict.
    strict = [k for k in keys if get(k) == 1] if max(get(k) or 0 for k in keys) == 1 else []
    if strict:
        checks.append(
            Check(
                "rp_filter",
                NOTE,
                f"{' and '.join(strict)} strict (1): replies that come back another way than "
                "they left (through another node, a second uplink) are dropped",
                "use loose mode (2) where paths are asymmetric",
            )
        )
    if get("net.ipv4.conf.all.route_localnet") == 1:
        checks.append(
            Check(
                "route_localnet",
                NOTE,
                "net.ipv4.conf.all.route_localnet is 1 (kube-proxy sets it for NodePorts on "
                "127.0.0.1); lace-proxy does not serve NodePorts on loopback",
                "set it back to 0 unless something else needs it",
            )
        )
    return checks


def _mtus(facts: NodeFacts, s: NodeSettingsView) -> list[Check]:
    mtus = dict(facts.interfaces)
    if facts.uplink is None or facts.uplink not in mtus:
        return [Check("mtu", NOTE, "no default route: the uplink's MTU is unknown")]
    uplink = mtus[facts.uplink]
    checks = []
    if s.pod_interface_prefix:
        bigger = sorted(
            name
            for name, mtu in facts.interfaces
            if name.startswith(s.pod_interface_prefix) and mtu > uplink
        )
        if bigger:
            checks.append(
                Check(
                    "mtu",
                    PROBLEM,
                    f"pod interfaces {', '.join(bigger)} have a larger MTU than the uplink "
                    f"{facts.uplink} ({uplink}): large packets leaving the node are fragmented "
                    "or dropped",
                    f"set the pod network's MTU to {uplink} or less (the CNI's MTU setting)",
                )
            )
    if s.own_mtu is not None and s.own_mtu != uplink:
        checks.append(
            Check(
                "mtu",
                PROBLEM,
                f"this node's Node object says MTU {s.own_mtu}, its uplink {facts.uplink} has "
                f"{uplink}",
                "fix the interface's MTU, or the CNI's published value",
            )
        )
    others = {name: mtu for name, mtu in s.node_mtus.items() if mtu != uplink}
    if others:
        listed = ", ".join(f"{n} {m}" for n, m in sorted(others.items()))
        checks.append(
            Check(
                "mtu",
                PROBLEM,
                f"other nodes' MTUs differ from this node's uplink ({uplink}): {listed}; "
                "traffic between them is fragmented or dropped",
                "give every node's pod network uplink the same MTU",
            )
        )
    if not checks:
        checks.append(Check("mtu", OK, f"uplink {facts.uplink} MTU {uplink}, consistent"))
    return checks


def _leftovers(facts: NodeFacts) -> list[Check]:
    checks = []
    cleanup = "stop kube-proxy, then run `lace-proxy cleanup --kube-proxy` on this node"
    kube_tables = [f"{f} {n}" for f, n in facts.tables if n == "kube-proxy"]
    if kube_tables:
        checks.append(
            Check(
                "kube_proxy_nftables",
                PROBLEM,
                f"kube-proxy's nftables tables are here ({', '.join(kube_tables)}): their "
                "rules would translate service traffic before lace-proxy's",
                cleanup,
            )
        )
    if facts.kube_chains:
        shown = ", ".join(facts.kube_chains[:5]) + (" …" if len(facts.kube_chains) > 5 else "")
        checks.append(
            Check(
                "kube_proxy_iptables",
                PROBLEM,
                f"kube-proxy's iptables chains are here ({len(facts.kube_chains)}: {shown})",
                cleanup,
            )
        )
    if facts.kube_ipvs0_services is not None:
        checks.append(
            Check(
                "kube_ipvs0",
                PROBLEM,
                f"kube-proxy's kube-ipvs0 interface is here, with {facts.kube_ipvs0_services} "
                "IPVS virtual services on its addresses: it answers for the service addresses",
                cleanup,
            )
        )
    if not checks:
        checks.append(Check("kube_proxy", OK, "no kube-proxy leftovers"))
    return checks


def read_node_facts(nft: Nft, netns: str | None = None) -> NodeFacts:
    """Read what doctor node checks, in `netns` (a thread enters it) or here; changes nothing."""
    if netns is None:
        return _read_facts(nft)
    with ThreadPoolExecutor(1) as worker:
        return worker.submit(_read_facts_in, netns, nft).result()


def _read_facts_in(name: str, nft: Nft) -> NodeFacts:
    enter_netns(name)  # the worker thread dies with the pool
    return _read_facts(nft)


def _read_facts(nft: Nft) -> NodeFacts:
    nft_error, tables, chains = None, [], []
    try:
        for item in nft.ruleset().get("nftables", []):
            if "table" in item:
                tables.append((item["table"]["family"], item["table"]["name"]))
            elif "chain" in item and kube_proxy_chain(str(item["chain"]["name"])):
                c = item["chain"]
                chains.append(f"{c['family']} {c['table']} {c['name']}")
    except (NftError, OSError) as exc:
        nft_error = str(exc)
    ipvs = Path("/proc/thread-self/net/ip_vs").exists()
    with RtnlChannel() as rtnl:
        snapshot = read_snapshot(rtnl)
        dummy = next((link.ifindex for link in rtnl.links() if link.name == "kube-ipvs0"), None)
        on_it = {a for _, a in rtnl.addresses(dummy)} if dummy is not None else set()
    default = snapshot.lookup("0.0.0.0") or snapshot.lookup("::")
    uplink = default.interface if default and default.network.prefixlen == 0 else None
    keys = [*NODE_SYSCTLS, *([f"net.ipv4.conf.{uplink}.rp_filter"] if uplink else [])]
    sysctls = {key: _sysctl(key) for key in keys}
    kube_ipvs0 = None
    if dummy is not None:
        kube_ipvs0 = sum(vs.address in on_it for vs in virtual_services()) if ipvs else 0
    return NodeFacts(
        nft_error,
        tuple(tables),
        tuple(chains),
        sysctls,
        ipvs,
        _modules(),
        snapshot.mtus,
        uplink,
        kube_ipvs0,
    )


def _sysctl(key: str) -> int | None:
    head, _, rest = key.partition(".conf.")
    if rest:  # an interface's name may hold dots itself (eth0.100)
        name, _, leaf = rest.rpartition(".")
        path = Path("/proc/sys", head.replace(".", "/"), "conf", name, leaf)
    else:
        path = Path("/proc/sys", key.replace(".", "/"))
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _modules() -> frozenset[str]:
    """Loaded modules, and those built into the running kernel."""
    names = set()
    with contextlib.suppress(OSError):
        names |= {line.split()[0] for line in Path("/proc/modules").read_text().splitlines()}
    builtin = Path("/lib/modules", os.uname().release, "modules.builtin")
    with contextlib.suppress(OSError):
        names |= {Path(line).name.removesuffix(".ko") for line in builtin.read_text().splitlines()}
    return frozenset(names)
