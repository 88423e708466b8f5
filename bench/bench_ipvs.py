"""IPVS mode against nftables mode: cold programming and one endpoint change, in the IPVS VM.

    python bench/bench_ipvs.py [--sizes 1000,10000] [--endpoints 10] [--changes 30]
                               [--addresses interface,localRoutes] [--timeout 300]
                               [--profile] [--json]

This host's kernel has no IPVS, so the script boots the test VM once (tests/vm/harness.py:
qemu TCG, Debian's cloud kernel, this checkout and virtualenv shared read-only) and runs
itself inside it (`--worker`), so both modes are measured on the same kernel under the same
emulation. In the VM, each (size, mode) gets a fresh network namespace (a dummy uplink with
the node address 192.168.0.10/24 and a route to the pod CIDR, which IPVS needs before it
accepts a real server) and one process (`--measure`) that runs inside it, as the proxy runs
on a node: `nft` is called without `ip netns exec` and the IPVS backend talks to its own
namespace (`--netns-per-call` instead builds the backends with the namespace's name, as
tests/netns/proxykit.py does; `ip netns exec` then adds ~50 ms to every nft call in the VM).

The service table comes from bench_scale.make_cluster (same generator, same seed). Measured:

- nftables mode: `NftablesBackend.full_sync` cold, then N single-endpoint changes through
  upsert slice -> build -> apply -> commit (median, p99);
- IPVS mode: `IpvsBackend(IpvsSettings(), NftablesBackend(translate=False), ...)`, the same
  cold full_sync and the same changes, once for each way of making service addresses local
  (`--addresses`, both by default: `interface`, the dummy interface's addresses as
  kube-proxy's, and `localRoutes`, local routes in the local table; lace.ipvs.
  serviceAddresses); the time is split into nftables and IPVS parts, the IPVS part into the
  service addresses and the virtual services with their real servers (functions and methods
  of lace_proxy.dataplane.ipvs are wrapped with timers in the measuring process only), and
  into Python (user) and kernel (sys) CPU;
- then two full syncs with nothing changed: the periodic one (the changeset applied after
  a check of what a few requests show, as the proxy's reconcile runs between verified ones)
  and a verified one (everything read back, as every `verify_every`-th, the one after a
  failure and a restart's adoption).

A discarded warm-up (50 services, both modes) first makes the kernel load its nf_tables
modules. `ipvsadm -Ln` and the service addresses (the dummy's, or the local routes) are
counted after the cold sync and compared with what IPVS mode's `Wanted` says; the report ends
with each IPVS way's ratios to nftables mode (in --json: "summary"). A cold or full sync
still running after `--timeout` s is interrupted; the report gives what was programmed by
then and the rate-based prediction (at 10k services the IPVS cold sync took ~14 min in the
VM before the IPVS codec, ~2.5 min since, most of it the dummy interface's addresses, ~30 s
since those go in batches too). `--profile` adds a cProfile run of the IPVS cold sync at
the smallest size, for each way. `--worker` alone runs the measurement on the machine it is
started on (root, a kernel with IPVS) and prints the JSON result line.

Benchmarks never assert. TCG emulates every guest instruction: absolute figures are many
times slower than on hardware; the IPVS/nftables ratio, measured side by side, is the point.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_scale import (
    POD_CIDR,
    THIS_NODE,
    THIS_ZONE,
    _percentile,
    _variant,
    fmt_t,
    make_cluster,
)

from lace_proxy.config import SERVICE_ADDRESSES
from lace_proxy.dataplane.ipvs import IpvsBackend, IpvsSettings, Wanted, addresses_of
from lace_proxy.dataplane.ipvs.addresses import AddressChannel
from lace_proxy.dataplane.ipvs.model import ROUTE_PROTOCOL
from lace_proxy.dataplane.ipvs.netlink import IpvsChannel
from lace_proxy.dataplane.nft import Nft
from lace_proxy.dataplane.nftables.backend import NftablesBackend
from lace_proxy.dataplane.nftables.settings import NftablesSettings
from lace_proxy.table import IMPLEMENTATION, ServiceTable

REPO = Path(__file__).resolve().parents[1]
MODES = ("nftables", "ipvs")
NODE_ADDRESS = "192.168.0.10"  # the namespace's uplink: NodePorts are virtual services on it
GATEWAY = "192.168.0.1"
MARK = "bench-ipvs-json: "  # the worker's result line in the VM job's output


# --- one (size, mode) in its namespace ---------------------------------------------------------


class OutOfTime(Exception):
    """--timeout elapsed inside a sync."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise OutOfTime


