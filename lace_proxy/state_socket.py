"""The running proxy's read-only state, over a Unix socket on the node.

`lace-proxy services` and `lace-proxy endpoints` ask the proxy that programs this node what
it holds, rather than recomputing it. A Unix socket (mode 0600 in a 0700 folder) keeps that
to root on the node, and to `kubectl exec` into the proxy's pod: nothing listens on the
network, and only GET is answered.
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import json
import logging
import os
import socket
from pathlib import Path
from typing import Any

from aiohttp import web

from lace_proxy import inventory
from lace_proxy.proxier import Proxier

log = logging.getLogger(__name__)

#: What the socket answers: path -> the inventory function that computes it.
DOCUMENTS = {"services": inventory.services, "endpoints": inventory.endpoints}


class StateUnavailable(Exception):
    """No proxy answered on the socket, or it answered something unusable."""


class StateServer:
    """Serves /services and /endpoints as JSON computed from the proxier, on the loop that
    runs it (so a document is one consistent moment of the table)."""

    def __init__(self, path: str, proxier: Proxier) -> None:
        self.path = path
        self.proxier = proxier
        self._runner: web.AppRunner | None = None

    async def _answer(self, request: web.Request) -> web.Response:
        what = request.match_info["what"]
        compute = DOCUMENTS.get(what)
        if compute is None:
            raise web.HTTPNotFound(text=f"no such document: {what} (services, endpoints)\n")
        doc = {
            "node": self.proxier.table.node_name,
            "ready": self.proxier.ready,
            what: compute(self.proxier),
        }
        return web.json_response(doc)

    async def start(self) -> bool:
        """Listen; False (logged) when the path is taken by a live proxy or unusable."""
        path = Path(self.path)
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            if path.exists() or path.is_symlink():
                if _answers(self.path):
                    log.error("state socket %s: another proxy answers there; not serving", path)
                    return False
                path.unlink()  # left by a proxy that was killed
        except OSError as exc:
            log.error(
                "state socket %s: %s; `services`/`endpoints` cannot ask this proxy", path, exc
            )
            return False
        app = web.Application()
        app.router.add_get("/{what}", self._answer)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        old = os.umask(0o177)  # the socket is created 0600: root only
        try:
            await web.UnixSite(self._runner, self.path).start()
        except OSError as exc:
            log.error("state socket %s: %s", path, exc)
            await self._runner.cleanup()
            self._runner = None
            return False
        finally:
            os.umask(old)
        log.info("state socket: %s (lace-proxy services, lace-proxy endpoints)", path)
        return True

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            with contextlib.suppress(FileNotFoundError):
                Path(self.path).unlink()


def _answers(path: str) -> bool:
    """True when something accepts connections on the socket at `path`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(path)
        except OSError:
            return False
    return True


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def fetch(path: str, what: str, timeout: float = 30.0) -> dict[str, Any]:
    """The running proxy's document `what` ("services" or "endpoints")."""
    conn = _UnixConnection(path, timeout)
    try:
        conn.request("GET", f"/{what}")
        response = conn.getresponse()
        body = response.read()
    except FileNotFoundError as exc:
        raise StateUnavailable(f"no proxy serves {path} (is lace-proxy running here?)") from exc
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        if exc.errno == errno.ECONNREFUSED:
            reason = "nothing listens (a proxy that stopped left it)"
        raise StateUnavailable(f"{path}: {reason}") from exc
    finally:
        conn.close()
    if response.status != 200:
        raise StateUnavailable(f"{path}: {response.status} {body.decode(errors='replace')}")
    try:
        doc: dict[str, Any] = json.loads(body)
    except ValueError as exc:
        raise StateUnavailable(f"{path}: not a JSON document: {exc}") from exc
    return doc
