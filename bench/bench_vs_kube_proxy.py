"""kube-proxy v1.37.2 and lace-proxy side by side, both in nftables mode, on the same apiserver.

    .venv/bin/python bench/bench_vs_kube_proxy.py [--sizes 1000,10000,30000] [--updates 200]
        [--limit 300] [--gap 1.2] [--json]

One real etcd + kube-apiserver (testkit.controlplane) holds 1k, then 10k, then 30k ClusterIP
Services, each with one EndpointSlice of 10 ready endpoints over 100 other nodes (in one
Service of 20 one endpoint is on kube-proxy's node, in another one on lace-proxy's); it grows
between sizes. Each proxy has a network namespace of its own, reaching the apiserver over a veth
(testkit.kubeproxy.ApiLink), and its own Node with that address. Both read the same
KubeProxyConfiguration (mode nftables, syncPeriod 30s, minSyncPeriod 1s: upstream's
defaults) with an admin kubeconfig. They run one at a time, kube-proxy first, each alone on
the machine with the apiserver (2 cores shared would distort both); between runs the
namespace's ruleset is flushed, so every run starts from an empty kernel.

Per proxy and size, seen from the kernel and from the cgroups, never from the proxies' own
metrics:

- start → first full sync: from spawning the process until every Service's ClusterIP key
  (`ip . tcp . 80`) is where the proxy dispatches ClusterIPs from (`ip kube-proxy`: the map
  `service-ips`; `inet lace-proxy`: the set of the service's kind, `frontends-lb-v4` for
  these, or the map `service-ips-v4`). Polled every 0.2 s with netlink lookups of a sample of
  keys (not `nft get element`, which fetches every set first: 4 s at 10k Services under
  kube-proxy), then confirmed by listing those sets and maps whole; the time is the end of
  the lookup that found them (resolution: the poll interval). Not reached within `--limit`
  seconds: "> limit", and the updates are skipped. Once per run the detection is held to
  `nft list ruleset`: a ClusterIP key in a set or map the probe does not ask (the proxy's
  layout moved, as lace-proxy's did from `service-ips-v4` to `frontends-*`) is reported as a
  bench error and the bench exits 1.
- update → kernel: `--updates` times, one at a time about `--gap` seconds apart (more than
  minSyncPeriod, so neither proxy's rate limit is what is measured), one endpoint address of
  a random Service's EndpointSlice is replaced by a fresh one (JSON patch). The time runs from
  the PATCH's response (the API accepted it) to the first nftables notification in the
  namespace carrying the new address (the kernel has committed it): the netlink group `nft
  monitor` reads, read raw by a thread that timestamps each message as it arrives (nft's
  monitor first caches the whole ruleset: over 20 s at 10k Services under kube-proxy).
  Median and p99 (nearest rank); an update not seen within 30 s counts as "> 30 s".
- memory: each proxy runs in a memory and a cpuacct cgroup (v1) of its own, joined before
  exec, so `nft` children and threads are counted. Peak RSS = the highest sum of VmRSS over
  the cgroup's processes, sampled every 50 ms over the run (as `ps` counts: the mapped
  binary and libraries included, which the cgroup's own rss/mapped_file miss when another
  cgroup read them first). Also printed: the main process's exact peak (VmHWM), and the
  cgroup's exact peak of charged memory (memory.max_usage_in_bytes: no shared file pages
  charged elsewhere, but page cache and kernel memory, the nftables objects included).
- CPU: cpuacct.usage (user + system of the whole tree) at the first sync and at the end.
- kernel objects: after the run, `nft -j list ruleset` in the namespace (everything in it is
  the proxy's): chains, rules, sets and maps (named and anonymous) and their elements.
- lace-proxy's memory: the `kube` source alone (a subprocess listing and watching the same
  API into a handler that keeps every parsed object, as the proxy's tracker does) against
  the proxy's main process peak.

Each figure is printed for both proxies with the ratio lace-proxy / kube-proxy. Needs root,
cgroup v1 (memory, cpuacct), ip, nft, and the control plane built (python -m
testkit.controlplane.build). Takes about 15 minutes for 1k + 10k at the defaults (each run
about 4.5 minutes, most of it the paced updates), plus about 12 for 30k. Leaves no
namespace, veth, cgroup or process behind, also on Ctrl-C (a SIGKILLed run's leftovers are
swept by the next). Benchmarks never assert: this prints figures and ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import errno
import functools
import ipaddress
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, TextIO

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # testkit: test support, not shipped

from lace_proxy.dataplane.nftables.skeleton import FRONTEND_KINDS  # noqa: E402
from lace_proxy.model import EndpointSlice, LaceObject, Node, Service, ServiceCIDR  # noqa: E402
from testkit.controlplane.build import Binaries, binaries, is_built  # noqa: E402
from testkit.controlplane.cluster import ControlPlane  # noqa: E402
from testkit.kubeproxy import (  # noqa: E402
    ApiLink,
    KubeProxy,
    Netns,
    kube_proxy_config,
    node_object,
    remove_stale,
    ruleset,
)
from testkit.process import spawn, stop, tail  # noqa: E402

ENDPOINTS = 10
OTHER_NODES = 100
LOCAL_EVERY = 20  # one Service in 20 has an endpoint on each proxy's node
PER_NAMESPACE = 1000
PORT, TARGET_PORT = 80, 8080
SERVICE_BASE = ipaddress.IPv4Address("10.96.1.0")  # inside the control plane's 10.96.0.0/16
SYNC = {"nftables": {"syncPeriod": "30s", "minSyncPeriod": "1s"}}
FILL_CONCURRENCY = 32
POLL = 0.2  # seconds between first-sync probes
SAMPLE = 0.05  # seconds between memory samples
SENTINELS = 32  # ClusterIP keys per first-sync probe
SETTLE = 2.0  # after the first sync, before the updates (IPv6 table, egress, token buckets)
UPDATE_TIMEOUT = 30.0
MISSES_IN_A_ROW = 3  # then the updates stop: the proxy is not following
CGROUP_ROOTS = (Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup/cpuacct"))
CGROUP_PATTERN = re.compile(r"lace-bench-([0-9a-f]+)-.+")
LACE_PROXY = Path(sys.executable).parent / "lace-proxy"
MIB = 1 << 20

# Netlink, for ElementProbe and Monitor (linux/netlink.h, netfilter/nf_tables.h).
NETLINK_NETFILTER, SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, SO_RCVBUFFORCE = 12, 270, 1, 33
NLM_F_REQUEST, NLM_F_ACK, NLMSG_ERROR, NLA_F_NESTED = 1, 4, 2, 0x8000
NFNL_SUBSYS_NFTABLES, NFNLGRP_NFTABLES, NFT_MSG_GETSETELEM = 10, 7, 13
NFTA_SET_ELEM_LIST_TABLE, NFTA_SET_ELEM_LIST_SET, NFTA_SET_ELEM_LIST_ELEMENTS = 1, 2, 3
NFTA_LIST_ELEM = NFTA_SET_ELEM_KEY = NFTA_DATA_VALUE = 1
NFPROTO = {"inet": 1, "ip": 2, "ip6": 10}
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Proxy:
    """One proxy under test, and where its nftables table keeps the ClusterIPs: the sets and
    maps (kind, name) that send a ClusterIP's key to its endpoints."""

    name: str
    family: str
    table: str
    containers: tuple[tuple[str, str], ...]
    node: str


