"""`lace-proxy run` as a process on a testbed's node: its command line, and the manifest folder
it follows."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from lace_proxy.demo.testbed import POD_CIDR4, Testbed

from .proxykit import NODE


def wait_for(check: Callable[[], bool], timeout: float = 45.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.1)


def lace_proxy(tb: Testbed, *args: str) -> list[str]:
    return ["ip", "netns", "exec", tb.node.ns.name, sys.executable, "-m", "lace_proxy", *args]


def run_argv(tb: Testbed, folder: Path, mode: str, state_socket: Path) -> list[str]:
    """`lace-proxy run` on the node, following `folder` quickly, in `mode`."""
    return lace_proxy(
        tb,
        "run",
        "--manifests",
        str(folder),
        "--hostname-override",
        NODE,
        "--cluster-cidr",
        POD_CIDR4,
        "--min-sync-period",
        "100ms",
        "--poll-interval",
        "0.1",
        "--proxy-mode",
        mode,
        "--state-socket",
        str(state_socket),
    )


def write(folder: Path, *objects: dict[str, object]) -> None:
    tmp = folder / ".web.tmp"
    tmp.write_text(yaml.safe_dump_all(objects))
    tmp.rename(folder / "web.yaml")  # atomic: the proxy never reads half a file
