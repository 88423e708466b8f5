"""Soak: the proxier's own sync loop under bounded endpoint churn, watching for growth.

    python bench/bench_soak.py [--services 1000] [--rate 60] [--minutes 3] [--json]

A synthetic cluster (bench_scale's) is programmed into a fresh network namespace by the
proxier's sync loop (`Proxier.run`, min_sync_period 100 ms, sync_period 10 s, so full syncs
happen too); then `--rate` EndpointSlice changes a second (each one endpoint replaced by a new
pod, or put back) arrive for `--minutes`. Every 10 s it samples the process's RSS, its open
file descriptors and threads, and the kernel's objects in the table (chains, rules, map and
set elements). It prints the samples and the growth from the first sample after warm-up to
the last. Needs root, `ip` and `nft`. Like every benchmark, it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from bench_scale import POD_CIDR, THIS_NODE, THIS_ZONE, _variant, make_cluster

from lace_proxy.dataplane.nft import Nft
from lace_proxy.dataplane.nftables.backend import NftablesBackend
from lace_proxy.dataplane.nftables.settings import NftablesSettings
from lace_proxy.proxier import Proxier
from lace_proxy.table import ServiceTable

SAMPLE_EVERY = 10.0


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def sample(backend: NftablesBackend, started: float, changes: int) -> dict[str, Any]:
    """The process's and the kernel's footprint now."""
    state = backend.read_back()
    assert state is not None
    return {
        "t_s": round(time.monotonic() - started, 1),
        "changes": changes,
        "rss_mib": round(_status("VmRSS") / 1024, 1),
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": _status("Threads"),
        "chains": len(state.chains),
        "rules": sum(state.chains.values()),
        "elements": sum(len(v) for v in state.elements.values()),
    }


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    cluster = make_cluster(args.services, 10)
    backend = NftablesBackend(NftablesSettings(cluster_cidrs=(POD_CIDR,)), Nft())
    table = ServiceTable(THIS_NODE, THIS_ZONE)
    proxier = Proxier(table, backend, sources=["bench"], min_sync_period=0.1, sync_period=10.0)
    for svc in cluster.services:
        proxier.service_upserted(svc)
    for sl in cluster.slices:
        proxier.slice_upserted(sl)
    proxier.synced("bench")
    stop = asyncio.Event()
    loop = asyncio.create_task(proxier.run(stop))
    while proxier.stats.syncs == 0:
        await asyncio.sleep(0.1)
    started = time.monotonic()
    samples = [sample(backend, started, 0)]
    changes = 0
    deadline = started + args.minutes * 60
    next_sample = started + SAMPLE_EVERY
    interval = 1.0 / args.rate
    while time.monotonic() < deadline:
        proxier.slice_upserted(_variant(cluster, changes))
        changes += 1
        await asyncio.sleep(interval)
        if time.monotonic() >= next_sample:
            samples.append(await asyncio.to_thread(sample, backend, started, changes))
            next_sample += SAMPLE_EVERY
    while table.pending:  # the last changes reach the kernel
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)
    samples.append(await asyncio.to_thread(sample, backend, started, changes))
    stop.set()
    await loop
    backend.cleanup()
    stats = proxier.stats
    return {
        "services": args.services,
        "rate_per_s": args.rate,
        "minutes": args.minutes,
        "changes": changes,
        "syncs": stats.syncs,
        "full_syncs": stats.full_syncs,
        "failures": stats.failures,
        "samples": samples,
    }


def report(result: dict[str, Any]) -> None:
    samples = result["samples"]
    print(
        f"soak: {result['services']} services, {result['changes']} endpoint changes "
        f"({result['rate_per_s'] * 60:.0f}/min for {result['minutes']} min), "
        f"{result['syncs']} syncs ({result['full_syncs']} full), {result['failures']} failed"
    )
    keys = ["t_s", "changes", "rss_mib", "fds", "threads", "chains", "rules", "elements"]
    print("  ".join(f"{k:>9}" for k in keys))
    for s in samples:
        print("  ".join(f"{s[k]:>9}" for k in keys))
    # Warm-up: the first minute (allocator pools, caches) is not growth.
    warm = next((s for s in samples if s["t_s"] >= 60), samples[0])
    last = samples[-1]
    print(
        "growth after warm-up: "
        + ", ".join(f"{k} {last[k] - warm[k]:+g}" for k in keys[2:])
        + f" (from t={warm['t_s']} s to t={last['t_s']} s)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=60.0, help="endpoint changes a second")
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.worker:  # run in a namespace of our own, as a node's proxy would run
        ns = f"lacesoak-{os.getpid()}"
        subprocess.run(["ip", "netns", "add", ns], check=True)
        try:
            argv = [*(argv if argv is not None else sys.argv[1:]), "--worker"]
            cmd = ["ip", "netns", "exec", ns, sys.executable, __file__, *argv]
            return subprocess.run(cmd, check=False).returncode
        finally:
            subprocess.run(["ip", "netns", "del", ns], check=False)
    result = asyncio.run(soak(args))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
