"""The fork server that starts the testbeds' who-am-I servers (servers.py) in their
namespaces, and the handle of one server it started."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

SERVER_SCRIPT = Path(__file__).with_name("servers.py")


class ForkServer:
    """servers.py --fork-server: one per test process, started on first use; it forks the
    testbeds' servers, so none pays an interpreter's start. Exits with this process (its
    control socket closes)."""

    _lock = threading.Lock()
    _running: tuple[int, socket.socket, subprocess.Popen[bytes]] | None = None

    @classmethod
    def spawn(cls, netns: str, argv: Sequence[str], stderr: IO[bytes]) -> Server:
        """A server in `netns` with these arguments, its stderr to the file `stderr`."""
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        try:
            with cls._lock:
                control = cls._control()
                socket.send_fds(
                    control, [json.dumps([netns, list(argv)]).encode()],
                    [stdin_r, stdout_w, stderr.fileno()],
                )  # fmt: skip
                reply = control.recv(64)
            if not reply.endswith(b"\n"):
                raise RuntimeError("the testbed's fork server did not answer")
            pid = int(reply)
        except BaseException:
            for fd in (stdin_w, stdout_r):
                os.close(fd)
            raise
        finally:
            os.close(stdin_r)
            os.close(stdout_w)
        return Server(argv[0], pid, os.fdopen(stdin_w, "wb"), os.fdopen(stdout_r, "rb"), stderr)

    @classmethod
    def _control(cls) -> socket.socket:
        if cls._running is not None and cls._running[0] == os.getpid():
            return cls._running[1]
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with theirs:
            argv = [sys.executable, "-I", "-S", str(SERVER_SCRIPT), "--fork-server"]
            proc = subprocess.Popen(
                [*argv, str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                pass_fds=[theirs.fileno()],
                start_new_session=True,  # a terminal's Ctrl-C stays away from it
            )
        cls._running = (os.getpid(), ours, proc)
        return ours


@dataclass
class Server:
    """One server (a child of the fork server); its stderr goes to a file, so it can never
    block on a pipe. Watched through a pidfd: it is not this process's child."""

    name: str
    pid: int
    stdin: IO[bytes]
    stdout: IO[bytes]
    stderr: IO[bytes]

    def wait_ready(self, deadline: float) -> None:
        ready, _, _ = select.select([self.stdout], [], [], max(deadline - time.monotonic(), 0))
        line = self.stdout.readline() if ready else b""
        if line != b"ready\n":
            raise RuntimeError(f"server {self.name} not ready: {self.stop().strip()}")

    def stop(self) -> str:
        """Close stdin (the server exits on EOF), make sure it is gone; return its stderr."""
        with contextlib.suppress(OSError):
            self.stdin.close()
        try:
            pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            pidfd = None  # already gone and reaped
        if pidfd is not None:  # readable once the process has exited
            try:
                if not select.select([pidfd], [], [], 2)[0]:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    select.select([pidfd], [], [], 5)
            finally:
                os.close(pidfd)
        self.stdout.close()
        if self.stderr.closed:
            return ""
        self.stderr.seek(0)
        with self.stderr:
            return self.stderr.read().decode(errors="replace")
