"""`lace-proxy cleanup --kube-proxy`: remove what kube-proxy leaves on a node.

kube-proxy's modes leave, in order of removal: jump rules from the built-in iptables chains
into its own KUBE-* chains, those chains (iptables and IPVS modes, through iptables-nft or
iptables-legacy, IPv4 and IPv6), its ipsets (IPVS mode), its IPVS virtual services and the
`kube-ipvs0` dummy interface (IPVS mode), and the `kube-proxy` tables of families ip and ip6
(nftables mode). kubelet's own chains (KUBE-FIREWALL, KUBE-MARK-DROP, KUBE-KUBELET-CANARY,
KUBE-IPTABLES-HINT) and anything not named as kube-proxy names it stay.

iptables state is read with `*-save` and changed with one `*-restore --noflush` per tool
(atomic per table). Nothing is run through a shell, and the chain names that reach the
restore input are checked against kube-proxy's names first.
"""

from __future__ import annotations

import errno
import logging
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field, replace

from pyroute2 import IPSet
from pyroute2.netlink.exceptions import NetlinkError

from lace_proxy.dataplane.ipvs import IpvsBackend, IpvsSettings
from lace_proxy.dataplane.ipvs.addresses import AddressChannel
from lace_proxy.dataplane.ipvs.model import ROUTE_PROTOCOL
from lace_proxy.dataplane.nft import Nft
from lace_proxy.dataplane.nftables.backend import NftablesBackend
from lace_proxy.dataplane.nftables.settings import NftablesSettings
from lace_proxy.dataplane.nftables.transaction import NftError

log = logging.getLogger(__name__)

#: Chains kube-proxy's iptables and IPVS modes make (kubelet makes KUBE-FIREWALL,
#: KUBE-MARK-DROP, KUBE-KUBELET-CANARY and KUBE-IPTABLES-HINT itself: not leftovers).
KUBE_PROXY_CHAINS = frozenset(
    {
        "KUBE-SERVICES",
        "KUBE-EXTERNAL-SERVICES",
        "KUBE-NODEPORTS",
        "KUBE-POSTROUTING",
        "KUBE-MARK-MASQ",
        "KUBE-FORWARD",
        "KUBE-PROXY-CANARY",
        "KUBE-PROXY-FIREWALL",
        "KUBE-LOAD-BALANCER",
        "KUBE-IPVS-FILTER",
        "KUBE-IPVS-OUT-FILTER",
    }
)
KUBE_PROXY_CHAIN_PREFIXES = ("KUBE-SVC-", "KUBE-SEP-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-")

#: kube-proxy's IPVS-mode ipsets, by name or prefix; IPv6 ones are the same after "KUBE-6-".
#: (kube-router's KUBE-SRC-*/KUBE-DST-* policy sets are not among them.)
KUBE_PROXY_IPSET_PREFIXES = (
    "KUBE-LOOP-BACK",
    "KUBE-CLUSTER-IP",
    "KUBE-CLUSTER-CIDR",
    "KUBE-EXTERNAL-IP",
    "KUBE-LOAD-BALANCER",
    "KUBE-NODE-PORT-",
    "KUBE-HEALTH-CHECK-NODE-PORT",
    "KUBE-IPVS-IPS",
    "KUBE-MASQ-ALL",
    "KUBE-SERVICE-ACCESS",
)

#: (save, restore) for each iptables flavour and family that kube-proxy may have used.
IPTABLES_TOOLS = (
    ("iptables-nft-save", "iptables-nft-restore"),
    ("ip6tables-nft-save", "ip6tables-nft-restore"),
    ("iptables-legacy-save", "iptables-legacy-restore"),
    ("ip6tables-legacy-save", "ip6tables-legacy-restore"),
)

KUBE_IPVS_INTERFACE = "kube-ipvs0"
NFT_TABLES = (("ip", "kube-proxy"), ("ip6", "kube-proxy"))

_NAME = re.compile(r"KUBE-[A-Za-z0-9_-]{1,24}")


def kube_proxy_chain(name: str) -> bool:
    """True for a chain name kube-proxy makes (and only a well-formed one)."""
    return bool(_NAME.fullmatch(name)) and (
        name in KUBE_PROXY_CHAINS or name.startswith(KUBE_PROXY_CHAIN_PREFIXES)
    )


def kube_proxy_ipset(name: str) -> bool:
    if not _NAME.fullmatch(name):
        return False
    base = "KUBE-" + name.removeprefix("KUBE-6-") if name.startswith("KUBE-6-") else name
    return base.startswith(KUBE_PROXY_IPSET_PREFIXES)


