"""The sync loop's rate limit: kube-proxy's (a token per minSyncPeriod, two saved).

With one sync per minSyncPeriod, a change that came right after the periodic full sync
waited out the period: bench_vs_kube_proxy's update → kernel p99 at 10k Services was 829 ms
(median 2 ms), 2.3 ms with the burst. The limiter is tested on its own clock, and the loop
on the recording fake with a period no test waits out.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import uvloop

from lace_proxy.dataplane.nftables.backend import NftablesBackend
from lace_proxy.dataplane.nftables.settings import NftablesSettings
from lace_proxy.proxier import Proxier, SyncTokens
from lace_proxy.table import ServiceTable
from testkit.fakenft import FakeNft

from ..helpers import eventually
from .tablekit import ep, eps, svc


def test_two_syncs_may_follow_each_other_then_one_a_period() -> None:
    tokens = SyncTokens(1.0)
    assert tokens.wait(100.0) == 0.0
    tokens.take(100.0)  # the periodic sync
    assert tokens.wait(100.1) == 0.0  # a change right after it: at once
    tokens.take(100.1)
    assert abs(tokens.wait(100.2) - 0.8) < 1e-9  # the third waits: 0.2 of a token saved
    tokens.take(101.0)
    assert abs(tokens.wait(101.0) - 1.0) < 1e-9  # then one a period
    assert tokens.wait(110.0) == 0.0  # idle: the two saved again, no more
    tokens.take(110.0)
    tokens.take(110.0)
    assert abs(tokens.wait(110.0) - 1.0) < 1e-9


def test_no_period_no_wait() -> None:
    tokens = SyncTokens(0.0)
    for t in (1.0, 1.0, 1.0):
        assert tokens.wait(t) == 0.0
        tokens.take(t)


@contextlib.asynccontextmanager
async def running(min_sync_period: float, sync_period: float = 30.0) -> AsyncIterator[Proxier]:
    """A proxier's loop on the recording fake, its one service synced from the start."""
    proxier = Proxier(
        ServiceTable("node-a"),
        NftablesBackend(NftablesSettings(), FakeNft()),
        sources=["kube"],
        min_sync_period=min_sync_period,
        sync_period=sync_period,
    )
    stop = asyncio.Event()
    loop = asyncio.create_task(proxier.run(stop))
    try:
        proxier.service_upserted(svc("web", ips=("10.96.0.10",)))
        proxier.slice_upserted(eps(ep("10.244.1.5")))
        proxier.synced("kube")
        yield proxier
    finally:
        stop.set()
        await loop


def test_a_change_right_after_a_sync_is_programmed_at_once() -> None:
    """minSyncPeriod 60 s: the change after the first sync is programmed without waiting for
    it (a single token would have held it 60 s); the one after that waits for its token."""

    async def scenario() -> None:
        async with running(min_sync_period=60.0) as proxier:
            await eventually(lambda: proxier.stats.syncs == 1)
            proxier.slice_upserted(eps(ep("10.244.1.6")))
            await eventually(lambda: proxier.stats.syncs == 2)
            assert proxier.table.pending == 0
            proxier.slice_upserted(eps(ep("10.244.1.7")))
            await asyncio.sleep(0.3)
            assert (proxier.stats.syncs, proxier.table.pending) == (2, 1)  # coalescing

    asyncio.run(scenario())


def test_the_periodic_full_sync_spends_one_token_under_uvloop() -> None:
    """uvloop's timers fire up to a millisecond early (they count whole milliseconds): the
    wake for the periodic full sync came before the clock said the period was over, so the
    loop ran partial syncs with nothing to do until it was, spending both tokens, and the
    changes after it waited (bench_vs_kube_proxy at 1k: 0.7 s). A period just above whole
    milliseconds makes every wake early; each must be the full sync, nothing else."""

    async def scenario() -> Proxier:
        async with running(min_sync_period=0.01, sync_period=0.0504) as proxier:
            await eventually(lambda: proxier.stats.full_syncs >= 6)
        return proxier

    proxier = uvloop.run(scenario())
    assert proxier.stats.syncs == proxier.stats.full_syncs, proxier.stats
