"""The running proxy's state socket: root-only, never stolen from a live proxy, taken back
from a dead one, and a clear error when nothing answers."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from lace_proxy.dataplane.nftables.backend import NftablesBackend
from lace_proxy.dataplane.nftables.settings import NftablesSettings
from lace_proxy.model.parse import parse_endpoint_slice, parse_service
from lace_proxy.proxier import Proxier
from lace_proxy.state_socket import StateServer, StateUnavailable, fetch
from lace_proxy.table import ServiceTable

from ..helpers import api_service, api_slice


def _proxier() -> Proxier:
    proxier = Proxier(ServiceTable("n1"), NftablesBackend(NftablesSettings()), sources=["files"])
    proxier.service_upserted(parse_service(api_service("web")))
    proxier.slice_upserted(parse_endpoint_slice(api_slice("web-1", "web")))
    proxier.table.build()
    proxier.table.commit()
    return proxier


def test_serves_the_documents_and_gives_way_to_a_live_proxy(tmp_path: Path) -> None:
    path = str(tmp_path / "run" / "state.sock")

    async def scenario() -> None:
        first = StateServer(path, _proxier())
        assert await first.start()
        assert (tmp_path / "run").stat().st_mode & 0o777 == 0o700
        doc = await asyncio.to_thread(fetch, path, "services")
        assert (doc["node"], doc["ready"]) == ("n1", False)  # "files" never said synced
        assert [s["name"] for s in doc["services"]] == ["web"]
        second = StateServer(path, _proxier())
        assert not await second.start()  # the first still answers: not taken over
        await first.stop()
        assert not Path(path).exists()

    asyncio.run(scenario())


def test_a_socket_left_by_a_killed_proxy_is_taken_over(tmp_path: Path) -> None:
    path = str(tmp_path / "state.sock")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)  # bound, never listening: what a killed proxy leaves
    stale.close()
    with pytest.raises(StateUnavailable, match="nothing listens"):
        fetch(path, "endpoints")

    async def scenario() -> None:
        server = StateServer(path, _proxier())
        assert await server.start()
        doc = await asyncio.to_thread(fetch, path, "endpoints")
        assert [e["endpoint"] for e in doc["endpoints"]] == ["10.0.0.1:8080"]
        await server.stop()

    asyncio.run(scenario())


def test_an_unusable_path_is_logged_and_serving_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "file").write_text("")

    async def scenario() -> bool:
        return await StateServer(str(tmp_path / "file" / "state.sock"), _proxier()).start()

    assert asyncio.run(scenario()) is False
    assert "state socket" in caplog.text