PROXIES = (
    Proxy("kube-proxy", "ip", "kube-proxy", (("map", "service-ips"),), "node-kube-proxy"),
    Proxy(
        "lace-proxy",
        "inet",
        "lace-proxy",
        # A plain service's frontend is in the set of its kind; service-ips only holds the
        # rare per-service chains' (ClientIP affinity). check_detection holds this to nft.
        (*(("set", f"frontends-{kind}-v4") for kind in FRONTEND_KINDS), ("map", "service-ips-v4")),
        "node-lace-proxy",
    ),
)


# --- the cluster ----------------------------------------------------------------------------


def namespace(i: int) -> str:
    return f"bench-{i // PER_NAMESPACE:02d}"


def service_name(i: int) -> str:
    return f"svc-{i:05d}"


def cluster_ip(i: int) -> str:
    return str(SERVICE_BASE + i)


def _pod(n: int) -> str:
    """The n-th endpoint address, in 10.128.0.0/9 (250 per /24)."""
    block = n // 250
    return f"10.{128 + block // 256}.{block % 256}.{n % 250 + 1}"


def _fresh_addresses() -> Iterator[str]:
    """Update addresses: never used before in this run, so each is seen once in the kernel."""
    for n in range(250 * 256):
        yield f"10.200.{n // 250}.{n % 250 + 1}"


def _node_of(i: int, k: int) -> str:
    if k == 0 and i % LOCAL_EVERY < len(PROXIES):
        return PROXIES[i % LOCAL_EVERY].node
    return f"node-{(i + k) % OTHER_NODES:03d}"


def service_body(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": service_name(i), "namespace": namespace(i)},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": cluster_ip(i),
            "ports": [{"name": "http", "port": PORT, "targetPort": TARGET_PORT}],
        },
    }


def slice_body(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{service_name(i)}-a",
            "namespace": namespace(i),
            "labels": {"kubernetes.io/service-name": service_name(i)},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": TARGET_PORT, "protocol": "TCP"}],
        "endpoints": [
            {
                "addresses": [_pod(i * ENDPOINTS + k)],
                "conditions": {"ready": True, "serving": True, "terminating": False},
                "nodeName": _node_of(i, k),
            }
            for k in range(ENDPOINTS)
        ],
    }


