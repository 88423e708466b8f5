"""`lace-proxy doctor egress` and `doctor node`: what breaks a pod's egress, or this node.

The checks are `lace_proxy.doctor`'s; this module gathers what they read (configuration,
--manifests, the kernel's state). The handlers import the modules that do so, so that
`--help` stays fast.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys
from typing import TYPE_CHECKING

from lace_proxy.cli.common import Commands, add_netns_flag, add_output_flag, netns_problem
from lace_proxy.config import ConfigError, ProxyConfig, add_config_flags, config_from_args

if TYPE_CHECKING:
    from lace_proxy.doctor import EgressReport, NodeReport
    from lace_proxy.model import LoadResult


def register(commands: Commands) -> None:
    """Add `doctor` and its checks, `egress` and `node`."""
    doctor = commands.add_parser(
        "doctor",
        help="find what breaks a pod's egress, or this node (doctor egress | node)",
        description="Diagnose this node: `doctor egress` for one pod's traffic out of the "
        "cluster, `doctor node` for the kernel, sysctls, MTUs and kube-proxy's leftovers.",
    )
    checks = doctor.add_subparsers(dest="check", metavar="CHECK", required=True)
    egress = checks.add_parser(
        "egress",
        help="the route, the source the far end sees, and why the return path may fail",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
For a new connection from a pod of this node to DEST, read this node's routing table (or
--netns's) as the egress SNAT does and tell:

  route        the route the node selects (main table, longest prefix, lowest metric)
  source       the address DEST will see: the route's preferred source when lace-proxy
               source-NATs it (a pod: in clusterCIDR or a Lace pod network of
               --manifests; a destination outside them and
               lace.egress.nonMasqueradeCIDRs, not routed out of a pod interface:
               detectLocal.interfaceNamePrefix or routing a pod prefix on-link),
               else the pod's own. A connection to a Service that the proxy sends
               to DEST is not egress: the egress SNAT leaves it, and the proxy
               masquerades it or not as kube-proxy would (clusterCIDR, masqueradeAll)
  findings     no_route; dropped_by_route (a blackhole/unreachable/prohibit route);
               source_not_routable (outside lace.egress.routablePrefixes);
               next_hop_is_a_node (another cluster node forwards without re-sourcing;
               nodes from the Node objects in --manifests); mtu_mismatch (the pod's
               interface MTU above the path's); notes: not_a_pod_address,
               pod_not_on_this_node. Each says what to do.""",
        epilog="""examples:
  lace-proxy doctor egress --pod 10.251.1.11 --to 198.18.0.10 --config proxy.yaml
  lace-proxy doctor egress --pod 10.251.1.11 --to 203.0.113.10 --manifests DIR -o json

exit codes:
  0  the return path can work
  1  a problem was found (see findings)
  2  bad input (addresses, options, configuration)""",
    )
    egress.add_argument(
        "--pod", required=True, metavar="IP", help="the pod's address, e.g. 10.251.1.11"
    )
    egress.add_argument(
        "--to", required=True, metavar="DEST", help="the destination address, e.g. 198.18.0.10"
    )
    add_config_flags(egress)
    add_output_flag(egress, "text", "json", help_text="text (default) or json")
    add_netns_flag(egress, "read this named network namespace's routes")
    egress.set_defaults(func=cmd_doctor_egress)
    node = checks.add_parser(
        "node",
        help="kernel features, sysctls, MTUs and kube-proxy's leftovers",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Check whether this node (or --netns's) is fit for lace-proxy in the configured mode:

  nftables         the nft binary answers (nf_tables loaded)
  conntrack        connection tracking present, and its table not nearly full
  ipvs             mode ipvs: IPVS loaded; note when the scheduler's module is not yet
  ip_forward       net.ipv4.ip_forward is 1; notes: strict rp_filter (asymmetric paths
                   dropped), route_localnet left on by kube-proxy
  mtu              pod interfaces (detectLocal.interfaceNamePrefix) not above the uplink's
                   MTU (the default route's interface); this node's and the other nodes'
                   published MTU (Node annotation lace-cni.io/mtu, from --manifests) equal
                   to it
  kube_proxy_*     kube-proxy's leftovers that would fight lace-proxy: its nftables
                   tables, its iptables chains (KUBE-*, as iptables-nft shows them), and
                   kube-ipvs0 with its IPVS services

Reads only; changes nothing.""",
        epilog="""examples:
  lace-proxy doctor node --config proxy.yaml
  lace-proxy doctor node --proxy-mode ipvs --manifests DIR -o json

exit codes:
  0  nothing wrong (notes may be listed)
  1  a problem was found
  2  bad input (options, configuration)""",
    )
    add_config_flags(node)
    add_output_flag(node, "text", "json", help_text="text (default) or json")
    add_netns_flag(node, "check this named network namespace")
    node.set_defaults(func=cmd_doctor_node)


class _DoctorInputError(Exception):
    """Bad input for `doctor`: exit code 2 with this message."""


def _doctor_inputs(args: argparse.Namespace) -> tuple[ProxyConfig, LoadResult | None]:
    """The configuration and --manifests (if given) a doctor check reads."""
    from lace_proxy.model import load_manifests

    if (problem := netns_problem(args.netns)) is not None:
        raise _DoctorInputError(problem)
    try:
        cfg = config_from_args(args)
    except ConfigError as exc:
        raise _DoctorInputError(exc) from exc
    if not cfg.lace.manifests:
        return cfg, None
    try:
        return cfg, load_manifests(cfg.lace.manifests)
    except FileNotFoundError as exc:
        raise _DoctorInputError(f"manifests: no such file or folder: {cfg.lace.manifests}") from exc


def _doctor_output(report: EgressReport | NodeReport, output: str) -> int:
    """The report as text or JSON; its exit code."""
    if output == "json":
        json.dump(report.to_dict(), sys.stdout, indent=2)
        print()
    else:
        print(report.to_text())
    return report.exit_code


def cmd_doctor_egress(args: argparse.Namespace) -> int:
    """One pod's egress to DEST: exit code 0 the return path can work, 1 not, 2 bad input."""
    from lace_proxy.app import egress_settings
    from lace_proxy.dataplane.rtnetlink import RtnlChannel
    from lace_proxy.doctor import EgressSettingsView, diagnose_egress
    from lace_proxy.egress.routing import read_snapshot
    from lace_proxy.networks.graph import NetworkGraph

    def bad(message: object) -> int:
        print(f"lace-proxy: doctor egress: {message}", file=sys.stderr)
        return 2

    try:
        pod_ip, to_ip = ipaddress.ip_address(args.pod), ipaddress.ip_address(args.to)
        cfg, loaded = _doctor_inputs(args)
    except (ValueError, _DoctorInputError) as exc:
        return bad(exc)
    if pod_ip.version != to_ip.version:
        return bad(f"--pod {pod_ip} and --to {to_ip} are of different IP families")
    pod, to = str(pod_ip), str(to_ip)
    nodes: dict[str, list[str]] = {}
    pod_networks: list[str] = []
    node_pod_cidrs: tuple[str, ...] = ()
    if loaded is not None:
        nodes = {
            name: [a for _, a in node.addresses]
            for name, node in loaded.nodes.items()
            if name != cfg.hostname_override
        }
        if (this := loaded.nodes.get(cfg.hostname_override)) is not None:
            node_pod_cidrs = this.pod_cidrs
        layout = NetworkGraph(loaded.lace.values()).layout()
        pod_networks = [prefix for prefix, _ in layout.pod_prefixes]
    try:
        snat = egress_settings(cfg)  # as `run` programs it, plus the pod networks it is told
    except ValueError as exc:  # an interface prefix nft cannot take
        return bad(exc)
    view = EgressSettingsView(
        enabled=cfg.lace.egress.enabled,
        pod_cidrs=(*snat.pod_cidrs, *pod_networks),
        non_masquerade_cidrs=snat.non_masquerade_cidrs,
        routable_prefixes=tuple(str(n) for n in cfg.lace.egress.routable_prefixes),
        pod_interface_prefix=snat.pod_interface_prefix,
        node_pod_cidrs=node_pod_cidrs,
    )
    try:
        with RtnlChannel(netns=args.netns or None) as rtnl:
            snapshot = read_snapshot(rtnl)
    except OSError as exc:
        return bad(f"cannot read the routing table: {exc}")
    return _doctor_output(diagnose_egress(snapshot, view, pod, to, nodes), args.output)


def cmd_doctor_node(args: argparse.Namespace) -> int:
    """This node's fitness for the configured mode: exit code 0 fine, 1 not, 2 bad input."""
    from lace_proxy.dataplane.nft import Nft
    from lace_proxy.doctor import NodeSettingsView, diagnose_node, read_node_facts

    def bad(message: object) -> int:
        print(f"lace-proxy: doctor node: {message}", file=sys.stderr)
        return 2

    try:
        cfg, loaded = _doctor_inputs(args)
    except _DoctorInputError as exc:
        return bad(exc)
    published = {name: n.mtu for name, n in (loaded.nodes if loaded else {}).items() if n.mtu}
    view = NodeSettingsView(
        mode=cfg.mode,
        scheduler=cfg.ipvs.scheduler,
        pod_interface_prefix=cfg.detect_local.interface_name_prefix,
        node_mtus={n: m for n, m in published.items() if n != cfg.hostname_override},
        own_mtu=published.get(cfg.hostname_override),
    )
    try:
        facts = read_node_facts(Nft(args.netns), args.netns)
    except Exception as exc:  # e.g. not root: no setns, no netlink, no nft
        return bad(f"cannot read the node's state (run as root): {exc}")
    return _doctor_output(diagnose_node(facts, view), args.output)
