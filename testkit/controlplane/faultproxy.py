"""An HTTPS proxy in front of the real kube-apiserver, for the faults it cannot show on demand.

Why: the `kube` source is tested against the real server (DESIGN.md §6). Most faults are real
too (`faults.Cut` cuts the network, `faults.compact_etcd` expires history, `ControlPlane`
stops and restarts the server). Three are not, and only these are made up here; the real
server answers everything else, byte for byte:

* `throttle`: 429 Too Many Requests with Retry-After. API Priority and Fairness answers so
  when a priority level's queues are full, which takes load a test cannot make on demand.
* `stall`: the server accepts requests and sends nothing, also on open watches (a hung
  apiserver, or a proxy or load balancer in between that holds connections open).
* `latency`: every response is late (an apiserver far away, or busy); the kernel here has no
  `netem` to delay packets.

The proxy presents the apiserver's own certificate and forwards every request as the admin,
whatever the client presents. It runs on its own event loop in a thread; use it as a context
manager.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import aiohttp
from aiohttp import web

from testkit.controlplane.cluster import ControlPlane

_T = TypeVar("_T")
#: Request headers passed on; authentication is the proxy's own (the admin's certificate).
_REQUEST_HEADERS = ("Accept", "Content-Type", "User-Agent")
#: Response headers passed back; the body's framing is the proxy's own (chunked).
_RESPONSE_HEADERS = ("Content-Type", "Cache-Control", "Retry-After", "Audit-Id")


class ProxiedRequest(NamedTuple):
    """A request as the proxy received it, for asserting how a client retried."""

    method: str
    path: str
    query: dict[str, str]
    throttled: bool


class FaultProxy:
    """An HTTPS proxy on 127.0.0.1 (an ephemeral port) to `plane`'s apiserver; `kubeconfig`
    (written into `directory`) is the admin's, dialling the proxy."""

    def __init__(self, plane: ControlPlane, directory: Path) -> None:
        self.plane = plane
        self.kubeconfig = directory / "faultproxy.kubeconfig"
        self._requests: list[ProxiedRequest] = []
        self._throttled = 0
        self._retry_after = 1
        self._latency = 0.0
        self._stall_until = 0.0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy")
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.url = ""

    # -- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        try:
            self._call(self._start())
        except BaseException:
            self.__exit__()
            raise
        self.plane.write_admin_kubeconfig(self.kubeconfig, server=self.url)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread.is_alive():
            self._stall_until = 0.0
            self._call(self._stop())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()

    async def _start(self) -> None:
        serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        serving.load_cert_chain(self.plane.pki / "apiserver.crt", self.plane.pki / "apiserver.key")
        upstream = aiohttp.TCPConnector(ssl=self.plane.admin_ssl_context())
        self._session = aiohttp.ClientSession(connector=upstream, auto_decompress=True)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # Cancelling a handler when its client leaves closes the upstream request too.
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=serving)
        await site.start()
        self.url = f"https://127.0.0.1:{self._runner.addresses[0][1]}"

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    # -- faults ---------------------------------------------------------------------------

    def throttle(self, requests: int, retry_after: int = 1) -> None:
        """Answer the next `requests` requests 429 with Retry-After, as the real server's
        API Priority and Fairness does (same status body)."""
        self._throttled, self._retry_after = requests, retry_after

    def stall(self, seconds: float) -> None:
        """For `seconds` from now, forward no request and no byte of any response (open
        watches go silent); `stall(0)` ends it. What was held back proceeds afterwards."""
        self._stall_until = time.monotonic() + seconds

    def latency(self, seconds: float) -> None:
        """Delay every request by `seconds` before it reaches the server (0: off)."""
        self._latency = seconds

    def requests(self) -> list[ProxiedRequest]:
        """Every request received so far, in order."""
        return list(self._requests)

    # -- HTTP -----------------------------------------------------------------------------

    async def _unstalled(self) -> None:
        while (left := self._stall_until - time.monotonic()) > 0:
            await asyncio.sleep(min(left, 0.05))

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        throttled = self._throttled > 0
        self._requests.append(
            ProxiedRequest(request.method, request.path, dict(request.query), throttled)
        )
        await self._unstalled()
        if throttled:
            self._throttled -= 1
            return self._too_many_requests()
        if self._latency:
            await asyncio.sleep(self._latency)
        assert self._session is not None
        body = await request.read()
        async with self._session.request(
            request.method,
            self.plane.url + request.path_qs,
            headers={h: request.headers[h] for h in _REQUEST_HEADERS if h in request.headers},
            data=body or None,
            timeout=aiohttp.ClientTimeout(total=None),
        ) as upstream:
            response = web.StreamResponse(
                status=upstream.status,
                headers={
                    h: upstream.headers[h] for h in _RESPONSE_HEADERS if h in upstream.headers
                },
            )
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await self._unstalled()
                await response.write(chunk)
            await response.write_eof()
            return response

    def _too_many_requests(self) -> web.Response:
        status = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "Too many requests, please try again later.",
            "reason": "TooManyRequests",
            "details": {"retryAfterSeconds": self._retry_after},
            "code": 429,
        }
        return web.json_response(
            status, status=429, headers={"Retry-After": str(self._retry_after)}
        )