async def fill(cp: ControlPlane, start: int, stop: int) -> None:
    """Create Services [start, stop) and their slices, FILL_CONCURRENCY requests at a time."""
    context = ssl.create_default_context(cafile=str(cp.pki / "ca.crt"))
    context.load_cert_chain(cp.pki / "admin.crt", cp.pki / "admin.key")
    connector = aiohttp.TCPConnector(ssl=context, limit=FILL_CONCURRENCY)
    async with aiohttp.ClientSession(cp.url, connector=connector) as session:

        async def post(path: str, body: dict[str, Any], ok: tuple[int, ...] = (201,)) -> None:
            async with session.post(path, json=body) as reply:
                if reply.status not in ok:
                    raise RuntimeError(f"POST {path}: {reply.status} {await reply.text()}")

        for n in range(start // PER_NAMESPACE, (stop - 1) // PER_NAMESPACE + 1):
            name = namespace(n * PER_NAMESPACE)
            await post("/api/v1/namespaces", {"metadata": {"name": name}}, ok=(201, 409))
        indexes = iter(range(start, stop))

        async def worker() -> None:
            for i in indexes:  # shared: each index is taken by one worker
                ns = namespace(i)
                await post(f"/api/v1/namespaces/{ns}/services", service_body(i))
                await post(
                    f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", slice_body(i)
                )

        await asyncio.gather(*(worker() for _ in range(FILL_CONCURRENCY)))


def patch_endpoint(api: Any, i: int, address: str) -> float:
    """Replace endpoint 0 of Service i's slice; returns when the API accepted it (monotonic)."""
    path = f"/apis/discovery.k8s.io/v1/namespaces/{namespace(i)}/endpointslices/{service_name(i)}-a"
    request = api.param_serialize(
        "PATCH",
        path,
        header_params={"Content-Type": "application/json-patch+json", "Accept": "application/json"},
        body=[{"op": "replace", "path": "/endpoints/0/addresses", "value": [address]}],
        auth_settings=["BearerToken"],
    )
    response = api.call_api(*request, _request_timeout=(5, 30))
    accepted = time.monotonic()
    response.read()
    if response.status != 200:
        raise RuntimeError(f"PATCH {path}: {response.status} {response.data!r}")
    return accepted


# --- the kernel ---------------------------------------------------------------------------------


def _nft(netns: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = ["ip", "netns", "exec", netns, "nft", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)


def _netlink_in(netns: str, groups: tuple[int, ...] = ()) -> socket.socket:
    """A netfilter netlink socket inside `netns` (made by a thread that enters it: sockets
    keep their namespace, threads' moves stay their own), joined to `groups`."""
    made: list[socket.socket | BaseException] = []

    def enter() -> None:
        try:
            fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {netns}")
            finally:
                os.close(fd)
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 64 * MIB)
            sock.bind((0, 0))
            for group in groups:
                sock.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, group)
            made.append(sock)
        except BaseException as exc:
            made.append(exc)

    thread = threading.Thread(target=enter, name=f"enter-{netns}")
    thread.start()
    thread.join()
    if isinstance(made[0], BaseException):
        raise made[0]
    return made[0]