class Phases:
    """Wall time, CPU and calls of named functions, by wrapping them."""

    def __init__(self) -> None:
        self.wall: defaultdict[str, float] = defaultdict(float)
        self.user: defaultdict[str, float] = defaultdict(float)
        self.sys: defaultdict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()
        self.first: dict[str, float] = {}  # perf_counter when first entered

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            self.first.setdefault(name, t0)
            try:
                return fn(*args, **kwargs)
            finally:
                r1 = resource.getrusage(resource.RUSAGE_SELF)
                self.wall[name] += time.perf_counter() - t0
                self.user[name] += r1.ru_utime - r0.ru_utime
                self.sys[name] += r1.ru_stime - r0.ru_stime
                self.calls[name] += 1

        return timed

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]


def _ip(netns: str, *args: str) -> None:
    subprocess.run(["ip", "-n", netns, *args], check=True, capture_output=True)


def make_namespace(name: str) -> None:
    """A fresh namespace with an uplink: the node address and a route to the pods."""
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    _ip(name, "link", "set", "lo", "up")
    _ip(name, "link", "add", "eth0", "type", "dummy")
    _ip(name, "addr", "add", f"{NODE_ADDRESS}/24", "dev", "eth0")
    _ip(name, "link", "set", "eth0", "up")
    _ip(name, "route", "add", POD_CIDR, "via", GATEWAY)


def _in_ns(netns: str | None) -> list[str]:
    return ["ip", "netns", "exec", netns] if netns else []


def ipvs_held(netns: str | None) -> tuple[int, int]:
    """(virtual services, real servers) as `ipvsadm -Ln` shows them."""
    out = subprocess.run(
        [*_in_ns(netns), "ipvsadm", "-Ln"], check=True, capture_output=True, text=True
    ).stdout
    services = servers = 0
    for line in out.splitlines():
        words = line.split()
        if words and words[0] in ("TCP", "UDP", "SCTP"):
            services += 1
        elif words[:1] == ["->"] and words[1] != "RemoteAddress:Port":
            servers += 1
    return services, servers


def service_addresses(netns: str | None, local_routes: bool) -> int:
    """The service addresses the namespace holds: the dummy's, or the local routes'."""
    if local_routes:
        shown = ["route", "show", "table", "local", "proto", str(ROUTE_PROTOCOL)]
        argvs = [["ip", "-4", *shown], ["ip", "-6", *shown]]
    else:
        argvs = [["ip", "-o", "addr", "show", "dev", IpvsSettings().interface]]
    return sum(
        len(
            subprocess.run(
                [*_in_ns(netns), *argv], check=False, capture_output=True, text=True
            ).stdout.splitlines()
        )
        for argv in argvs
    )


def expected_ipvs(plans: list[Any]) -> dict[str, int]:
    """What Wanted says the plans need: virtual services, real servers, service addresses."""
    wanted = Wanted((NODE_ADDRESS,), IpvsSettings().scheduler)
    addresses: set[str] = set()
    for plan in plans:
        wanted.add(plan)
        addresses |= addresses_of(plan)
    desired = wanted.desired()
    return {
        "services": len(desired),
        "servers": sum(len(t.servers) for t in desired.values()),
        "addresses": len(addresses),
    }


