"""BIRD 2, the BGP speaker: its configuration, the routes it announces, its control socket.

lace-proxy writes BIRD's whole configuration (`render_config`, from lace.bgp and the node)
and the routes in two include files of a `protocol static` each (`render_routes`), then
asks BIRD over its control socket to `configure`. BIRD works out the difference itself and
sends only what changed, without resetting a session (a changed graceful restart time does
reset it). Routes live in tables of their own: nothing reaches the kernel's.

Everything written into the configuration is validated first (addresses without zones,
numbers, the communities' digits, a password and a directory without quotes:
config/schema.py and the model; a key read from a file is checked as it is read), so that
no value can end a statement; protocol names come from the peer's address.

The control socket answers each command with lines `NNNN-text` (more follow), ` text` (the
same code continued) and `NNNN text` (the last); codes 8000 and up are errors.
"""

from __future__ import annotations

import errno
import io
import os
import socket
import stat
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from lace_proxy.bgp.announce import Routes
from lace_proxy.config.bgp import KEY_BYTES, BgpPeer, LaceBgpConfig, password_problem

CONFIG, CONTROL, PID = "bird.conf", "bird.ctl", "bird.pid"
ROUTES = {4: "routes4.conf", 6: "routes6.conf"}


class BirdError(Exception):
    """BIRD refused a command (its code and message), or could not be reached."""


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What of this node the speaker's configuration needs: its InternalIPs (the next
    hops; the router id by default) and labels (which peers select it)."""

    addresses: tuple[str, ...]
    labels: tuple[tuple[str, str], ...] = ()

    def address(self, family: int) -> str | None:
        return next((a for a in self.addresses if (6 if ":" in a else 4) == family), None)


def protocol_name(peer: BgpPeer) -> str:
    """The BGP protocol's name for a peer: from its address, so that reordering the peers
    restarts no session."""
    return "peer_" + peer.address.replace(".", "_").replace(":", "_")


def peers_of(settings: LaceBgpConfig, node: NodeFacts) -> tuple[BgpPeer, ...]:
    """The peers this node has: those whose node selector its labels match."""
    labels = dict(node.labels)
    return tuple(p for p in settings.peers if p.selects(labels))


def read_passwords(
    peers: Iterable[BgpPeer], last: Mapping[str, str]
) -> tuple[dict[str, str | None], list[str]]:
    """The TCP MD5 key of each peer that has one, by its address, and what went wrong.

    A key is the peer's `password`, or what its `password_file` holds now (a mounted
    Secret's key, which kubelet may replace: each sync reads it again). A file that cannot
    be read, or holds no key BIRD's configuration can take, is a problem: the peer keeps its
    `last` key, or without one it is None, left out of the configuration until it has one
    (the other peers' sessions and every route go on)."""
    out: dict[str, str | None] = {}
    problems: list[str] = []
    for peer in peers:
        if not peer.password_file:
            if peer.password:
                out[peer.address] = peer.password
            continue
        where = f"peer {peer.address}'s passwordFile {peer.password_file}"
        try:
            key = _read_key(peer.password_file)
            problem = "is empty" if not key else password_problem(key)
        except (OSError, UnicodeDecodeError) as exc:
            problem = f"cannot be read ({exc})"
        if problem is None:
            out[peer.address] = key
            continue
        kept = last.get(peer.address)
        out[peer.address] = kept
        then = "its last key is kept" if kept else "the peer is left out until it has a key"
        problems.append(f"{where}: the key {problem}; {then}")
    return out, problems


def _read_key(path: str) -> str:
    """A key file's text without its line end: a regular file (a FIFO or a device would
    block or never end), at most a key's length read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        data = os.read(fd, KEY_BYTES + 3)  # a longer key is refused as too long
    finally:
        os.close(fd)
    return data.decode("ascii").rstrip("\r\n")


def render_config(
    settings: LaceBgpConfig,
    node: NodeFacts,
    directory: str,
    passwords: Mapping[str, str | None],
) -> str:
    """BIRD's configuration for this node (see the module's docstring), with the peers'
    keys (`read_passwords`; a peer whose key is None is left out)."""
    router_id = settings.router_id or node.address(4)
    if router_id is None:
        raise BirdError("lace.bgp.routerID is required on a node without an IPv4 InternalIP")
    lines = [
        "# lace-proxy's BGP speaker: written by lace-proxy at every change, not to be edited.",
        "log stderr { info, remote, warning, error, auth, fatal, bug };",
        f"router id {router_id};",
        "graceful restart wait 10;",
        "protocol device { scan time 10; }",
    ]
    for family in (4, 6):
        lines += [
            f"ipv{family} table lace_svc{family};",
            f"protocol static lace_routes{family} {{",
            f"  ipv{family} {{ table lace_svc{family}; }};",
            f'  include "{Path(directory, ROUTES[family])}";',
            "}",
        ]
    for peer in peers_of(settings, node):
        if passwords.get(peer.address, "") is None:
            continue  # its key file fails: no session without its key
        local = node.address(6 if ":" in peer.address else 4)
        lines += [
            f"protocol bgp {protocol_name(peer)} {{",
            f"  local {local + ' ' if local else ''}as {settings.asn};",
            f"  neighbor {peer.address} port {peer.port} as {peer.asn};",
            f"  hold time {int(peer.hold_time)};",
            "  connect delay time 1;",
            "  connect retry time 5;",
            "  graceful restart on;",
            f"  graceful restart time {int(settings.graceful_restart_time)};",
        ]
        if key := passwords.get(peer.address):
            lines.append(f'  password "{key}";')
        for family in (4, 6):
            hop = node.address(family)
            if hop is not None:  # routes of a family need a next hop of it
                lines.append(
                    f"  ipv{family} {{ table lace_svc{family}; import none; "
                    f"export filter {{ bgp_next_hop = {hop}; accept; }}; }};"
                )
        lines.append("}")
    return "\n".join(lines) + "\n"


def render_routes(routes: Routes, family: int) -> str:
    """The include file of one family's routes: a blackhole static route each (it never
    reaches the kernel), with its communities."""
    out = []
    for prefix, communities in routes.items():
        if (6 if ":" in prefix else 4) != family:
            continue
        attributes = "".join(
            f"bgp_community.add(({c.replace(':', ',')})); "
            if c.count(":") == 1
            else f"bgp_large_community.add(({c.replace(':', ',')})); "
            for c in communities
        )
        out.append(f"route {prefix} blackhole" + (f" {{ {attributes}}};" if attributes else ";"))
    return "".join(line + "\n" for line in out)


def read_routes(directory: Path) -> Routes:
    """The routes of the include files in `directory` (as render_routes writes them)."""
    out: Routes = {}
    for name in ROUTES.values():
        try:
            text = (directory / name).read_text()
        except FileNotFoundError:
            continue
        for line in text.splitlines():
            words = line.split()
            if len(words) < 3 or words[0] != "route":
                continue
            communities = [
                inner.replace(",", ":")
                for part in line.split(".add((")[1:]
                for inner in (part.split("))", 1)[0],)
            ]
            out[words[1]] = tuple(sorted(communities))
    return dict(sorted(out.items()))


def configured_peers(directory: Path) -> set[str] | None:
    """The BGP protocols of the configuration last written in `directory` (the peers that
    select this node, as it was then), or None if none was written."""
    try:
        text = (directory / CONFIG).read_text()
    except FileNotFoundError:
        return None
    return {line.split()[2] for line in text.splitlines() if line.startswith("protocol bgp ")}


def write_if_changed(path: Path, text: str) -> bool:
    """Replace a file atomically (a rename) if its text differs; whether it did."""
    try:
        if path.read_text() == text:
            return False
    except FileNotFoundError:
        pass
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return True


def command(control: Path, text: str, timeout: float = 30.0) -> list[tuple[int, str]]:
    """One command over BIRD's control socket: its answer's lines (code, text). Raises
    BirdError if BIRD refuses it or cannot be reached."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(control))
            with sock.makefile("rwb") as stream:
                _answer(stream)  # the greeting: 0001 BIRD 2.x ready.
                stream.write(text.encode() + b"\n")
                stream.flush()
                lines = _answer(stream)
    except OSError as exc:
        raise BirdError(f"BIRD's control socket {control}: {exc.strerror or exc}") from exc
    code, message = lines[-1]
    if code >= 8000:
        raise BirdError(f"BIRD refused {text!r}: {message}")
    return lines


def _answer(stream: io.BufferedIOBase) -> list[tuple[int, str]]:
    lines: list[tuple[int, str]] = []
    code = 0
    while True:
        raw = stream.readline()
        if not raw:
            raise ConnectionError("BIRD closed its control socket")
        line = raw.decode(errors="replace").rstrip("\n")
        if len(line) >= 5 and line[:4].isdigit() and line[4] in "- ":
            code = int(line[:4])
            lines.append((code, line[5:]))
            if line[4] == " ":
                return lines
        else:
            lines.append((code, line[1:]))