def _nla(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    size = 4 + len(payload)
    return struct.pack("=HH", size, kind) + payload + b"\0" * (-size % 4)


def _service_key(i: int) -> bytes:
    """The map key `ClusterIP . tcp . 80` as the kernel holds it (each field in a 32-bit
    register: 4 address bytes, the protocol byte, the port big-endian, zero-padded)."""
    address = ipaddress.IPv4Address(cluster_ip(i)).packed
    return address + struct.pack("=B3x", socket.IPPROTO_TCP) + struct.pack(">H2x", PORT)


class ElementProbe:
    """Asks the kernel whether the proxy's ClusterIP sets and maps hold given keys: one netlink
    GETSETELEM per key and container, a hash lookup each. (`nft get element` fetches every
    set's elements first: 4 s at 10k Services under kube-proxy, which would steal a core
    from the proxy.)"""

    def __init__(self, netns: str, proxy: Proxy) -> None:
        self.sock = _netlink_in(netns)
        self.sock.settimeout(10.0)
        self.family = NFPROTO[proxy.family]
        table = _nla(NFTA_SET_ELEM_LIST_TABLE, proxy.table.encode() + b"\0")
        self.containers = [
            table + _nla(NFTA_SET_ELEM_LIST_SET, name.encode() + b"\0")
            for _kind, name in proxy.containers
        ]
        self.seq = 0

    def holds(self, indexes: list[int]) -> bool:
        """True when every key is in one of the containers."""
        return all(any(self._lookup(c, i) for c in self.containers) for i in indexes)

    def _lookup(self, names: bytes, i: int) -> bool:
        """Whether one container holds Service i's key; a missing key, set or table is False
        (ENOENT)."""
        key = _nla(NLA_F_NESTED | NFTA_SET_ELEM_KEY, _nla(NFTA_DATA_VALUE, _service_key(i)))
        elements = _nla(NLA_F_NESTED | NFTA_LIST_ELEM, key)
        body = struct.pack("=BBH", self.family, 0, 0) + names
        body += _nla(NLA_F_NESTED | NFTA_SET_ELEM_LIST_ELEMENTS, elements)
        self.seq += 1
        kind = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETSETELEM
        header = struct.pack("=IHHII", 16 + len(body), kind, NLM_F_REQUEST | NLM_F_ACK, self.seq, 0)
        self.sock.send(header + body)
        while True:  # the element if found, then the acknowledgement (0 or -ENOENT)
            data = self.sock.recv(1 << 20)
            offset = 0
            while offset + 16 <= len(data):
                size, kind, _flags, seq, _pid = struct.unpack_from("=IHHII", data, offset)
                if kind == NLMSG_ERROR and seq == self.seq:
                    return struct.unpack_from("=i", data, offset + 16)[0] == 0
                offset += max(16, (size + 3) & ~3)

    def close(self) -> None:
        self.sock.close()


def _element_keys(elements: list[Any]) -> Iterator[tuple[Any, ...]]:
    """The concatenated keys of a set's or map's elements as `nft -j` lists them (a map's
    element is [key, value]; an element with options is {"elem": {"val": key, ...}})."""
    for element in elements:
        key = element[0] if isinstance(element, list) else element
        if isinstance(key, dict) and "elem" in key:
            key = key["elem"]["val"]
        if isinstance(key, dict) and "concat" in key:
            yield tuple(key["concat"])


def holds_all(netns: str, proxy: Proxy, size: int) -> bool:
    """Whether the containers have every Service's key between them (lists each whole)."""
    keys: set[tuple[Any, ...]] = set()
    for kind, name in proxy.containers:
        listed = _nft(netns, "-j", "list", kind, proxy.family, proxy.table, name)
        if listed.returncode != 0:
            continue
        for obj in json.loads(listed.stdout)["nftables"]:
            keys.update(_element_keys(obj.get(kind, {}).get("elem", [])))
    return all((cluster_ip(i), "tcp", PORT) in keys for i in range(size))


def check_detection(proxy: Proxy, objects: list[dict[str, Any]], size: int) -> str | None:
    """Hold the first-sync detection to `nft list ruleset` (once per run, on the objects
    listed after it): every Service's ClusterIP key found in any set or map of the proxy's
    table must be in the containers the probe asks. None if so, else what it misses where
    (the probe would wait for keys the proxy put elsewhere)."""
    wanted = {(cluster_ip(i), "tcp", PORT) for i in range(size)}
    probed = {name for _kind, name in proxy.containers}
    found: dict[str, set[tuple[Any, ...]]] = {}
    for obj in objects:
        for kind in ("set", "map"):
            body = obj.get(kind)
            if body is not None and (body["family"], body["table"]) == (proxy.family, proxy.table):
                keys = wanted.intersection(_element_keys(body.get("elem", [])))
                if keys:
                    found[body["name"]] = keys
    seen = set().union(*(keys for name, keys in found.items() if name in probed))
    missed = {name: len(keys - seen) for name, keys in found.items() if keys - seen}
    if not missed:
        return None
    where = ", ".join(f"{count:,} in {name}" for name, count in sorted(missed.items()))
    return (
        f"{proxy.name}: the first-sync probe asks {', '.join(sorted(probed))}, but nft lists "
        f"ClusterIP keys it never asks for: {where}"
    )


def _anonymous_sets(expr: Any) -> Iterator[int]:
    """The element counts of the anonymous sets and maps inside a rule's expression."""
    if isinstance(expr, dict):
        for key, value in expr.items():
            if key == "set" and isinstance(value, list):
                yield len(value)
            else:
                yield from _anonymous_sets(value)
    elif isinstance(expr, list):
        for item in expr:
            yield from _anonymous_sets(item)


def count_objects(objects: list[dict[str, Any]]) -> dict[str, int]:
    """Tables, chains, rules, sets (named and anonymous) and their elements."""
    counts: Counter[str] = Counter()
    for obj in objects:
        for kind, body in obj.items():
            if kind in ("table", "chain", "rule"):
                counts[f"{kind}s"] += 1
            if kind in ("set", "map"):
                counts["sets"] += 1
                counts["elements"] += len(body.get("elem", []))
            if kind == "rule":
                for elements in _anonymous_sets(body.get("expr", [])):
                    counts["sets"] += 1
                    counts["elements"] += elements
    keys = ("tables", "chains", "rules", "sets", "elements")
    out = {key: counts[key] for key in keys}
    out["total"] = sum(out.values())
    return out


def objects_by_table(objects: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """count_objects per table ("family name"), for the JSON report."""
    tables: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        for body in obj.values():
            name = f"{body['family']} {body.get('table', body.get('name'))}"
            tables.setdefault(name, []).append(obj)
    return {name: count_objects(objs) for name, objs in sorted(tables.items())}


class Monitor:
    """The namespace's nftables notifications (what `nft monitor` prints, read raw: nft's
    monitor first caches the whole ruleset, over 20 s at 10k Services under kube-proxy):
    when each awaited endpoint address first reached the kernel, committed.

    An address is seen when a notification carries it as an attribute value (NFTA_DATA_VALUE,
    e.g. a map element's `address . port` data or a rule's DNAT map): kube-proxy writes it in
    the Service chain's rule, lace-proxy in a map element. A reader thread timestamps each
    datagram as it arrives."""

    def __init__(self, netns: str) -> None:
        self.sock = _netlink_in(netns, groups=(NFNLGRP_NFTABLES,))
        self.sock.settimeout(0.2)
        self.seen: dict[bytes, float] = {}
        self.awaited: set[bytes] = set()
        self.overruns = 0  # ENOBUFS: notifications lost (the reader fell behind)
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read, name="nft-monitor", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
                self.overruns += 1
                continue
            now = time.monotonic()
            with self._changed:
                found = [a for a in self.awaited if _carries(data, a)]
                for address in found:
                    self.awaited.discard(address)
                    self.seen[address] = now
                if found:
                    self._changed.notify_all()

    def expect(self, address: str) -> bytes:
        """Watch for `address` (call before the change that brings it)."""
        packed = ipaddress.IPv4Address(address).packed
        with self._changed:
            self.awaited.add(packed)
        return packed

    def wait_for(self, packed: bytes, timeout: float) -> float | None:
        """When it was first seen (monotonic), waiting up to `timeout`; None if not."""
        with self._changed:
            self._changed.wait_for(lambda: packed in self.seen, timeout)
            self.awaited.discard(packed)
            return self.seen.get(packed)

    def close(self) -> None:
        self._stop.set()
        self._reader.join()
        self.sock.close()

    def __enter__(self) -> Monitor:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _carries(data: bytes, packed: bytes) -> bool:
    """Whether a netlink datagram holds `packed` at the start of an NFTA_DATA_VALUE."""
    start = data.find(packed)
    while start >= 4:
        if struct.unpack_from("=H", data, start - 2)[0] == NFTA_DATA_VALUE:
            return True
        start = data.find(packed, start + 1)
    return False


# --- cgroups ------------------------------------------------------------------------------------


def _pids(group: Path) -> list[int]:
    try:
        return [int(p) for p in (group / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _remove_cgroup(group: Path) -> None:
    """Kill what is left in it (children of a proxy we started), then remove it."""
    deadline = time.monotonic() + 10
    while (pids := _pids(group)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    with contextlib.suppress(FileNotFoundError):
        group.rmdir()


def sweep_stale_cgroups() -> None:
    """Remove cgroups of earlier runs whose process is gone."""
    for root in CGROUP_ROOTS:
        for group in root.glob("lace-bench-*"):
            match = CGROUP_PATTERN.fullmatch(group.name)
            if match is None:
                continue
            try:
                os.kill(int(match[1], 16), 0)
            except ProcessLookupError:
                _remove_cgroup(group)


class Cgroups:
    """A memory and a cpuacct cgroup (v1) for one proxy's process tree, with a sampler of the
    tree's resident memory (v1 keeps no peak of it; max_usage adds page cache and kernel)."""

    def __init__(self, name: str) -> None:
        self.dirs = [root / f"lace-bench-{os.getpid():x}-{name}" for root in CGROUP_ROOTS]
        for group in self.dirs:
            group.mkdir()
        self.memory, self.cpuacct = self.dirs
        self.peak_rss = 0
        self.programs: set[str] = set()  # the names of the processes sampled in it
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, name="rss-sampler", daemon=True)
        self._sampler.start()

    def rss(self) -> int:
        """The summed VmRSS of its processes: what `ps` shows, file pages included (the
        cgroup's own counters miss the shared ones another cgroup faulted in first)."""
        total = 0
        for pid in _pids(self.memory):
            total += _status_bytes(pid, "VmRSS") or 0
            with contextlib.suppress(OSError):
                self.programs.add(Path(f"/proc/{pid}/comm").read_text().strip())
        return total

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE):
            self.peak_rss = max(self.peak_rss, self.rss())

    def cpu_seconds(self) -> float:
        return int((self.cpuacct / "cpuacct.usage").read_text()) / 1e9

    def charged_peak(self) -> int:
        return int((self.memory / "memory.max_usage_in_bytes").read_text())

    def stop_sampling(self) -> int:
        """Stop the sampler; the peak RSS seen."""
        self._stop.set()
        self._sampler.join()
        self.peak_rss = max(self.peak_rss, self.rss())
        return self.peak_rss

    def close(self) -> None:
        self.stop_sampling()
        for group in self.dirs:
            _remove_cgroup(group)

    def __enter__(self) -> Cgroups:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _status_bytes(pid: int, field: str) -> int | None:
    """A /proc/PID/status size field (VmHWM, VmRSS) in bytes."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


# --- one proxy, one size --------------------------------------------------------------------------


@dataclass
class Seat:
    """A proxy's network namespace, its veth to the apiserver and its kubeconfig."""

    proxy: Proxy
    netns: Netns
    link: ApiLink
    kubeconfig: Path | None = None


def _start(
    seat: Seat, cgroups: Cgroups, directory: Path, bins: Binaries, stack: contextlib.ExitStack
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start the proxy in its namespace and cgroups; stopped when `stack` closes."""
    assert seat.kubeconfig is not None
    if seat.proxy.name == "kube-proxy":
        kube = KubeProxy(
            seat.netns.name,
            seat.kubeconfig,
            seat.proxy.node,
            extra=SYNC,
            cgroups=cgroups.dirs,
            bins=bins,
        )
        stack.callback(kube.close)
        kube.start()
        assert kube.popen is not None
        return kube.popen, kube.log
    config = directory / "lace-proxy.yaml"
    config.write_text(json.dumps(kube_proxy_config(seat.kubeconfig, seat.proxy.node, extra=SYNC)))
    log = directory / "lace-proxy.log"
    argv = ["ip", "netns", "exec", seat.netns.name, str(LACE_PROXY), "run",
            f"--config={config}", f"--state-socket={directory / 'state.sock'}"]  # fmt: skip
    popen = spawn(argv, log, cgroups.dirs)
    stack.callback(stop, popen)
    return popen, log


class ProxyExited(RuntimeError):
    """The proxy under test exited by itself; the message carries its log's tail."""


def _alive(popen: subprocess.Popen[bytes], log: Path, what: str) -> None:
    if popen.poll() is not None:
        raise ProxyExited(f"{what} exited ({popen.returncode}):\n{tail(log, 15)}")


@dataclass
class Run:
    """One proxy under test: where it runs, how to watch it, where results go."""

    seat: Seat
    size: int
    popen: subprocess.Popen[bytes]
    log: Path
    cgroups: Cgroups
    started: float
    result: dict[str, Any]

    def alive(self) -> None:
        _alive(self.popen, self.log, self.seat.proxy.name)


def first_sync(run: Run, limit: float, rng: random.Random) -> None:
    """Poll until the kernel holds every ClusterIP key, or `limit` seconds have passed."""
    netns, proxy, size = run.seat.netns.name, run.seat.proxy, run.size
    sentinels = sorted({0, size - 1, *rng.sample(range(size), min(SENTINELS, size))})
    probe = ElementProbe(netns, proxy)
    try:
        while time.monotonic() - run.started < limit:
            run.alive()
            if probe.holds(sentinels):
                seen, cpu = time.monotonic(), run.cgroups.cpu_seconds()
                if holds_all(netns, proxy, size):
                    run.result["sync_s"], run.result["cpu_sync_s"] = seen - run.started, cpu
                    return
            time.sleep(POLL)
        run.result["sync_s"] = math.inf
    finally:
        probe.close()


def updates(
    run: Run, args: argparse.Namespace, api: Any, fresh: Iterator[str], rng: random.Random
) -> None:
    """One endpoint replaced at a time; each from the API's acceptance to the kernel."""
    latencies, times = run.result["latencies_s"], run.result["update_times"]
    with Monitor(run.seat.netns.name) as monitor:
        misses = 0
        for _ in range(args.updates):
            i, packed = rng.randrange(run.size), monitor.expect(address := next(fresh))
            accepted = patch_endpoint(api, i, address)
            times.append(time.time() - (time.monotonic() - accepted))
            seen_at = monitor.wait_for(packed, UPDATE_TIMEOUT)
            latencies.append(math.inf if seen_at is None else seen_at - accepted)
            misses = misses + 1 if seen_at is None else 0
            run.alive()
            if misses >= MISSES_IN_A_ROW:
                break
            pause = accepted + args.gap * rng.uniform(0.9, 1.1) - time.monotonic()
            time.sleep(max(0.0, pause))
        run.result["monitor_overruns"] = monitor.overruns


def measure(
    seat: Seat,
    size: int,
    args: argparse.Namespace,
    api: Any,
    fresh: Iterator[str],
    rng: random.Random,
    bins: Binaries,
    workdir: Path,
) -> dict[str, Any]:
    """Start one proxy on an empty kernel, time its first sync, then the updates; its
    resources and kernel objects after it stopped. A proxy that exits is reported, not fatal."""
    netns = seat.netns.name
    result: dict[str, Any] = {
        "proxy": seat.proxy.name,
        "size": size,
        "limit_s": args.limit,
        "sync_s": None,
        "cpu_sync_s": None,
        "latencies_s": [],
        "update_times": [],  # when the API accepted each update (epoch seconds, for the logs)
    }
    directory = workdir / f"{seat.proxy.name}-{size}"
    directory.mkdir()
    with contextlib.ExitStack() as stack:
        cgroups = stack.enter_context(Cgroups(seat.proxy.name))
        stack.callback(_nft, netns, "flush", "ruleset")  # after the proxy has stopped
        started = time.monotonic()
        popen, log = _start(seat, cgroups, directory, bins, stack)
        run = Run(seat, size, popen, log, cgroups, started, result)
        try:
            first_sync(run, args.limit, rng)
            if result["sync_s"] < math.inf:
                time.sleep(SETTLE)
                updates(run, args, api, fresh, rng)
        except ProxyExited as exc:
            result["error"] = str(exc)
        result["cpu_s"] = cgroups.cpu_seconds()
        result["main_peak_bytes"] = _status_bytes(popen.pid, "VmHWM")
        result["main_end_bytes"] = _status_bytes(popen.pid, "VmRSS")
        result["wall_s"] = time.monotonic() - started
        stop(popen)
        if args.logs:
            shutil.copy(log, Path(args.logs) / f"{seat.proxy.name}-{size}.log")
        result["peak_rss_bytes"] = cgroups.stop_sampling()
        result["charged_peak_bytes"] = cgroups.charged_peak()
        result["programs"] = sorted(cgroups.programs)
        objects = ruleset(netns)
        result["detection_error"] = check_detection(seat.proxy, objects, size)
        result["objects"] = count_objects(objects)
        result["objects_by_table"] = objects_by_table(objects)
    return result


# --- the kube source alone (a subprocess) ----------------------------------------------------


class Holder:
    """A change handler that keeps the latest version of every object, as the proxy's change
    tracker does, and stops the source once it has listed everything."""

    def __init__(self, synced: Callable[[], None]) -> None:
        self.objects: dict[tuple[str, str], Any] = {}
        self._synced = synced

    def service_upserted(self, svc: Service) -> None:
        self.objects["Service", svc.key] = svc

    def service_deleted(self, key: str) -> None:
        self.objects.pop(("Service", key), None)

    def slice_upserted(self, sl: EndpointSlice) -> None:
        self.objects["EndpointSlice", sl.key] = sl

    def slice_deleted(self, key: str) -> None:
        self.objects.pop(("EndpointSlice", key), None)

    def node_upserted(self, node: Node) -> None:
        self.objects["Node", node.name] = node

    def node_deleted(self, name: str) -> None:
        self.objects.pop(("Node", name), None)

    def service_cidr_upserted(self, cidr: ServiceCIDR) -> None:
        self.objects["ServiceCIDR", cidr.name] = cidr

    def service_cidr_deleted(self, name: str) -> None:
        self.objects.pop(("ServiceCIDR", name), None)

    def lace_upserted(self, obj: LaceObject) -> None:
        self.objects[obj.kind, obj.key] = obj

    def lace_deleted(self, kind: str, name: str) -> None:
        self.objects.pop((kind, name), None)

    def synced(self, source: str) -> None:
        self._synced()


def source_worker(kubeconfig: str, node: str) -> dict[str, Any]:
    """Run only the `kube` source until it has listed everything; its RSS (on uvloop, as
    `lace-proxy run`)."""
    import uvloop

    from lace_proxy.sources.kube import ApiConnection, KubeSource

    baseline = _status_bytes(os.getpid(), "VmRSS")

    async def listed() -> tuple[float, Holder]:
        done = asyncio.Event()
        holder = Holder(done.set)
        started = time.monotonic()
        await KubeSource(ApiConnection(kubeconfig=kubeconfig), holder, node).run(done)
        return time.monotonic() - started, holder

    seconds, holder = uvloop.run(listed())
    kinds = Counter(kind for kind, _key in holder.objects)
    return {
        "baseline_bytes": baseline,
        "peak_bytes": _status_bytes(os.getpid(), "VmHWM"),
        "end_bytes": _status_bytes(os.getpid(), "VmRSS"),
        "list_s": seconds,
        "objects": dict(kinds),
    }


def measure_source(kubeconfig: Path, node: str) -> dict[str, Any]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--source-worker", str(kubeconfig), node]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"source worker failed:\n{proc.stderr}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


# --- report ---------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """Nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def fmt_s(seconds: float | None, limit: float) -> str:
    """A duration; inf (past its limit) as "> limit", None (not measured) as "-"."""
    if seconds is None:
        return "-"
    if seconds > limit:
        return f"> {limit:.0f} s"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.1f} ms"


def fmt_ratio(lace: float | None, kube: float | None, limit: float = math.inf) -> str:
    """lace / kube; a figure past its limit gives a bound, a missing one nothing."""
    if lace is None or kube is None or not kube or (lace > limit and kube > limit):
        return "-"
    if kube > limit:
        return f"< {lace / limit:.3g}x"
    if lace > limit:
        return f"> {limit / kube:.3g}x"
    return f"{lace / kube:.3g}x"


def fmt_mib(size: int | None) -> str:
    return "-" if size is None else f"{size / MIB:.1f} MiB"


def _row(label: str, kube: str, lace: str, ratio: str) -> str:
    return f"  {label:<44}{kube:>14}{lace:>14}{ratio:>12}"


def print_size(entry: dict[str, Any], out: TextIO) -> None:
    """One size's table: both proxies' figures and lace/kube."""
    w = functools.partial(print, file=out)
    size, fill_s, created = entry["size"], entry["fill_s"], entry["created"]
    kube, lace = entry["runs"]["kube-proxy"], entry["runs"]["lace-proxy"]
    w(
        f"\n{size:,} Services x {ENDPOINTS} endpoints "
        f"(apiserver grown by {created:,} Services + slices in {fill_s:.1f} s, "
        f"{2 * created / fill_s if fill_s else 0:.0f} objects/s)"
    )
    w(_row("", "kube-proxy", "lace-proxy", "lace/kube"))
    limit = kube["limit_s"]
    k, v = kube["sync_s"], lace["sync_s"]
    w(_row("start → first full sync in the kernel", fmt_s(k, limit), fmt_s(v, limit),
           fmt_ratio(v, k, limit)))  # fmt: skip
    counts = f"{len(kube['latencies_s'])}/{len(lace['latencies_s'])}"
    for q, name in ((0.5, "median"), (0.99, "p99")):
        k, v = percentile(kube["latencies_s"], q), percentile(lace["latencies_s"], q)
        w(_row(f"update → kernel, {name} (n={counts})", fmt_s(k, UPDATE_TIMEOUT),
               fmt_s(v, UPDATE_TIMEOUT), fmt_ratio(v, k, UPDATE_TIMEOUT)))  # fmt: skip
    for label, key in (
        ("peak RSS, process tree (sum of VmRSS)", "peak_rss_bytes"),
        ("  main process alone (VmHWM)", "main_peak_bytes"),
        ("  cgroup peak (+ page cache, kernel memory)", "charged_peak_bytes"),
    ):
        k, v = kube[key], lace[key]
        w(_row(label, fmt_mib(k), fmt_mib(v), fmt_ratio(v, k)))
    for label, key in (("CPU, start → first sync", "cpu_sync_s"), ("CPU, whole run", "cpu_s")):
        k, v = kube[key], lace[key]
        shown_k, shown_v = (f"{x:.2f} s" if x is not None else "-" for x in (k, v))
        w(_row(label, shown_k, shown_v, fmt_ratio(v, k)))
    for key in ("chains", "rules", "sets", "elements", "total"):
        k, v = kube["objects"][key], lace["objects"][key]
        label = f"kernel objects: {key}" if key != "total" else "kernel objects, total (+ tables)"
        w(_row(label, f"{k:,}", f"{v:,}", fmt_ratio(v, k)))
    for run in (kube, lace):
        w(f"  {run['proxy']}'s process tree: {', '.join(run['programs'])}")
        if "error" in run:
            w(f"  {run['error']}")
        if run["detection_error"]:
            w(f"  BENCH ERROR, its first sync is misread: {run['detection_error']}")
    source, main_peak, main_end = entry["source"], lace["main_peak_bytes"], lace["main_end_bytes"]
    if main_peak and main_end:
        own = source["peak_bytes"] - source["baseline_bytes"]
        w(
            f"  lace-proxy's memory: main process peak {fmt_mib(main_peak)}, "
            f"{fmt_mib(main_end)} at the end; the kube source alone peaks at "
            f"{fmt_mib(source['peak_bytes'])} = {source['peak_bytes'] / main_peak:.0%} of that "
            f"peak ({fmt_mib(own)} = {own / main_peak:.0%} above the interpreter and imports' "
            f"{fmt_mib(source['baseline_bytes'])}; listing took {source['list_s']:.1f} s)"
        )


def _jsonable(value: Any) -> Any:
    """inf (past its limit) as null: JSON has no infinity."""
    if isinstance(value, float) and math.isinf(value):
        return None
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_jsonable(item) for item in value]
    return value


def machine(bins: Binaries) -> dict[str, Any]:
    def first_line(argv: list[str]) -> str:
        out = subprocess.run(argv, capture_output=True, text=True, check=False)
        return (out.stdout or out.stderr).strip().splitlines()[0]

    with open("/proc/meminfo") as meminfo:
        mem_kib = int(meminfo.readline().split()[1])
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo if "model name" in line), "?")
    return {
        "cores": os.cpu_count(),
        "cpu": model,
        "memory_gib": round(mem_kib / (1 << 20), 1),
        "kernel": platform.release(),
        "nft": first_line(["nft", "--version"]),
        "python": platform.python_version(),
        "kube_proxy": first_line([str(bins.kube_proxy), "--version"]),
        "lace_proxy": first_line([str(LACE_PROXY), "version"]),
        "etcd": bins.etcd_version,
    }