def _timed_sync(
    fn: Callable[[], Any], timeout: float, profile: cProfile.Profile | None = None
) -> tuple[float, float, float, float, bool]:
    """(start, wall, user, sys) of this process, and whether fn finished within `timeout`."""
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    signal.setitimer(signal.ITIMER_REAL, timeout)
    finished = True
    try:
        if profile is not None:
            profile.runcall(fn)
        else:
            fn()
    except OutOfTime:
        finished = False
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return t0, wall, r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime, finished


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """One size, one mode, in a fresh namespace; returns a JSON-able dict."""
    signal.signal(signal.SIGALRM, _on_alarm)
    mode, size, netns = args.measure, args.size, args.netns
    cluster = make_cluster(size, args.endpoints)
    table = ServiceTable(THIS_NODE, THIS_ZONE)
    for svc in cluster.services:
        table.upsert_service(svc)
    for sl in cluster.slices:
        table.upsert_slice(sl)
    table.build()
    table.commit()
    plans = list(table.plans())
    out: dict[str, Any] = {
        "size": size,
        "mode": mode,
        "plans": len(plans),
        "netns_per_call": netns is not None,
    }
    local_routes = args.ways[0] == "localRoutes"

    phases = Phases()
    settings = {"cluster_cidrs": (POD_CIDR,)}
    if mode == "nftables":
        nft = NftablesBackend(NftablesSettings(**settings), Nft(netns))
        backend: Any = nft
    else:
        nft = NftablesBackend(NftablesSettings(translate=False, **settings), Nft(netns))
        backend = IpvsBackend(IpvsSettings(local_routes=local_routes), nft, netns=netns)
        out["addresses"] = args.ways[0]
        # Timers around the IPVS backend's kernel work (this process only).
        for name in ("services", "servers_of"):  # IPVS read back: netlink dumps
            setattr(IpvsChannel, name, phases.wrap("dump", getattr(IpvsChannel, name)))
        # The service addresses, either way: dumped, added, deleted.
        for name in ("addresses", "add", "delete", "local_routes", "add_routes", "delete_routes"):
            setattr(AddressChannel, name, phases.wrap("addresses", getattr(AddressChannel, name)))
        backend._converge = phases.wrap("services", backend._converge)
        out["expected"] = expected_ipvs(plans)
    nft.full_sync = phases.wrap("nft", nft.full_sync)  # type: ignore[method-assign]
    nft.apply = phases.wrap("nft", nft.apply)  # type: ignore[method-assign]

    # Cold programming.
    profile = cProfile.Profile() if args.profile and mode == "ipvs" else None
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    start, wall, user, sys_, finished = _timed_sync(
        lambda: backend.full_sync(plans), args.timeout, profile
    )
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cold: dict[str, Any] = {
        "finished": finished,
        "wall_s": wall,
        "nft_s": phases.wall["nft"],
        "nft_child_user_s": c1.ru_utime - c0.ru_utime,
        "nft_child_sys_s": c1.ru_stime - c0.ru_stime,
    }
    if mode == "ipvs":
        cold.update(
            ipvs_s=wall - phases.wall["nft"],
            ipvs_user_s=user - phases.user["nft"],
            ipvs_sys_s=sys_ - phases.sys["nft"],
            addresses_s=phases.wall["addresses"],
            services_s=phases.wall["services"],
            dump_s=phases.wall["dump"],
            ops=backend.last_changes if finished else None,
        )
        for phase in ("addresses", "services"):  # CPU: where each phase's time goes
            cold[f"{phase}_user_s"] = phases.user[phase]
            cold[f"{phase}_sys_s"] = phases.sys[phase]
        cold["other_s"] = cold["ipvs_s"] - cold["addresses_s"] - cold["services_s"]
        cold["other_s"] -= cold["dump_s"]
        held_services, held_servers = ipvs_held(netns)
        cold["held"] = {
            "services": held_services,
            "servers": held_servers,
            "addresses": service_addresses(netns, local_routes),
        }
        if not finished and "services" in phases.first:
            # Predict from the rate of the virtual-service phase (the bulk of the work).
            t_start = phases.first["services"] - start
            exp = out["expected"]
            done = held_services + held_servers
            if done:
                rate = (wall - t_start) / done
                cold["predicted_s"] = t_start + rate * (exp["services"] + exp["servers"])
        if profile is not None:
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(15)
            out["profile"] = text.getvalue()
    out["cold"] = cold
    out["rss_mib"] = _rss_mib()
    if not finished:  # the kernel state is partial: nothing else is meaningful
        print(json.dumps(out), flush=True)
        os._exit(0)  # a namespace thread may still be programming

    try:
        _changes_and_resync(out, args, backend, table, cluster, phases)
    except Exception as exc:  # e.g. nft killed by the VM's OOM killer: keep what was measured
        out["error_after_cold"] = f"{type(exc).__name__}: {exc}".strip() + _oom_note()
    out["rss_mib"] = _rss_mib()
    return out


def _changes_and_resync(
    out: dict[str, Any],
    args: argparse.Namespace,
    backend: Any,
    table: Any,
    cluster: Any,
    phases: Phases,
) -> None:
    """N single-endpoint changes, then a resync; into `out`."""
    mode = args.measure
    # One endpoint change at a time.
    if args.changes:
        totals, tables, nfts, ops = [], [], [], []
        for run in range(args.changes):
            sl = _variant(cluster, run)
            phases.reset()
            t0 = time.perf_counter()
            table.upsert_slice(sl)
            change = table.build()
            t1 = time.perf_counter()
            backend.apply(change)
            table.commit()
            totals.append(time.perf_counter() - t0)
            tables.append(t1 - t0)
            nfts.append(phases.wall["nft"])
            if mode == "ipvs":
                ops.append(backend.last_changes)
        change_out: dict[str, Any] = {
            "runs": args.changes,
            "median_s": statistics.median(totals),
            "p99_s": _percentile(totals, 0.99),
            "table_s": statistics.median(tables),
            "nft_s": statistics.median(nfts),
        }
        if mode == "ipvs":
            ipvs_parts = [t - b - n for t, b, n in zip(totals, tables, nfts, strict=True)]
            change_out["ipvs_s"] = statistics.median(ipvs_parts)
            change_out["ipvs_ops"] = statistics.median(ops)
        out["change"] = change_out

    # Full syncs with nothing changed: the periodic one (changes applied, what a few dumps
    # show checked), then one that reads everything back (verified: a restart's adoption,
    # every `verify_every`-th periodic sync, the one after a failure).
    if args.resync:
        empty = table.build()
        table.commit()
        plans = list(table.plans())
        _resync(out, "periodic", args, backend, phases, lambda: backend.full_sync(plans, empty))
        _resync(out, "resync", args, backend, phases, lambda: backend.full_sync(plans))


