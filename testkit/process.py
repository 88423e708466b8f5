"""Long-running test programs (etcd, kube-apiserver, kube-proxy, proxies under benchmark):
started with their output in a log file, killed with the thread that started them, stopped
gently, their log's tail for failure messages."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)


def die_with_parent() -> None:
    """Runs in a child before exec: SIGKILL it when the thread that started it dies."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def spawn(argv: Sequence[str], log: Path, cgroups: Sequence[Path] = ()) -> subprocess.Popen[bytes]:
    """Start `argv` with its output appended to `log`. It gets SIGKILL when the thread that
    started it dies (PR_SET_PDEATHSIG), and it joins each cgroup directory in `cgroups` before
    exec, so the whole process tree is accounted there from its first instruction."""
    procs = [os.fspath(Path(group) / "cgroup.procs") for group in cgroups]

    def before_exec() -> None:
        die_with_parent()
        for path in procs:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)

    with open(log, "ab") as out:
        out.write(f"\n=== start {time.strftime('%H:%M:%S')}: {' '.join(argv)}\n".encode())
        out.flush()
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=before_exec,
            start_new_session=True,  # a terminal's ^C reaches the test runner, which cleans up
        )


def tail(log: Path, lines: int = 40) -> str:
    """The last `lines` of a log file, for failure messages."""
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop(popen: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
    """SIGTERM, then SIGKILL after `timeout`; returns the exit status."""
    if popen.poll() is None:
        popen.terminate()
        try:
            popen.wait(timeout)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()
    return popen.returncode
