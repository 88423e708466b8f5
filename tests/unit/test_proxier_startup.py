"""Before its first sync, the proxier says what it waits for: in the log and on /healthz.

The dataplane is the nftables backend on the recording fake (testkit.fakenft): what a first
sync the kernel refuses looks like needs no kernel here; the real one refuses in
tests/netns/test_proxier.py.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from lace_proxy.dataplane.nftables.backend import NftablesBackend
from lace_proxy.dataplane.nftables.settings import NftablesSettings
from lace_proxy.health import ProxierHealth
from lace_proxy.metrics import ProxyMetrics
from lace_proxy.proxier import Proxier
from lace_proxy.table import ServiceTable
from testkit.fakenft import FakeNft

from ..helpers import eventually
from .tablekit import ep, eps, svc

REPORT = 0.05  # seconds between the startup log's lines (the product waits a minute)


def make(nft: FakeNft, clock: list[float]) -> tuple[Proxier, ProxierHealth]:
    metrics = ProxyMetrics()
    health = ProxierHealth(30.0, metrics, clock=lambda: clock[0])
    proxier = Proxier(
        ServiceTable("node-a"),
        NftablesBackend(NftablesSettings(), nft),
        sources=["kube", "files"],
        min_sync_period=0.01,
        metrics=metrics,
        health=health,
        startup_report=REPORT,
    )
    return proxier, health


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "lace_proxy.proxier" and r.levelno == logging.WARNING
    ]


def test_the_log_and_healthz_say_what_a_starting_proxy_waits_for(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nft, clock = FakeNft(), [1_700_000_000.0]
    proxier, health = make(nft, clock)
    listing = ["services (listing, 3 pages of 500 (1,500 objects) so far)", "nodes (no answer)"]
    proxier.describe_source("kube", lambda: list(listing))  # "files" tells nothing

    async def scenario() -> None:
        stop = asyncio.Event()
        loop = asyncio.create_task(proxier.run(stop))
        try:
            with caplog.at_level(logging.INFO, logger="lace_proxy.proxier"):
                await eventually(lambda: len(warnings(caplog)) >= 2)
                expected = [
                    "files source",
                    "kube source: services (listing, 3 pages of 500 (1,500 objects) so far)",
                    "kube source: nodes (no answer)",
                ]
                assert proxier.waiting_for() == expected
                first = warnings(caplog)[0]
                assert first.startswith("nothing programmed yet, 0 s after starting: waiting for ")
                assert first.endswith("; ".join(expected))
                code, body = health.healthz()
                assert (code, body["waitingFor"]) == (200, expected)  # not yet 2 x syncPeriod
                clock[0] += 60.0
                code, body = health.healthz()
                assert (code, body["healthy"], body["waitingFor"]) == (503, False, expected)
                code, body = health.livez()  # restarting would only start the lists over
                assert (code, body["waitingFor"]) == (200, expected)

                listing.pop(0)
                proxier.synced("files")
                assert proxier.waiting_for() == ["kube source: nodes (no answer)"]
                proxier.service_upserted(svc("web", ips=("10.96.0.10",)))
                proxier.slice_upserted(eps(ep("10.244.1.5")))
                nft.refuse_next("Device or resource busy", count=2)
                proxier.synced("kube")
                await eventually(lambda: proxier.stats.failures >= 1)
                assert proxier.waiting_for() == [
                    "a first sync the kernel takes (the last one failed: "
                    f"{proxier.stats.last_error})"
                ]
                assert "Device or resource busy" in proxier.waiting_for()[0]
                assert health.healthz()[0] == 503
                await eventually(lambda: proxier.stats.syncs == 1)
                assert proxier.waiting_for() == []
                code, body = health.healthz()
                assert code == 200
                assert "waitingFor" not in body
                reported = len(warnings(caplog))
                await asyncio.sleep(4 * REPORT)
                assert len(warnings(caplog)) == reported  # programmed: no more reports
                firsts = [m for m in caplog.messages if m.startswith("first sync programmed ")]
                assert len(firsts) == 1
                assert firsts[0].endswith(" s after starting (1 plans)")
        finally:
            stop.set()
            await loop

    asyncio.run(scenario())


def test_a_proxy_that_programs_at_once_reports_nothing(caplog: pytest.LogCaptureFixture) -> None:
    nft, clock = FakeNft(), [1_700_000_000.0]
    proxier, health = make(nft, clock)
    proxier.startup_report = 0.5

    async def scenario() -> None:
        stop = asyncio.Event()
        loop = asyncio.create_task(proxier.run(stop))
        try:
            with caplog.at_level(logging.INFO, logger="lace_proxy.proxier"):
                proxier.synced("files")
                proxier.synced("kube")
                await eventually(lambda: proxier.stats.syncs == 1)
                await asyncio.sleep(0.7)
                assert warnings(caplog) == []
                clock[0] += 3600.0
                code, body = health.healthz()
                assert (code, "waitingFor" in body) == (200, False)
        finally:
            stop.set()
            await loop

    asyncio.run(scenario())