def _resync(
    result: dict[str, Any],
    key: str,
    args: argparse.Namespace,
    backend: Any,
    phases: Phases,
    sync: Callable[[], Any],
) -> None:
    """One full sync with nothing changed, timed and split as the cold one; into
    `result[key]`."""
    phases.reset()
    _, wall, _, _, finished = _timed_sync(sync, args.timeout)
    out: dict[str, Any] = {"finished": finished, "wall_s": wall, "nft_s": phases.wall["nft"]}
    result[key] = out
    if args.measure == "ipvs":
        out.update(
            ipvs_s=wall - phases.wall["nft"],
            dump_s=phases.wall["dump"],
            services_s=phases.wall["services"],
            addresses_s=phases.wall["addresses"],
            ops=backend.last_changes if finished else None,
        )
        out["other_s"] = out["ipvs_s"] - out["dump_s"] - out["services_s"] - out["addresses_s"]
    if not finished:
        print(json.dumps(result), flush=True)
        os._exit(0)


def _rss_mib() -> dict[str, float]:
    """Peak RSS of this process and of its largest child (nft), in MiB."""
    return {
        "self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "nft": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }


def _oom_note() -> str:
    """The kernel's last OOM kill, if any (the VM has 1 GiB)."""
    log = subprocess.run(["dmesg"], capture_output=True, text=True, check=False).stdout
    kills = [line for line in log.splitlines() if "Killed process" in line]
    return f" [{kills[-1].strip()}]" if kills else ""


# --- in the VM: every (size, mode), then the result line --------------------------------------


def run_measure(
    size: int, variant: str, args: argparse.Namespace, profile: bool = False
) -> dict[str, Any]:
    """One `--measure` process in a namespace made for it (and deleted afterwards), for one
    variant: nftables mode, or IPVS mode with one way of making service addresses local."""
    mode = "nftables" if variant == "nftables" else "ipvs"
    netns = f"lacebench-ipvs-{os.getpid()}"
    make_namespace(netns)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--measure",
        mode,
        *(["--addresses", variant] if mode == "ipvs" else []),
        "--size",
        str(size),
        "--endpoints",
        str(args.endpoints),
        "--changes",
        str(0 if profile else args.changes),
        "--timeout",
        str(args.timeout),
        *(["--no-resync", "--profile"] if profile else []),
        *(["--no-resync"] if not args.resync else []),
    ]
    if args.netns_per_call:
        cmd += ["--netns", netns]
    else:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, check=False, timeout=3 * args.timeout + 600
        )
    except subprocess.TimeoutExpired:
        return {**_named(size, variant), "error": "the measuring process hung: killed"}
    finally:
        subprocess.run(["ip", "netns", "del", netns], check=False)
    took = time.monotonic() - t0
    settled = settle()
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {**_named(size, variant), "error": f"exit {proc.returncode}: {proc.stderr}"}
    result = json.loads(lines[-1])
    result["process_s"] = took
    result["settle_s"] = settled
    return result


