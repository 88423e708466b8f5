"""The `lace-proxy` command: run the proxy, inspect its table and kernel state, clean up.

Each command group registers its subcommands beside their handlers (`run`, `inspect`,
`kernel`, `bgp`, `doctor`, `admin`); this module assembles them and runs one. Building the parser
imports nothing heavy, so `--help`, `version` and shell completion start fast: a handler
imports what it needs (the proxy itself is `lace_proxy.app`'s).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence

from lace_proxy.cli import admin, bgp, doctor, inspect, kernel, run
from lace_proxy.config import ConfigError
from lace_proxy.dataplane.nftables.transaction import NftError


def build_parser() -> argparse.ArgumentParser:
    """Every command and flag (also what `completion` turns into a shell script)."""
    parser = argparse.ArgumentParser(
        prog="lace-proxy",
        description="A kube-proxy replacement: a compiled service table programming nftables.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (run, inspect, kernel, bgp, doctor, admin):  # the order `--help` lists them in
        group.register(commands)
    # The whole parser, handed to the handlers (`completion` turns it into a script) so that
    # no command group imports this module, which imports them.
    parser.set_defaults(parser=parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command: its exit code; a configuration error is 2, a refused nft command 1."""
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `lace-proxy table | head` ends quietly
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"lace-proxy: {exc}", file=sys.stderr)
        return 2
    except NftError as exc:
        print(f"lace-proxy: {exc}", file=sys.stderr)
        return 1
