"""`lace-proxy cleanup`, `sandbox`, `completion` and `version`: the commands around the proxy.

`sandbox` is here rather than in `run`: it does not run this node's proxy but builds a
throwaway one in network namespaces (`lace_proxy.demo`), starting `lace-proxy run` as a
process of its own, so it needs nothing of the composition root.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from lace_proxy import __version__, implementation
from lace_proxy.cli.common import Commands
from lace_proxy.config import add_config_flags, config_from_args


def register(commands: Commands) -> None:
    """Add `cleanup`, `sandbox`, `completion` and `version`."""
    cleanup = commands.add_parser(
        "cleanup",
        help="remove everything lace-proxy programmed (or, --kube-proxy, kube-proxy's leftovers)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Remove what lace-proxy made on this node: its nftables tables (services, egress
SNAT), its IPVS virtual services, the lace-ipvs0 interface and its local routes of
service addresses (protocol 145, whichever lace.ipvs.serviceAddresses made them),
and its policy rules and routes (lace.routing.*). Run it after stopping the proxy;
with --config, the names in that file are the ones removed.

With --kube-proxy, remove kube-proxy's leftovers instead (stop kube-proxy first):
the jumps into its KUBE-* iptables chains and those chains (iptables-nft and
iptables-legacy, IPv4 and IPv6), its ipsets, its IPVS virtual services and
kube-ipvs0, and its nftables tables (ip/ip6 kube-proxy). kubelet's own chains
(KUBE-FIREWALL, KUBE-MARK-DROP, KUBE-KUBELET-CANARY) stay.

Established connections keep their conntrack NAT state either way: they go on to the
same endpoint until they close.""",
        epilog="exit codes: 0 done (or nothing to remove), 1 something could not be removed",
    )
    cleanup.add_argument(
        "--kube-proxy",
        action="store_true",
        help="remove kube-proxy's iptables chains, ipsets, IPVS services, kube-ipvs0 and "
        "nftables tables, not lace-proxy's",
    )
    add_config_flags(cleanup)
    cleanup.set_defaults(func=cmd_cleanup)

    sandbox = commands.add_parser(
        "sandbox",
        help="run the proxy in a network-namespace sandbox and show traffic (needs root)",
        description="Build network namespaces for a node, three pods with HTTP servers, a "
        "client and a router; run `lace-proxy run` on the node with a manifest folder; send "
        "requests from the client to each ClusterIP and NodePort and print which pod "
        "answered. Everything is removed on exit.",
    )
    sandbox.add_argument(
        "--manifests",
        metavar="DIR",
        help="the manifest folder to serve (default: the example folder shipped in the "
        "package, lace_proxy/demo/manifests)",
    )
    sandbox.add_argument("--requests", type=int, default=4, help="requests per frontend")
    sandbox.add_argument(
        "--keep", action="store_true", help="stay up after the requests, until Ctrl-C"
    )
    sandbox.set_defaults(func=cmd_sandbox)

    completion = commands.add_parser(
        "completion",
        help="print a shell completion script",
        description="Print a completion script for the shell, e.g. "
        "`lace-proxy completion bash > /etc/bash_completion.d/lace-proxy`.",
    )
    completion.add_argument("shell", choices=("bash", "zsh", "tcsh"))
    completion.set_defaults(func=cmd_completion)

    version = commands.add_parser(
        "version", help="print the version and the active twins (table, codecs)"
    )
    version.set_defaults(func=cmd_version)


def cmd_cleanup(args: argparse.Namespace) -> int:
    """Remove lace-proxy's kernel state, or kube-proxy's leftovers; 1 if any stayed."""
    from lace_proxy.app import egress_settings, ipvs_settings, nftables_settings, routing_settings
    from lace_proxy.bgp.speaker import Speaker
    from lace_proxy.dataplane.egress_snat import EgressSnat
    from lace_proxy.dataplane.ipvs import IpvsBackend
    from lace_proxy.dataplane.nft import Nft
    from lace_proxy.dataplane.nftables.backend import NftablesBackend
    from lace_proxy.dataplane.routes import PolicyRoutes
    from lace_proxy.migration import remove_kube_proxy

    if args.kube_proxy:
        report = remove_kube_proxy()
        for line in report.removed:
            print(f"removed  {line}")
        for line in report.skipped:
            print(f"skipped  {line}")
        for line in report.failed:
            print(f"FAILED   {line}", file=sys.stderr)
        return 1 if report.failed else 0
    cfg = config_from_args(args)
    settings = nftables_settings(cfg)
    nft = NftablesBackend(settings, Nft())
    removed = nft.cleanup()
    print(f"nftables table inet {nft.table}: {'removed' if removed else 'not present'}")
    # IPVS leftovers go whatever the mode: a node may be switching from one to the other.
    untranslated = NftablesBackend(dataclasses.replace(settings, translate=False), Nft())
    ipvs = IpvsBackend(ipvs_settings(cfg), untranslated)
    try:
        count = ipvs.remove_ipvs()
        print(
            f"IPVS virtual services, interface {ipvs.settings.interface} and local routes "
            f"(proto {ipvs.settings.route_protocol}): {count} virtual services removed"
        )
    except Exception as exc:  # no ip_vs module: nothing of ours can be there
        print(f"IPVS: not available here ({exc})")
    egress = EgressSnat(egress_settings(cfg), Nft())
    removed = egress.cleanup()
    print(f"nftables table inet {egress.settings.table}: {'removed' if removed else 'not present'}")
    routing = routing_settings(cfg)
    count = PolicyRoutes(routing).cleanup()
    print(
        f"policy rules at priority {routing.priority} and routes in table {routing.table}:"
        f" {count} removed"
    )
    speaker = Speaker(cfg.lace.bgp)  # whether BGP is on or not: it may have been
    done = "stopped, routes withdrawn" if speaker.cleanup() else "not running"
    print(f"BGP speaker in {speaker.directory}: {done}")
    return 0


def cmd_sandbox(args: argparse.Namespace) -> int:
    """The demo: the packaged example manifests unless --manifests names others."""
    from lace_proxy.demo.sandbox import example_manifests, run_demo

    if args.manifests is None:
        with example_manifests() as manifests:
            return run_demo(manifests, keep=args.keep, requests=args.requests)
    manifests = Path(args.manifests).resolve()
    if not manifests.exists():
        raise SystemExit(f"lace-proxy: sandbox: no such file or folder: {manifests}")
    return run_demo(manifests, keep=args.keep, requests=args.requests)


def cmd_completion(args: argparse.Namespace) -> int:
    """A completion script generated from the parser itself (`args.parser`, the whole
    command's), so it never falls behind."""
    import shtab

    print(shtab.complete(args.parser, shell=args.shell))
    return 0


def active_twins() -> dict[str, str]:
    """Which twin of each compiled module is active ("compiled" or "pure"), by what it does:
    what `version` prints and tox's environments check."""
    from lace_proxy.dataplane.ipvs.codec import IMPLEMENTATION as ipvs
    from lace_proxy.dataplane.nftables.codec import IMPLEMENTATION as nft
    from lace_proxy.model.plain import IMPLEMENTATION as plain

    return {
        "service table": implementation(),
        "nftables codec": nft,
        "IPVS codec": ipvs,
        "endpoint parse": plain,
    }


def cmd_version(args: argparse.Namespace) -> int:
    """The version, and which twins are active (compiled or pure)."""
    twins = ", ".join(f"{which} {module}" for module, which in active_twins().items())
    print(f"lace-proxy {__version__} ({twins})")
    return 0