def _busy_jiffies() -> tuple[int, int]:
    """The machine's CPU time so far, (busy, all), in jiffies (/proc/stat's first line)."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def settle(quiet: float = 0.1, window: float = 0.25, limit: float = 120.0) -> float:
    """Wait until the machine is idle (busy under `quiet` of a `window`, twice running):
    the kernel tears a deleted namespace down afterwards (cleanup_net, a workqueue), on the
    VM's one vCPU, and that must not count against the next measurement (at 10k services it
    was done within ~1 s each time). Returns the seconds waited ("settle_s")."""
    start = time.monotonic()
    calm = 0
    busy, total = _busy_jiffies()
    while calm < 2 and time.monotonic() - start < limit:
        time.sleep(window)
        busy2, total2 = _busy_jiffies()
        share = (busy2 - busy) / max(1, total2 - total)
        calm = calm + 1 if share < quiet else 0
        busy, total = busy2, total2
    return time.monotonic() - start


def _named(size: int, variant: str) -> dict[str, Any]:
    """What names a measurement: its size, mode and (IPVS mode) way of service addresses."""
    if variant == "nftables":
        return {"size": size, "mode": "nftables"}
    return {"size": size, "mode": "ipvs", "addresses": variant}


def variant_of(result: dict[str, Any]) -> str:
    """A measurement's variant: "nftables", or IPVS mode's way of service addresses."""
    return str(result.get("addresses", "nftables")) if result["mode"] == "ipvs" else "nftables"


def guest(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    kernel = platform.release()
    log = sys.stderr
    print(f"kernel {kernel}, {os.cpu_count()} CPU, Python {platform.python_version()}", file=log)
    # Warm-up, discarded: the first nft batch of a boot makes the kernel load the nf_tables
    # expression modules (modprobe from the initramfs), which would count against whichever
    # mode came first.
    print("... warm-up: 50 services, both modes (discarded)", file=log, flush=True)
    warm = argparse.Namespace(**{**vars(args), "changes": 1, "resync": False})
    variants = ["nftables", *args.ways]
    for variant in ("nftables", args.ways[0]):
        run_measure(50, variant, warm)
    results = []
    for size in args.size_list:
        for variant in variants:
            print(f"... {size} services, {variant}", file=log, flush=True)
            r = run_measure(size, variant, args)
            cold = r.get("cold", {})
            print(
                f"    cold {cold.get('wall_s', 0):.1f} s"
                f"{'' if cold.get('finished', True) else ' (interrupted)'}, "
                f"process {r.get('process_s', 0):.1f} s, then idle after"
                f" {r.get('settle_s', 0):.1f} s {r.get('error', '')}",
                file=log,
                flush=True,
            )
            results.append(r)
    profiles = []
    if args.profile:  # a run of its own: the profiler slows Python down about twofold
        size = args.size_list[0]
        for way in args.ways:
            print(f"... {size} services, ipvs {way}, cold sync under cProfile", file=log)
            profiles.append(run_measure(size, way, args, profile=True))
    data = {
        "kernel": kernel,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "table": IMPLEMENTATION,
        "endpoints": args.endpoints,
        "sizes": args.size_list,
        "ways": args.ways,
        "timeout_s": args.timeout,
        "netns_per_call": args.netns_per_call,
        "results": results,
        "profiles": profiles,
        "guest_s": time.monotonic() - t0,
    }
    print(MARK + json.dumps(data), flush=True)
    return 0


# --- on the host: boot the VM, run the worker, print the report -------------------------------


def host(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(REPO))
    from tests.vm.harness import Job, VmError, VmUnavailable, run_jobs

    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--sizes",
        args.sizes,
        "--endpoints",
        str(args.endpoints),
        "--changes",
        str(args.changes),
        "--timeout",
        str(args.timeout),
        "--addresses",
        ",".join(args.ways),
        *(["--no-resync"] if not args.resync else []),
        *(["--profile"] if args.profile else []),
        *(["--netns-per-call"] if args.netns_per_call else []),
    ]
    # A safety net only: every sync is bounded by --timeout inside the VM.
    runs = len(args.size_list) * (1 + len(args.ways))
    deadline = 300 + runs * (2 * args.timeout + 600)
    print(
        f"bench_ipvs: booting the IPVS VM (qemu TCG) for {args.sizes} services; this takes minutes",
        file=sys.stderr,
        flush=True,
    )
    commit = _commit()  # at the start: the measuring processes load the code as it is now
    t0 = time.monotonic()
    try:
        # The guest gets only LACE_PROXY_* from here: without PYTHONPATH, the venv's editable
        # install would import the checkout it was installed from, not this one.
        job = Job(argv, {"PYTHONPATH": str(REPO)}, cwd=str(REPO))
        [result] = run_jobs([job], timeout=deadline)
    except (VmUnavailable, VmError) as exc:
        print(f"bench_ipvs: the VM did not run: {exc}", file=sys.stderr)
        return 2
    lines = [line for line in result.output.splitlines() if line.startswith(MARK)]
    if not lines:
        print(f"bench_ipvs: no result from the VM\n{result.report()}", file=sys.stderr)
        return 1
    if args.verbose:
        print(result.output, file=sys.stderr)
    data = json.loads(lines[-1][len(MARK) :])
    data["boot_s"] = result.boot_seconds
    data["total_s"] = time.monotonic() - t0
    data["commit"] = commit
    data["summary"] = summarize(data)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print_report(data)
    return 0


def _commit() -> str:
    """The checkout's commit, marked when the dataplane has uncommitted changes."""

    def git(*args: str) -> str:
        proc = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
        return proc.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "lace_proxy/dataplane")
    return f"{head}{' + uncommitted dataplane changes' if dirty else ''}"