def print_header(info: dict[str, Any], args: argparse.Namespace, out: TextIO) -> None:
    print(
        f"{info['kube_proxy']} vs {info['lace_proxy']}; nftables mode, syncPeriod 30s, "
        f"minSyncPeriod 1s\nmachine: {info['cores']} cores ({info['cpu']}), "
        f"{info['memory_gib']} GiB, Linux {info['kernel']}, {info['nft']}, "
        f"Python {info['python']}; kube-apiserver {info['kube_proxy'].split()[-1]} + etcd "
        f"{info['etcd']} on the same machine\n"
        f"each proxy alone (kube-proxy first), from an empty kernel; first sync polled every "
        f"{POLL} s; {args.updates} updates about {args.gap} s apart; limit {args.limit:.0f} s",
        file=out,
    )


# --- main -----------------------------------------------------------------------------------------


def unfit(bins: Binaries) -> str | None:
    """Why this machine cannot run the benchmark, or None."""
    if os.geteuid() != 0:
        return "needs root (namespaces, cgroups, nftables)"
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    if missing:
        return f"needs {' and '.join(missing)} on PATH"
    if not all(root.is_dir() for root in CGROUP_ROOTS):
        return f"needs cgroup v1 hierarchies at {', '.join(map(str, CGROUP_ROOTS))}"
    if not is_built(bins):
        return "control plane not built: python -m testkit.controlplane.build"
    if not LACE_PROXY.exists():
        return f"no {LACE_PROXY}: run with the project's venv python"
    return None


