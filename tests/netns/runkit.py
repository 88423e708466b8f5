"""`lace-proxy run` as a process on a testbed's node: its command line, and the manifest folder
it follows."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from lace_proxy.config import KIND, LACE_API_VERSION
from lace_proxy.demo.testbed import POD_CIDR4, Testbed

from ..conftest import IPVS_ADDRESSES
from .proxykit import NODE

#: How long `lace-proxy run` may take from its start to its first sync before a test calls it
#: failed. A behaviour's own deadline (`wait_for`) counts from there: the start is mostly
#: imports, which take ~1 s here and 20-40 s in the IPVS VM (an emulated CPU, TCG, shared with
#: the test itself).
STARTUP_TIMEOUT = 150.0


def wait_for(check: Callable[[], bool], timeout: float = 45.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.1)


def lace_proxy(tb: Testbed, *args: str) -> list[str]:
    return ["ip", "netns", "exec", tb.node.ns.name, sys.executable, "-m", "lace_proxy", *args]


def run_argv(tb: Testbed, folder: Path, mode: str, state_socket: Path) -> list[str]:
    """`lace-proxy run` on the node, following `folder` quickly, in `mode`; in IPVS mode with
    this run's way of making service addresses local (IPVS_ADDRESSES, a file beside the
    state socket: lace.ipvs.serviceAddresses has no flag)."""
    config: list[str] = []
    if mode == "ipvs":
        path = state_socket.with_name("lace-ipvs.yaml")
        doc = {"apiVersion": LACE_API_VERSION, "kind": KIND}
        lace = {"ipvs": {"serviceAddresses": IPVS_ADDRESSES}}
        path.write_text(yaml.safe_dump({**doc, "lace": lace}))
        config = ["--config", str(path)]
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
        *config,
    )


def write(folder: Path, *objects: dict[str, object]) -> None:
    tmp = folder / ".web.tmp"
    tmp.write_text(yaml.safe_dump_all(objects))
    tmp.rename(folder / "web.yaml")  # atomic: the proxy never reads half a file


class RunProcess:
    """`lace-proxy run` as a process, everything it prints in a log file: started (until its
    first sync), killed and stopped at will."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.argv = argv
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self._offset = 0

    def start(self) -> None:
        """Start it, and return once it has programmed its first sync."""
        self._offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=out)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while "first sync programmed" not in self.output():
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"lace-proxy run exited ({self.proc.returncode}) before its first sync:\n"
                    + self.output()
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"lace-proxy run: no first sync within {STARTUP_TIMEOUT:g} s:\n" + self.output()
                )
            time.sleep(0.1)

    def output(self) -> str:
        """What the process of the last start printed."""
        with self.log.open("rb") as log:
            log.seek(self._offset)
            return log.read().decode(errors="replace")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM (unless it has ended already); it must exit 0 without a traceback."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        returncode = self.proc.wait(timeout=60)
        assert returncode == 0, self.output()
        assert "Traceback" not in self.output(), self.output()