def _why_not(r: dict[str, Any]) -> str:
    """Why a measurement after the cold sync is missing."""
    if "error" in r:
        return "failed"
    if not r.get("cold", {}).get("finished", True):
        return "cold sync interrupted at --timeout"
    if "Out of memory" in r.get("error_after_cold", ""):
        return "nft killed by the OOM killer, the VM has 1 GiB"
    if "error_after_cold" in r:
        return "stopped: " + r["error_after_cold"].split(":")[0]
    return "not measured"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


#: How the report names IPVS mode with each way of making service addresses local.
WAY_NAMES = {"interface": "IPVS iface", "localRoutes": "IPVS routes"}


def summarize(data: dict[str, Any]) -> dict[str, dict[str, dict[str, float | None]]]:
    """Per size and IPVS way: cold sync, one change's median and the full syncs with nothing
    changed, in seconds, against nftables mode's (the ratios)."""
    by = {(r["size"], variant_of(r)): r for r in data["results"]}
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for size in data["sizes"]:
        n = by.get((size, "nftables"), {})
        for way in data["ways"]:
            i = by.get((size, way), {})
            row: dict[str, float | None] = {}
            for what, key in (
                ("cold", "wall_s"),
                ("change", "median_s"),
                ("periodic", "wall_s"),
                ("resync", "wall_s"),
            ):
                a, b = (_finished(r.get(what, {}), key) for r in (i, n))
                row[f"ipvs_{what}_s"], row[f"nft_{what}_s"] = a, b
                row[f"ratio_{what}"] = a / b if a is not None and b else None
            out.setdefault(str(size), {})[way] = row
    return out


def _finished(part: dict[str, Any], key: str) -> float | None:
    """A measurement's figure, if it finished (a change has no `finished`: always)."""
    return part.get(key) if part.get("finished", True) else None