def _interrupted(signum: int, frame: FrameType | None) -> None:
    """SIGTERM as Ctrl-C: unwind, so every namespace, cgroup and process is removed."""
    raise KeyboardInterrupt


def run(args: argparse.Namespace, bins: Binaries) -> list[dict[str, Any]]:
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    rng, fresh = random.Random(1), _fresh_addresses()
    results: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lace-bench-vs-")))
        seats = []
        for proxy in PROXIES:
            ns = stack.enter_context(Netns())
            seats.append(Seat(proxy, ns, stack.enter_context(ApiLink(ns.name))))
        cp = stack.enter_context(
            ControlPlane(
                bins=bins, bind_address="0.0.0.0", sans=[s.link.host_address for s in seats]
            )
        )
        api = stack.enter_context(cp.admin_client())
        for seat in seats:
            seat.kubeconfig = cp.write_admin_kubeconfig(
                workdir / f"{seat.proxy.name}.kubeconfig", server=seat.link.url(cp.port)
            )
            status, body = _create_node(api, seat)
            if status != 201:
                raise RuntimeError(f"Node {seat.proxy.node}: {status} {body!r}")
        filled = 0
        for size in sizes:
            progress(f"filling the apiserver to {size:,} Services")
            started = time.monotonic()
            asyncio.run(fill(cp, filled, size))
            entry: dict[str, Any] = {
                "size": size,
                "created": size - filled,
                "fill_s": time.monotonic() - started,
                "runs": {},
            }
            filled = size
            for seat in seats:
                progress(f"{size:,}: {seat.proxy.name}")
                entry["runs"][seat.proxy.name] = measure(
                    seat, size, args, api, fresh, rng, bins, workdir
                )
            progress(f"{size:,}: the kube source alone")
            entry["source"] = measure_source(cp.admin_kubeconfig, PROXIES[1].node)
            results.append(entry)
            print_size(entry, sys.stderr if args.json else sys.stdout)
            sys.stdout.flush()
    return results


