"""The speaker: BIRD run by lace-proxy and kept announcing what lace-proxy says.

`sync` writes BIRD's configuration and routes (bird.py) and has BIRD take them; BIRD is
started if nothing answers on its control socket, and a BIRD already running there (left by
a lace-proxy killed with -9) is adopted as it is. BIRD always starts with `-R` (graceful
restart recovery): routers that kept this node's routes while it was away keep them until
BIRD has announced them again, so a restart loses no route. `check` finds a BIRD that died
(logged, counted) and starts it again with the last configuration. `stop` leaves the routes
with the routers (BIRD's graceful restart) unless asked to withdraw them.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lace_proxy.bgp import PEER_STATES
from lace_proxy.bgp.announce import Routes
from lace_proxy.bgp.bird import (
    CONFIG,
    CONTROL,
    PID,
    ROUTES,
    BirdError,
    NodeFacts,
    command,
    peers_of,
    protocol_name,
    render_config,
    render_routes,
    write_if_changed,
)
from lace_proxy.config.bgp import LaceBgpConfig

log = logging.getLogger(__name__)
#: How long a starting BIRD has to answer on its control socket.
START_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class PeerState:
    """A peer as BIRD reports it: its BGP state ("Established", "Active", "Connect", ...)."""

    address: str
    asn: int
    state: str


def answers(control: Path) -> bool:
    """Whether a BIRD answers on this control socket."""
    try:
        command(control, "show status", timeout=5.0)
    except BirdError:
        return False
    return True


def sessions(control: Path) -> dict[str, str]:
    """Each BGP session BIRD runs (its protocol's name) with its state (PEER_STATES; "Idle"
    for a session BIRD gives a reason instead); none if BIRD does not answer."""
    states: dict[str, str] = {}
    try:
        answer = command(control, "show protocols")
    except BirdError:
        return states
    for code, text in answer:
        # name, protocol, table, state, since, info (the BGP state, or a reason)
        words = text.split()
        if code == 1002 and len(words) >= 4 and words[1] == "BGP":
            info = words[5] if len(words) > 5 else ""
            states[words[0]] = info if info in PEER_STATES[:-1] else "Idle"
    return states


class Speaker:
    """BIRD, started and told what to announce (see the module's docstring)."""

    def __init__(
        self, settings: LaceBgpConfig, *, binary: str = "bird", netns: str | None = None
    ) -> None:
        self.settings = settings
        self.directory = Path(settings.directory)
        self.control = self.directory / CONTROL
        self._binary = binary
        self._netns = netns  # tests: BIRD runs in this network namespace
        self._process: subprocess.Popen[bytes] | None = None
        self._node: NodeFacts | None = None  # as of the last sync BIRD took
        self.routes: Routes = {}  # what BIRD last took
        # The configuration and route files' texts BIRD last took: a sync whose `configure`
        # failed finds them different and asks again.
        self._accepted: tuple[str, ...] | None = None
        self.restarts = 0  # times BIRD was found dead and started again

    def sync(self, node: NodeFacts, routes: Routes, passwords: Mapping[str, str | None]) -> bool:
        """Have BIRD announce `routes` with this node's configuration and the peers' keys
        (bird.read_passwords); whether BIRD was told anything. Raises BirdError if BIRD
        refuses it (BIRD keeps what it had; the next sync asks again)."""
        texts = (
            render_config(self.settings, node, str(self.directory), passwords),
            *(render_routes(routes, family) for family in ROUTES),
        )
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        for name, text in zip((CONFIG, *ROUTES.values()), texts, strict=True):
            write_if_changed(self.directory / name, text)
        if not answers(self.control):
            self._start()  # it reads the files
        elif texts != self._accepted:
            command(self.control, "configure")
        else:
            return False
        self._accepted, self._node, self.routes = texts, node, routes
        return True

    def check(self) -> bool:
        """Whether BIRD is running; if it died since the last look, log and count it and
        start it again with the last configuration."""
        if self._node is None:
            return False  # never synced: nothing to run yet
        exited = self._process is not None and self._process.poll() is not None
        if not exited and answers(self.control):
            return True
        code = self._process.returncode if self._process is not None else None
        log.error("BGP: BIRD is not running (exit code %s); starting it again", code)
        self.restarts += 1
        self._start()
        return True

    def peers(self) -> list[PeerState]:
        """This node's peers with the state BIRD reports; "Down" for one BIRD does not know
        (yet), all of them if BIRD does not answer."""
        states = sessions(self.control)
        node = self._node or NodeFacts(())
        return [
            PeerState(p.address, p.asn, states.get(protocol_name(p), "Down"))
            for p in peers_of(self.settings, node)
        ]

    def stop(self, *, withdraw: bool = False) -> None:
        """Stop BIRD: routers keep this node's routes for the graceful restart time (a
        restart of lace-proxy), or, with `withdraw`, are told to drop them at once."""
        try:
            command(self.control, "down" if withdraw else "graceful restart", timeout=5.0)
        except BirdError as exc:
            if self._process is not None and self._process.poll() is None:
                log.warning("BGP: stopping BIRD: %s", exc)
        if self._process is not None:
            try:
                self._process.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None

    def cleanup(self) -> bool:
        """`lace-proxy cleanup`: stop a BIRD answering here (ours or left by another
        lace-proxy), its routes withdrawn at once, and remove its files; whether one ran."""
        running = answers(self.control)
        if running:
            self.stop(withdraw=True)
        for name in (CONFIG, PID, CONTROL, *ROUTES.values()):
            (self.directory / name).unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # not empty: files of someone else's
            self.directory.rmdir()
        return running

    def _start(self) -> None:
        """Start BIRD in the foreground, as a child, and wait for its control socket."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()  # running but not answering
            self._process.wait()
        argv = [
            self._binary,
            "-f",
            "-R",
            "-c",
            str(self.directory / CONFIG),
            "-s",
            str(self.control),
            "-P",
            str(self.directory / PID),
        ]
        if self._netns is not None:
            argv = ["ip", "netns", "exec", self._netns, *argv]
        self._process = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT
        while not answers(self.control):
            if self._process.poll() is not None:
                raise BirdError(f"BIRD exited at its start (code {self._process.returncode})")
            if time.monotonic() > deadline:
                raise BirdError(f"BIRD did not answer within {START_TIMEOUT:.0f} s")
            time.sleep(0.05)
        log.info("BGP: BIRD started (pid %d)", self._process.pid)