def print_report(data: dict[str, Any]) -> None:
    w = print
    by = {(r["size"], variant_of(r)): r for r in data["results"]}
    ways = data["ways"]
    w(
        f"lace-proxy IPVS benchmark: IPVS mode vs nftables mode, {data['endpoints']} "
        "endpoints/service, in the test VM"
    )
    w(
        f"  kernel {data['kernel']} (Debian cloud kernel) under qemu TCG, {data['cpus']} vCPU; "
        f"Python {data['python']}, table {data['table']}"
    )
    w(
        "  TCG emulates every instruction: absolute figures are many times slower than on "
        "hardware. The ratio IPVS/nftables, measured side by side, is the point."
    )
    how = "namespace named per call" if data["netns_per_call"] else "process inside it"
    w(f"  each (size, mode) in a fresh network namespace ({how}); checkout {data.get('commit')}")
    w(
        "  IPVS mode's service addresses: "
        + "; ".join(
            {
                "interface": "IPVS iface = on the dummy interface (lace.ipvs.serviceAddresses "
                "interface, kube-proxy's way)",
                "localRoutes": "IPVS routes = local routes in the local table (localRoutes)",
            }[way]
            for way in ways
        )
    )
    for r in data["results"]:
        name = f"{r['size']} {WAY_NAMES.get(variant_of(r), 'nftables')}"
        if "error" in r:
            w(f"  {name}: FAILED: {r['error'].strip()}")
        if "error_after_cold" in r:
            w(
                f"  {name}: stopped after the cold sync: "
                f"{r['error_after_cold']} (peak RSS: Python {r['rss_mib']['self']:.0f} MiB, "
                f"nft {r['rss_mib']['nft']:.0f} MiB; the VM has 1 GiB)"
            )
    w("")
    w("Cold programming: full_sync into the empty namespace")
    w(
        f"{'services':>8} {'plans':>6} {'mode':<11} {'cold':>9} = {'nft':>8} + {'IPVS':>8}  "
        f"{'/nftables':>9}   IPVS part: {'addresses':>9} {'services':>9} {'user':>8} "
        f"{'sys':>8} {'ops':>7}"
    )
    for size in data["sizes"]:
        n = by.get((size, "nftables"), {})
        if "cold" not in n:
            continue
        nc = n["cold"]
        nft_cold = fmt_t(nc["wall_s"]) if nc["finished"] else f">{fmt_t(nc['wall_s'])}"
        w(f"{size:>8} {n['plans']:>6} {'nftables':<11} {nft_cold:>9}")
        for way in ways:
            i = by.get((size, way), {})
            if "cold" not in i:
                continue
            ic = i["cold"]
            late = "" if ic["finished"] else ">"
            w(
                f"{'':>8} {'':>6} {WAY_NAMES[way]:<11} {late + fmt_t(ic['wall_s']):>9} = "
                f"{fmt_t(ic['nft_s']):>8} + {fmt_t(ic['ipvs_s']):>8}  "
                f"{late + _ratio(ic['wall_s'], nc['wall_s']):>9}   {'':>11}"
                f"{fmt_t(ic['addresses_s']):>9} {fmt_t(ic['services_s']):>9} "
                f"{fmt_t(ic['ipvs_user_s']):>8} {fmt_t(ic['ipvs_sys_s']):>8} "
                f"{ic['ops'] if ic['ops'] is not None else '-':>7}"
            )
            if not ic["finished"]:
                held, exp = ic["held"], i["expected"]
                predicted = ic.get("predicted_s")
                w(
                    f"{'':>27} interrupted at --timeout {data['timeout_s']:.0f} s: "
                    f"{held['services']} of {exp['services']} virtual services, "
                    f"{held['servers']} of {exp['servers']} real servers programmed"
                    + (
                        f"; at that rate ~{fmt_t(predicted)} in all, "
                        f"~{_ratio(predicted, nc['wall_s'])} nftables"
                        if predicted
                        else ""
                    )
                )
            if "addresses_user_s" in ic:
                w(
                    f"{'':>27} IPVS part's CPU, user / sys: addresses "
                    f"{fmt_t(ic['addresses_user_s'])} / {fmt_t(ic['addresses_sys_s'])}, "
                    f"services {fmt_t(ic['services_user_s'])} / {fmt_t(ic['services_sys_s'])}"
                )
    w(
        "  IPVS part: addresses = the service addresses (the dummy's, or the local routes), "
        "services = virtual services and real servers; user/sys = this process's CPU in "
        "Python / in the kernel"
    )
    w("")
    runs = next((r["change"]["runs"] for r in data["results"] if "change" in r), 0)
    w(
        "One endpoint change to the kernel: upsert slice, build, apply, commit; "
        f"median [p99] of {runs}"
    )
    w(
        f"{'services':>8} {'mode':<11} {'median':>9} {'[p99]':>9} = {'nft':>8} + {'IPVS':>8}  "
        f"{'/nftables':>9}  {'IPVS ops':>8}"
    )
    for size in data["sizes"]:
        n = by.get((size, "nftables"), {})
        nc = n.get("change", {})
        if nc:
            w(f"{size:>8} {'nftables':<11} {fmt_t(nc['median_s']):>9} {fmt_t(nc['p99_s']):>9}")
        for way in ways:
            i = by.get((size, way), {})
            if "change" not in i:
                w(f"{size:>8} {WAY_NAMES[way]:<11} {'-':>9}   ({_why_not(i)})")
                continue
            ic = i["change"]
            w(
                f"{size:>8} {WAY_NAMES[way]:<11} {fmt_t(ic['median_s']):>9} "
                f"{fmt_t(ic['p99_s']):>9} = {fmt_t(ic['nft_s']):>8} + {fmt_t(ic['ipvs_s']):>8}  "
                f"{_ratio(ic['median_s'], nc.get('median_s')):>9}  {ic['ipvs_ops']:>8.0f}"
            )
    titles = {
        "periodic": "Periodic full sync, nothing changed (changes applied, the structure checked)",
        "resync": "Verified full sync, nothing changed (everything read back, as every "
        "verify_every-th periodic one and a restart's adoption)",
    }
    for key, title in titles.items():
        if any(key in r for r in data["results"]):
            _resync_table(w, data, by, key, title)
    w("")
    w("Sanity after the cold sync: ipvsadm -Ln and the service addresses vs Wanted")
    for size in data["sizes"]:
        for way in ways:
            i = by.get((size, way), {})
            if "cold" not in i:
                continue
            held, exp = i["cold"]["held"], i["expected"]
            status = (
                "match"
                if held == exp
                else ("partial (interrupted)" if not i["cold"]["finished"] else "MISMATCH")
            )
            w(
                f"{size:>8} {WAY_NAMES[way]:<11} virtual services {held['services']}/"
                f"{exp['services']}, real servers {held['servers']}/{exp['servers']}, "
                f"addresses {held['addresses']}/{exp['addresses']}: {status}"
            )
    for r in data.get("profiles", []):
        if "profile" not in r:
            continue
        w("")
        w(
            f"cProfile of the {WAY_NAMES[variant_of(r)]} cold sync at {r['size']} services, a "
            f"run of its own ({fmt_t(r['cold']['wall_s'])} under the profiler, whose cost is "
            "per Python call):"
        )
        w(r["profile"].rstrip())
    w("")
    w("IPVS mode / nftables mode (issue 31: the cold sync at 10k within 1.5x)")
    w(f"{'services':>8} {'mode':<11} {'cold':>9} {'change':>9} {'periodic':>9} {'verified':>9}")
    for size, row in summarize(data).items():
        for way, figures in row.items():
            ratios = [
                _ratio(figures[f"ipvs_{what}_s"], figures[f"nft_{what}_s"])
                for what in ("cold", "change", "periodic", "resync")
            ]
            w(f"{size:>8} {WAY_NAMES[way]:<11} " + " ".join(f"{r:>9}" for r in ratios))
    w("")
    w(
        f"VM: boot {data.get('boot_s', 0):.1f} s, measurements {data['guest_s']:.0f} s, "
        f"total {data.get('total_s', data['guest_s']):.0f} s"
    )


