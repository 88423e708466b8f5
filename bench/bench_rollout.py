"""Rolling updates under load, both modes: failed/total per protocol and mode.

    python bench/bench_rollout.py [--modes nftables,ipvs] [--endpoints 3] [--rounds 2]
                                  [--tcp-rate 250] [--tcp-after 250] [--udp-after 100] [--json]

The longer variant of tests/netns/test_rollout.py, with the same scenario and load
(tests/netns/rollout.py): services of `--endpoints` pods are rolled `--rounds` times (to a
second set of pods and back), each endpoint as the EndpointSlice controller does it (new pod
not ready, ready; old pod terminating; old pod removed, then stopped), one proxier sync per
change. Meanwhile the client opens new TCP connections at `--tcp-rate` a second, sends a
fresh-source-port UDP query every 10 ms, holds two TCP connections on each pod about to be
replaced and keeps a fixed-source-port UDP stream (a query every 10 ms, each awaited) on each
UDP frontend. After each sync the load runs until `--tcp-after` connections and `--udp-after`
queries sent after it have finished.

A probe fails when it gets no answer, or an answer from a pod that was not a usable endpoint
when it was sent; a held connection fails when it stops working before its pod closes it; a
stream query fails when it is lost or answered by the wrong pod: a stream stays on its pod
until the pod is removed (IPVS mode: until it is terminating, as kube-proxy's IPVS mode), then
moves within that sync. The query in flight when its stream moved may be lost (its NAT state
is gone when the reply comes back); those are counted apart, as "in flight at a move".
nftables mode runs here (root); IPVS mode in the test VM (tests/vm/harness.py: qemu TCG, so
its rates are far below the requested ones: everything in the guest is emulated). Benchmarks
never assert: this prints what happened.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lace_proxy.demo.testbed import Testbed  # noqa: E402
from tests.netns.proxykit import Harness  # noqa: E402
from tests.netns.rollout import (  # noqa: E402
    ECHO_PORT,
    TARGET,
    Load,
    Rollout,
    hold_on_each,
    judge_held,
    judge_probes,
    judge_streams,
    stream_on_each,
)

MODES = ("nftables", "ipvs")
MARK = "bench-rollout-json: "  # the worker's result line in the VM job's output


def measure(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """One mode: a fresh testbed and proxy, the rollout under load, the verdicts."""
    n = args.endpoints
    with Testbed(pods=2 * n, ports=(TARGET,)) as tb, tempfile.TemporaryDirectory() as tmp:
        for pod in tb.pods:
            tb.serve(pod, (), echo_ports=(ECHO_PORT,))
        proxy = Harness(tb, Path(tmp) / "manifests", mode=mode)
        try:
            load = Load(
                tb.client,
                tcp_rate=args.tcp_rate,
                max_probes=50_000,
                max_seconds=args.max_seconds,
            )
            rollout = Rollout(tb, proxy, load, args.tcp_after, args.udp_after)
            sets = tb.pods[:n], tb.pods[n:]
            rollout.begin(sets[0])
            load.start()
            try:
                for r in range(args.rounds):
                    old, new = sets[r % 2], sets[(r + 1) % 2]
                    hold_on_each(load, old)
                    stream_on_each(load, old)
                    rollout.roll(old, new)
            finally:
                load.stop()
        finally:
            proxy.close()
    verdicts = judge_probes(load.probes, rollout.steps, [p.name for p in sets[0]])
    verdicts["held"] = judge_held(load.flows, rollout.stops)
    leaves_at = "terminating" if mode == "ipvs" else "gone"
    initial = [p.name for p in sets[0]]
    verdicts["stream"] = judge_streams(load.flows, rollout.steps, initial, leaves_at)
    seconds = load.stopped - load.started
    syncs = [s.ended - s.started for s in rollout.steps]
    return {
        "mode": mode,
        "seconds": seconds,
        "syncs": len(syncs),
        "sync_median_ms": 1000 * statistics.median(syncs),
        "sync_max_ms": 1000 * max(syncs),
        "rates": {k: verdicts[k].total / seconds for k in ("tcp", "udp")},
        "slowest_syncs": [
            f"{s.pod} {s.state}: {1000 * (s.ended - s.started):.0f} ms"
            for s in sorted(rollout.steps, key=lambda s: s.started - s.ended)[:3]
        ],
        "verdicts": {
            k: {
                "total": v.total,
                "failed": len(v.failed),
                "examples": v.failed[:5],
            }
            for k, v in verdicts.items()
        },
    }


def guest(args: argparse.Namespace) -> int:
    """Inside the VM: measure the modes asked for and print one JSON line."""
    results = [measure(mode, args) for mode in args.mode_list]
    print(MARK + json.dumps({"kernel": platform.release(), "results": results}), flush=True)
    return 0


def in_vm(args: argparse.Namespace) -> dict[str, Any] | str:
    """IPVS mode in the test VM: its results, or why there are none."""
    from tests.vm.harness import Job, VmError, VmUnavailable, run_jobs

    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", "--modes", "ipvs"]
    for flag in ("endpoints", "rounds", "tcp_rate", "tcp_after", "udp_after", "max_seconds"):
        argv += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    print("bench_rollout: booting the IPVS VM (qemu TCG); minutes", file=sys.stderr, flush=True)
    try:
        [result] = run_jobs([Job(argv, cwd=str(REPO))], timeout=args.max_seconds + 600)
    except (VmUnavailable, VmError) as exc:
        return f"the VM did not run: {exc}"
    lines = [line for line in result.output.splitlines() if MARK in line]
    if not lines:
        return f"no result from the VM\n{result.report()}"
    return json.loads(lines[-1].split(MARK, 1)[1])


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"rolling updates: {args.endpoints} endpoints x {args.rounds} rounds, "
        f"{args.endpoints * args.rounds * 4} syncs per mode; "
        f"requested {args.tcp_rate:g} TCP connections/s, a UDP query every 10 ms"
    )
    print(f"{'mode':9} {'traffic':28} {'failed / total':>16} {'rate/s':>8}")
    for r in results:
        v = r["verdicts"]
        rows = [
            ("new TCP connections", v["tcp"], r["rates"]["tcp"]),
            ("UDP queries (fresh port)", v["udp"], r["rates"]["udp"]),
            ("held TCP connections", v["held"], None),
            ("UDP stream queries", v["stream"], None),
        ]
        for label, verdict, rate in rows:
            figures = f"{verdict['failed']} / {verdict['total']}"
            shown = "" if rate is None else f"{rate:.0f}"
            print(f"{r['mode']:9} {label:28} {figures:>16} {shown:>8}")
        print(
            f"{'':9} {r['syncs']} syncs: median {r['sync_median_ms']:.0f} ms, "
            f"max {r['sync_max_ms']:.0f} ms; {r['seconds']:.0f} s of load; "
            f"slowest: {', '.join(r['slowest_syncs'])}"
        )
        for kind, verdict in v.items():
            for example in verdict["examples"]:
                print(f"{'':9} {kind} failure: {example}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default=",".join(MODES), help="nftables, ipvs or both")
    parser.add_argument("--endpoints", type=int, default=3, help="endpoints per service")
    parser.add_argument("--rounds", type=int, default=2, help="rollouts (there and back)")
    parser.add_argument("--tcp-rate", type=float, default=250.0, help="new TCP connections/s")
    parser.add_argument("--tcp-after", type=int, default=250, help="connections after a sync")
    parser.add_argument("--udp-after", type=int, default=100, help="queries after a sync")
    parser.add_argument(
        "--max-seconds", type=float, default=1200.0, help="bound on the load of one mode"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.mode_list = [m for m in args.modes.split(",") if m]
    if unknown := set(args.mode_list) - set(MODES):
        parser.error(f"unknown modes {sorted(unknown)}")
    if args.worker:
        return guest(args)

    results = []
    if "nftables" in args.mode_list:
        started = time.monotonic()
        print("bench_rollout: nftables mode here", file=sys.stderr, flush=True)
        results.append(measure("nftables", args))
        print(f"  {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    if "ipvs" in args.mode_list:
        vm = in_vm(args)
        if isinstance(vm, str):
            print(f"bench_rollout: IPVS mode not measured: {vm}", file=sys.stderr)
        else:
            results += vm["results"]
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        report(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
