"""`lace-proxy run`: the proxy itself. The flags are parsed here; `lace_proxy.app` builds
and runs everything (`sandbox`, which runs this command in namespaces, is in `admin`)."""

from __future__ import annotations

import argparse

from lace_proxy.cli.common import Commands, add_api_flags
from lace_proxy.config import add_config_flags, config_from_args


def register(commands: Commands) -> None:
    """Add `run`."""
    run = commands.add_parser(
        "run",
        help="run the proxy",
        description="Serve the Services and EndpointSlices of the Kubernetes API (in-cluster "
        "config, --kubeconfig or --master), or of a manifest folder (--manifests), keeping "
        "this node's nftables table in step. Runs until SIGINT/SIGTERM; the kernel state "
        "stays in place after it stops.",
    )
    add_config_flags(run)
    run.add_argument(
        "--poll-interval",
        type=float,
        default=0.5,
        metavar="SECONDS",
        help="how often the manifest folder is checked for changes (default 0.5)",
    )
    add_api_flags(
        run,
        kubeconfig_help="kubeconfig for the Kubernetes API (without --manifests; default: the "
        "config's clientConnection.kubeconfig, else in-cluster)",
        master_help="the API server's address, overriding the kubeconfig's",
    )
    run.add_argument(
        "--cleanup-kube-proxy",
        action="store_true",
        help="switching from kube-proxy: once the first sync is in the kernel, remove "
        "kube-proxy's leftovers as `cleanup --kube-proxy` does (its rules serve until then, "
        "so no new connection fails; stop kube-proxy first)",
    )
    run.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    """Run the proxy; a bad configuration is told before the proxy's modules load."""
    cfg = config_from_args(args)
    from lace_proxy import app  # everything the proxy is made of: imported only to run it

    return app.run(
        cfg,
        kubeconfig=args.kubeconfig,
        master=args.master,
        poll_interval=args.poll_interval,
        cleanup_kube_proxy=args.cleanup_kube_proxy,
    )