def _resync_table(
    w: Callable[[str], None],
    data: dict[str, Any],
    by: dict[tuple[int, str], dict[str, Any]],
    key: str,
    title: str,
) -> None:
    """The table of one kind of full sync with nothing changed (`key`: periodic, resync)."""
    w("")
    w(title)
    w(
        f"{'services':>8} {'mode':<11} {'wall':>9} = {'nft':>8} + {'IPVS':>8}  {'/nftables':>9}"
        f"   IPVS part: {'dump':>8} {'diff':>8} {'addresses':>9} {'other':>8}  {'IPVS ops':>8}"
    )
    for size in data["sizes"]:
        n = by.get((size, "nftables"), {})
        if key in n:
            late = "" if n[key]["finished"] else ">"
            w(f"{size:>8} {'nftables':<11} {late + fmt_t(n[key]['wall_s']):>9}")
        for way in data["ways"]:
            i = by.get((size, way), {})
            if key not in i:
                w(f"{size:>8} {WAY_NAMES[way]:<11} {'-':>9}   ({_why_not(i)})")
                continue
            ir = i[key]
            late = "" if ir["finished"] else " (interrupted)"
            ratio = _ratio(ir["wall_s"], n.get(key, {}).get("wall_s"))
            w(
                f"{size:>8} {WAY_NAMES[way]:<11} {fmt_t(ir['wall_s']):>9} = "
                f"{fmt_t(ir['nft_s']):>8} + {fmt_t(ir['ipvs_s']):>8}  {ratio:>9}   {'':>11}"
                f"{fmt_t(ir['dump_s']):>8} {fmt_t(ir['services_s']):>8} "
                f"{fmt_t(ir.get('addresses_s')):>9} {fmt_t(ir.get('other_s')):>8}  "
                f"{ir['ops'] if ir['ops'] is not None else '-':>8}{late}"
            )
    w(
        "  dump = reading IPVS back (netlink dumps: the services, each one's real servers), "
        "diff = converging, addresses = the service addresses read back (the namespace's "
        "addresses, the local routes); IPVS ops > 0 means the diff against the dump was not "
        "empty"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000", help="services, comma-separated")
    parser.add_argument("--endpoints", type=int, default=10, help="endpoints per service")
    parser.add_argument("--changes", type=int, default=30, help="single-endpoint changes")
    parser.add_argument(
        "--timeout",
        type=float,
        default=300,
        help="interrupt a cold or full sync still running after this (seconds)",
    )
    parser.add_argument(
        "--no-resync",
        dest="resync",
        action="store_false",
        help="skip the full syncs with nothing changed (periodic, verified)",
    )
    parser.add_argument(
        "--netns-per-call",
        action="store_true",
        help="backends given the namespace's name (ip netns exec per nft call) instead of "
        "running the measuring process inside it",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also cProfile an IPVS cold sync at the smallest size (one more run)",
    )
    parser.add_argument(
        "--addresses",
        default=",".join(SERVICE_ADDRESSES),
        help="IPVS mode's ways of making service addresses local to measure, comma-separated "
        "(lace.ipvs.serviceAddresses: interface, localRoutes; default: both)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("-v", "--verbose", action="store_true", help="show the VM job's log")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--measure", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--netns", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.size_list = sorted(int(s) for s in args.sizes.split(",") if s.strip())
    args.ways = [w.strip() for w in args.addresses.split(",") if w.strip()]
    if not args.ways or set(args.ways) - set(SERVICE_ADDRESSES):
        parser.error(f"--addresses: a comma-separated choice of {', '.join(SERVICE_ADDRESSES)}")

    if args.measure:
        print(json.dumps(measure(args)), flush=True)
        return 0
    if args.worker:
        return guest(args)
    return host(args)


if __name__ == "__main__":
    sys.exit(main())