@dataclass
class Report:
    """What was removed, what was not there, and what failed (each a line for the operator)."""

    removed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def _target(rule: str) -> str | None:
    """The chain a saved rule jumps or goes to: its last -j/-g outside quotes (a comment may
    hold any text), or None."""
    try:
        words = shlex.split(rule)
    except ValueError:
        return None
    targets = [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-j", "-g")]
    return targets[-1] if targets else None


def restore_script(saved: str) -> tuple[str, int, int]:
    """From `*-save` output, the `*-restore --noflush` input that removes kube-proxy's
    chains and the rules of other chains that jump to them: (script, rules, chains)."""
    out: list[str] = []
    rules = chains = 0
    table: str | None = None
    kube: list[str] = []
    deletes: list[str] = []
    for line in saved.splitlines():
        if line.startswith("*"):
            table, kube, deletes = line[1:].strip(), [], []
        elif line.startswith(":") and table is not None:
            name = line[1:].split()[0]
            if kube_proxy_chain(name):
                kube.append(name)
        elif line.startswith("-A ") and table is not None:
            chain = line.split()[1]
            target = _target(line)
            if not kube_proxy_chain(chain) and target and kube_proxy_chain(target):
                deletes.append("-D" + line[2:])
        elif line.strip() == "COMMIT" and table is not None:
            if kube or deletes:
                out.append(f"*{table}")
                out.extend(deletes)
                out.extend(f"-F {name}" for name in kube)
                out.extend(f"-X {name}" for name in kube)
                out.append("COMMIT")
                rules += len(deletes)
                chains += len(kube)
            table = None
    return ("\n".join(out) + "\n" if out else ""), rules, chains


def _iptables(report: Report) -> None:
    for save, restore in IPTABLES_TOOLS:
        if shutil.which(save) is None or shutil.which(restore) is None:
            report.skipped.append(f"{save}: not installed")
            continue
        saved = subprocess.run([save], capture_output=True, text=True, check=False)
        if saved.returncode != 0:
            report.skipped.append(f"{save}: {saved.stderr.strip() or 'failed'}")
            continue
        script, rules, chains = restore_script(saved.stdout)
        if not script:
            report.skipped.append(f"{save.removesuffix('-save')}: no kube-proxy chains")
            continue
        done = subprocess.run(
            [restore, "--noflush"], input=script, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            report.failed.append(f"{restore}: {done.stderr.strip()}")
            continue
        report.removed.append(
            f"{save.removesuffix('-save')}: {chains} kube-proxy chains and {rules} jumps to them"
        )


def _ipsets(report: Report) -> None:
    """kube-proxy's ipsets; one still referenced by someone else's rule stays (reported)."""
    try:
        with IPSet() as ipset:
            names = [str(m.get_attr("IPSET_ATTR_SETNAME")) for m in ipset.list()]
            gone = 0
            for name in filter(kube_proxy_ipset, names):
                try:
                    ipset.destroy(name)
                    gone += 1
                except NetlinkError as exc:
                    report.failed.append(f"ipset {name}: {exc.args[-1]}")
    except (NetlinkError, OSError) as exc:
        report.skipped.append(f"ipsets: not available ({exc})")
        return
    if gone:
        report.removed.append(f"ipsets: {gone} of kube-proxy's")
    else:
        report.skipped.append("ipsets: none of kube-proxy's")


def _ipvs(report: Report) -> None:
    """Virtual services on kube-ipvs0's addresses and kube-proxy's NodePorts on the node's
    addresses, then kube-ipvs0. With lace-proxy's IPVS mode in place (lace-ipvs0, or its
    local routes), the NodePorts on node addresses are left to it: it owns that range too,
    and its next full sync rewrites them. lace-proxy's local routes are never kube-proxy's."""
    with AddressChannel() as channel:
        links = {link.name for link in channel.links()}
        if KUBE_IPVS_INTERFACE not in links:
            report.skipped.append(f"{KUBE_IPVS_INTERFACE}: not present")
            return
        lace_ipvs = IpvsSettings().interface in links or bool(channel.local_routes(ROUTE_PROTOCOL))
    settings = IpvsSettings(interface=KUBE_IPVS_INTERFACE, route_protocol=None)
    if lace_ipvs:
        settings = replace(settings, node_port_range=(1, 0))
    backend = IpvsBackend(settings, NftablesBackend(NftablesSettings(translate=False), Nft()))
    try:
        count = backend.remove_ipvs()
    except (NetlinkError, OSError) as exc:
        # pyroute2 says `code`, the IPVS channel (no IPVS family in this kernel) `errno`.
        code = exc.code if isinstance(exc, NetlinkError) else exc.errno
        if code not in (errno.ENOENT, errno.EOPNOTSUPP):
            report.failed.append(f"IPVS: {exc}")
            return
        count = 0  # no IPVS in the kernel: only the interface was there
    report.removed.append(f"{KUBE_IPVS_INTERFACE} and {count} IPVS virtual services")


def _nftables(report: Report, nft: Nft) -> None:
    for family, name in NFT_TABLES:
        try:
            gone = nft.delete_table(family, name)
        except NftError as exc:
            report.failed.append(f"nftables table {family} {name}: {exc}")
            continue
        target = report.removed if gone else report.skipped
        target.append(f"nftables table {family} {name}: {'removed' if gone else 'not present'}")


def remove_kube_proxy(nft: Nft | None = None) -> Report:
    """Remove kube-proxy's leftovers from this network namespace (see the module's doc)."""
    report = Report()
    _iptables(report)
    _ipsets(report)
    _ipvs(report)
    _nftables(report, nft or Nft())
    return report