def _create_node(api: Any, seat: Seat) -> tuple[int, bytes]:
    request = api.param_serialize(
        "POST",
        "/api/v1/nodes",
        header_params={"Content-Type": "application/json", "Accept": "application/json"},
        body=node_object(seat.proxy.node, seat.link.netns_address),
        auth_settings=["BearerToken"],
    )
    response = api.call_api(*request, _request_timeout=(5, 30))
    response.read()
    return response.status, response.data


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,30000", help="Services, comma-separated")
    parser.add_argument("--updates", type=int, default=200, help="EndpointSlice updates per run")
    parser.add_argument(
        "--limit", type=float, default=300, help="seconds a proxy may take to its first sync"
    )
    parser.add_argument(
        "--gap", type=float, default=1.2, help="seconds between updates (± 10%%, > minSyncPeriod)"
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print JSON (latencies included); the tables go to stderr",
    )
    parser.add_argument(
        "--logs", metavar="DIR", help="keep each proxy's log there, as <proxy>-<size>.log"
    )
    parser.add_argument("--source-worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.source_worker:
        print(json.dumps(source_worker(*args.source_worker)))
        return 0
    if args.logs:  # made now: a run must not end in a folder that cannot be written
        Path(args.logs).mkdir(parents=True, exist_ok=True)
    bins = binaries()
    problem = unfit(bins)
    if problem:
        print(f"bench_vs_kube_proxy: {problem}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupted)
    remove_stale()
    sweep_stale_cgroups()
    info = machine(bins)
    print_header(info, args, sys.stderr if args.json else sys.stdout)
    results = run(args, bins)
    if args.json:
        print(json.dumps(_jsonable({"machine": info, "results": results}), indent=2))
    misread = [r for e in results for r in e["runs"].values() if r["detection_error"]]
    return 1 if misread else 0


if __name__ == "__main__":
    sys.exit(main())
