"""`lace-proxy kernel`: what IPVS holds on this node, and its diff against the table.

The report itself is `lace_proxy.dataplane.ipvs.report`'s, beside the IPVS backend whose
rules it applies; this module checks the input and computes the table's plans.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from lace_proxy.cli.common import (
    Commands,
    add_netns_flag,
    add_output_flag,
    netns_problem,
    print_rejection,
)
from lace_proxy.config import ProxyConfig, add_config_flags, config_from_args

if TYPE_CHECKING:
    from lace_proxy.dataplane.ipvs import IpvsBackend
    from lace_proxy.table import Plan


def register(commands: Commands) -> None:
    """Add `kernel`."""
    kernel = commands.add_parser(
        "kernel",
        help="list what IPVS holds, with service names, and its diff against the table",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
List what IPVS holds on this node (this kernel, or --netns's) in the layout of
`ipvsadm -Ln`, with a SERVICE column (namespace/name:port) for the virtual services
the table explains, then its difference from the table (computed from --manifests as
`table` does, with the settings of --config; NodePorts on the node addresses the IPVS
backend reads from the kernel):

  missing     a virtual service the table wants that IPVS does not hold
  unexpected  one of lace-proxy's (on its service addresses: lace-ipvs0's or its
              local routes', or a NodePort on a node address) that the table does
              not want
  different   scheduler, persistence, or real servers: missing, unexpected (serving
              but not in the table), or in the table but at weight 0
  draining    a removed real server at weight 0 until its connections end: listed,
              not a difference

SERVICE is "-" for one of lace-proxy's the table does not explain, "(foreign)" for a
virtual service on other addresses: shown, never diffed. IPVS mode only (--proxy-mode
ipvs or mode: ipvs in --config); needs root.""",
        epilog="""examples:
  lace-proxy kernel --manifests DIR --proxy-mode ipvs --hostname-override node-a
  lace-proxy kernel --manifests DIR --config proxy.yaml --netns lp1a2b.N -o json

exit codes:
  0  IPVS holds what the table says
  1  it differs (missing, unexpected or different virtual services)
  2  bad input (options, configuration, manifests), nftables mode, or no IPVS here""",
    )
    add_config_flags(kernel)
    add_output_flag(
        kernel,
        "text",
        "json",
        help_text="text: ipvsadm's layout and the diff (default); json: the same as a document",
    )
    add_netns_flag(kernel, "read the IPVS of this named network namespace, e.g. a sandbox node")
    kernel.set_defaults(func=cmd_kernel)


def ipvs_plans(args: argparse.Namespace, cfg: ProxyConfig) -> tuple[IpvsBackend, list[Plan]]:
    """The IPVS backend as `run` would make it, reading --netns's kernel, and the table's
    plans as `table` computes them (the proxier's own change tracker, never synced)."""
    from lace_proxy import app
    from lace_proxy.dataplane.ipvs import IpvsBackend

    base = app.dataplane(cfg)  # the mode's settings, exactly as `run` derives them
    assert isinstance(base, IpvsBackend)
    backend = IpvsBackend(base.settings, base.nft, args.netns)
    # The backend takes the Node's addresses from the proxier (nodePortAddresses: primary).
    proxier = app.computed_proxier(cfg, backend, on_reject=print_rejection)
    return backend, list(proxier.table.plans())


def cmd_kernel(args: argparse.Namespace) -> int:
    """IPVS listed, and its diff: exit code 0 in sync, 1 different, 2 bad input or no IPVS."""

    def bad(message: object) -> int:
        print(f"lace-proxy: kernel: {message}", file=sys.stderr)
        return 2

    if (problem := netns_problem(args.netns)) is not None:
        return bad(problem)
    cfg = config_from_args(args)  # a ConfigError is exit code 2 (main)
    if cfg.mode != "ipvs":
        return bad(
            f"the proxy mode is {cfg.mode}: it programs no IPVS, so there is nothing to "
            "show (give --proxy-mode ipvs or a --config with mode: ipvs; `lace-proxy "
            "explain` checks the nftables table)"
        )
    if not cfg.lace.manifests:
        return bad(
            "give --manifests DIR (a folder of Service, EndpointSlice, Node and Lace manifests)"
        )
    if not Path(cfg.lace.manifests).exists():
        return bad(f"manifests: no such file or folder: {cfg.lace.manifests}")
    if not args.verbose:  # the proxier's own logging is not the answer
        logging.getLogger("lace_proxy").setLevel(logging.ERROR)
    from lace_proxy.dataplane.ipvs.report import (
        IpvsUnreadable,
        ipvs_text,
        kernel_document,
        read_ipvs,
    )

    backend, plans = ipvs_plans(args, cfg)
    try:
        view = read_ipvs(backend)
    except IpvsUnreadable as exc:
        return bad(exc)
    doc = kernel_document(cfg, backend, plans, view)
    if args.output == "json":
        json.dump(doc, sys.stdout, indent=2)
        print()
    else:
        print(ipvs_text(doc))
    return 0 if doc["inSync"] else 1
