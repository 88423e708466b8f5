"""What the command groups share: flags defined once, and small helpers for their handlers.

The configuration flags (--config, --hostname-override, --proxy-mode, ...) are
`lace_proxy.config.add_config_flags`: they live beside `config_from_args`, which reads them
back. Nothing heavy is imported here: every command's parser is built on each start
(`--help` and shell completion included).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from lace_proxy.dataplane.netns import netns_prefix

if TYPE_CHECKING:
    from lace_proxy.model import ValidationError

#: What a command group's `register` adds its subparsers to.
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def add_api_flags(
    parser: argparse.ArgumentParser, *, kubeconfig_help: str, master_help: str
) -> None:
    """--kubeconfig and --master: which Kubernetes API (the help says what it is used for)."""
    parser.add_argument("--kubeconfig", metavar="FILE", help=kubeconfig_help)
    parser.add_argument("--master", metavar="URL", help=master_help)


def add_output_flag(
    parser: argparse.ArgumentParser, *choices: str, help_text: str | None = None
) -> None:
    """-o/--output, defaulting to its first choice."""
    parser.add_argument("-o", "--output", choices=choices, default=choices[0], help=help_text)


def add_netns_flag(parser: argparse.ArgumentParser, help_text: str) -> None:
    """--netns: a named network namespace to read instead of this one."""
    parser.add_argument("--netns", metavar="NAME", help=help_text)


def netns_problem(netns: str | None) -> str | None:
    """Why --netns is unusable (a bad name, or no such namespace: never create one), or None."""
    from pyroute2.netns import NETNS_RUN_DIR  # pyroute2 is slow to import

    try:
        netns_prefix(netns)  # validates the name
    except ValueError as exc:
        return str(exc)
    if netns is not None and not Path(NETNS_RUN_DIR, netns).exists():
        return f"no network namespace {netns} (see `ip netns list`)"
    return None


def print_rejection(error: ValidationError) -> None:
    """A rejected manifest or API object, told on stderr as the table is computed."""
    print(f"rejected: {error}", file=sys.stderr)
