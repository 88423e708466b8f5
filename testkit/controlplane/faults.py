"""Real faults for a running control plane: a cuttable way in, and etcd compaction.

Why: the watcher's resume, relist and backoff paths must be driven by what a real network and
a real etcd do, not by an emulator's idea of them (DESIGN.md §6).

* `Cut`: a second port to the apiserver (a loopback DNAT in a table of its own), which a test
  cuts like a network partition: new connections are reset, open ones destroyed in the kernel
  (`ss -K`). Clients of the apiserver's own port, the apiserver's loopback client included,
  are untouched, so a test keeps writing while the watcher under test is cut off. Root only.
* `compact_etcd`: compact etcd's history up to its current revision (etcd's v3 JSON gateway
  on its client URL; no etcdctl), as kube-apiserver's own compactor does every 5 minutes.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from testkit.controlplane.cluster import ControlPlane, free_port

_TABLE_PREFIX = "lace_cut_"


def can_cut() -> str | None:
    """Why `Cut` cannot work here (None: it can): it needs root, nft, ss and conntrack."""
    if os.geteuid() != 0:
        return "needs root (nftables, ss -K)"
    missing = [tool for tool in ("nft", "ss", "conntrack") if shutil.which(tool) is None]
    return f"needs {', '.join(missing)}" if missing else None


def _nft(*args: str, stdin: str | None = None, check: bool = True) -> str:
    result = subprocess.run(["nft", *args], input=stdin, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"nft {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def _sweep_stale_tables() -> None:
    """Delete tables left by test processes that were killed (named after their pid)."""
    for line in _nft("list", "tables", "ip", check=False).splitlines():
        name = line.split()[-1] if line.startswith("table ip ") else ""
        if not name.startswith(_TABLE_PREFIX):
            continue
        try:
            pid, port = (int(part) for part in name[len(_TABLE_PREFIX) :].split("_"))
            os.kill(pid, 0)
        except ProcessLookupError:
            _nft("delete", "table", "ip", name, check=False)
            _forget_flows(port)
        except ValueError:
            continue


def _forget_flows(port: int) -> None:
    """Delete the conntrack entries of connections dialled to `port`. Left behind, one whose
    NAT reply tuple (apiserver port -> client port) is the same as a later direct
    connection's, once the NAT table is gone, breaks that connection."""
    subprocess.run(
        ["conntrack", "-D", "-p", "tcp", "--orig-port-dst", str(port)], capture_output=True
    )


class Cut:
    """127.0.0.1:`port` leads to `plane`'s apiserver until `cut()`, and again after `heal()`."""

    def __init__(self, plane: ControlPlane) -> None:
        if plane.host != "127.0.0.1":
            raise ValueError("Cut works on a control plane served on 127.0.0.1")
        _sweep_stale_tables()
        self.plane = plane
        self.port = free_port()
        self.table = f"{_TABLE_PREFIX}{os.getpid()}_{self.port}"
        self.server = f"https://127.0.0.1:{self.port}"
        # The filter chain runs before NAT (-150 < -100), so it sees the port the client dialled.
        _nft(
            "-f",
            "-",
            stdin=f"""table ip {self.table} {{
  chain nat_out {{
    type nat hook output priority -100;
    ip daddr 127.0.0.1 tcp dport {self.port} dnat to 127.0.0.1:{plane.port}
  }}
  chain cut {{
    type filter hook output priority -150;
  }}
}}
""",
        )
        self._closed = False

    def kubeconfig(self, path: Path) -> Path:
        """An admin kubeconfig dialling the cuttable port."""
        return self.plane.write_admin_kubeconfig(path, server=self.server)

    def cut(self) -> None:
        """Reset new connections to the port, then destroy the open ones. Only new ones are
        refused, so the resets `ss -K` sends reach the apiserver, which closes its ends (a
        half-open one would reset a later client that happens to reuse the local port)."""
        _nft(
            "add", "rule", "ip", self.table, "cut",
            "ip", "daddr", "127.0.0.1", "tcp", "dport", str(self.port), "ct", "state", "new",
            "reject", "with", "tcp", "reset",
        )  # fmt: skip
        result = subprocess.run(
            ["ss", "-K", "-tn", "dst", "127.0.0.1", "dport", "=", str(self.port)],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise RuntimeError(f"ss -K: {result.stderr.strip()}")

    def heal(self) -> None:
        _nft("flush", "chain", "ip", self.table, "cut")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            _nft("delete", "table", "ip", self.table, check=False)
            _forget_flows(self.port)

    def __enter__(self) -> Cut:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _etcd(plane: ControlPlane, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        plane.etcd_url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as reply:
        result: dict[str, Any] = json.loads(reply.read())
        return result


def etcd_revision(plane: ControlPlane) -> int:
    """etcd's current revision (what kube-apiserver reports as resourceVersion)."""
    key = base64.b64encode(b"\0").decode()
    return int(_etcd(plane, "/v3/kv/range", {"key": key})["header"]["revision"])


def etcd_history_kept(plane: ControlPlane, revision: int) -> bool:
    """Whether etcd can still answer a read at `revision` (False once compacted past it)."""
    key = base64.b64encode(b"\0").decode()
    try:
        _etcd(plane, "/v3/kv/range", {"key": key, "revision": str(revision)})
    except urllib.error.HTTPError as error:
        if b"compacted" in error.read():
            return False
        raise
    return True


def compact_etcd(plane: ControlPlane) -> int:
    """Compact etcd's history up to its current revision; returns that revision. A watch from
    an older resourceVersion that reaches etcd now fails with 410 Gone."""
    revision = etcd_revision(plane)
    _etcd(plane, "/v3/kv/compaction", {"revision": str(revision), "physical": True})
    return revision
