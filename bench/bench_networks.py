"""Network-model benchmark: policy resolution at scale, and the cost of one policy change.

    python bench/bench_networks.py [--services 30000] [--networks 50] [--endpoints 10] [--json]

A synthetic cluster: `--networks` Networks (all but two are l3 pod networks with their own
/16; plus `internet` and `host-local`), services spread evenly over the pod networks with
their endpoints inside their network, a peering mesh (each pod network peered from the next
one) and a few ServiceRoutingPolicies selecting services by label. Everything flows through
the proxier's own change tracker (sources → network view → table), as in the proxy; the
kernel is not involved unless `--nft` is given (then a namespace is made for the figures).

Figures:
- load: every service and slice delivered, then the table built, without and with Network
  objects (the network model's overhead on a cold start);
- policy change: one NetworkRoutingPolicy added (peering one pod network to another): the
  time to re-evaluate every binding, how many services and frontends reach the table, the
  table build, and (`--nft`) the incremental nftables transaction;
- no-op change: an unrelated Network added: nothing should reach the table.

Benchmarks never assert; this prints figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from lace_proxy.dataplane.nft import Nft
from lace_proxy.dataplane.nftables.backend import NftablesBackend
from lace_proxy.dataplane.nftables.settings import NftablesSettings
from lace_proxy.model import LaceObject, parse_object
from lace_proxy.model.endpointslice import Endpoint, EndpointPort, EndpointSlice
from lace_proxy.model.service import Service, ServicePort
from lace_proxy.proxier import Proxier
from lace_proxy.table import ServiceTable

GV = "lace-cni.io/v1alpha1"
THIS_NODE = "node-000"


def _network(name: str, type: str, **spec: Any) -> LaceObject:
    obj = {"apiVersion": GV, "kind": "Network", "metadata": {"name": name}}
    return parse_object({**obj, "spec": {"type": type, **spec}})  # type: ignore[return-value]


def _selector(name: str) -> dict[str, Any]:
    return {"matchLabels": {"lace-cni.io/network": name}}


def _policy(kind: str, name: str, src: str, dest: str, **spec: Any) -> LaceObject:
    body = {"srcSelector": _selector(src), "destSelector": _selector(dest), **spec}
    obj = {"apiVersion": GV, "kind": kind, "metadata": {"name": name}, "spec": body}
    return parse_object(obj)  # type: ignore[return-value]


@dataclass
class Cluster:
    lace: list[LaceObject]
    services: list[Service]
    slices: list[EndpointSlice]
    pod_networks: list[str]


def make_cluster(services: int, networks: int, endpoints: int, seed: int = 1) -> Cluster:
    rng = random.Random(seed)
    pods = [f"net-{i:02d}" for i in range(networks - 2)]
    lace: list[LaceObject] = [
        _network(name, "l3", ipv4Subnet={"prefix": f"10.{64 + i}.0.0/16"})
        for i, name in enumerate(pods)
    ]
    lace += [
        _network("internet", "external", externalPrefixes=["0.0.0.0/0", "::/0"]),
        _network("host-local", "hostLocal"),
        _policy("NetworkRoutingPolicy", "host-to-net-00", "host-local", pods[0]),
    ]
    # A sparse mesh: each pod network peered from the next, every fifth granted to internet.
    lace += [
        _policy("NetworkRoutingPolicy", f"peer-{i:02d}", pods[(i + 1) % len(pods)], pods[i])
        for i in range(0, len(pods), 2)
    ]
    lace += [
        _policy(
            "ServiceRoutingPolicy",
            f"web-{i:02d}",
            "internet",
            pods[i],
            serviceSelector={"matchLabels": {"tier": "web"}},
        )
        for i in range(0, len(pods), 5)
    ]
    svcs, slices = [], []
    for i in range(services):
        n = i % len(pods)
        ns, name = f"ns-{i // 100:04d}", f"svc-{i:05d}"
        labels = (("tier", "web" if i % 3 == 0 else "backend"),)
        ip = f"172.{16 + i // 65536}.{i // 256 % 256}.{i % 256}"
        port = ServicePort("http", "TCP", 80, 8080)
        svcs.append(Service(ns, name, "ClusterIP", (ip,), (port,), labels=labels))
        eps = tuple(
            Endpoint(
                (f"10.{64 + n}.{rng.randrange(256)}.{rng.randrange(1, 255)}",),
                node_name=f"node-{rng.randrange(100):03d}",
            )
            for _ in range(endpoints)
        )
        slices.append(
            EndpointSlice(ns, f"{name}-x", name, "IPv4", eps, (EndpointPort("http", "TCP", 8080),))
        )
    return Cluster(lace, svcs, slices, pods)


def _proxier(netns: str | None) -> Proxier:
    backend = NftablesBackend(NftablesSettings(), Nft(netns))
    proxier = Proxier(ServiceTable(THIS_NODE), backend, sources=["bench"])
    proxier.synced("bench")
    return proxier


def _deliver(proxier: Proxier, cluster: Cluster, with_networks: bool = True) -> None:
    """Every object, as a source delivers them (networks first, as after a restart)."""
    if with_networks:
        for obj in cluster.lace:
            proxier.lace_upserted(obj)
    for svc in cluster.services:
        proxier.service_upserted(svc)
    for sl in cluster.slices:
        proxier.slice_upserted(sl)


def _load(cluster: Cluster, with_networks: bool) -> tuple[Proxier, float]:
    proxier = _proxier(None)
    started = time.perf_counter()
    _deliver(proxier, cluster, with_networks)
    proxier.table.build()
    proxier.table.commit()
    return proxier, time.perf_counter() - started


def run(args: argparse.Namespace) -> dict[str, Any]:
    cluster = make_cluster(args.services, args.networks, args.endpoints)
    _, plain = _load(cluster, False)
    proxier, lace = _load(cluster, True)
    out: dict[str, Any] = {
        "services": args.services,
        "networks": args.networks,
        "endpoints_per_service": args.endpoints,
        "policies": sum(1 for o in cluster.lace if o.kind != "Network"),
        "load_plain_s": plain,
        "load_networks_s": lace,
    }
    # One peering: pod network 1 is peered from pod network 3 (not peered before).
    change = _policy(
        "NetworkRoutingPolicy", "bench-change", cluster.pod_networks[3], cluster.pod_networks[1]
    )
    started = time.perf_counter()
    proxier.lace_upserted(change)
    out["policy_reevaluate_s"] = time.perf_counter() - started
    out["policy_services_dirty"] = proxier.table.pending
    started = time.perf_counter()
    changes = proxier.table.build()
    out["policy_build_s"] = time.perf_counter() - started
    out["policy_plans_changed"] = len(changes)
    out["policy_frontends_changed"] = sum(
        sum(1 for _ in new.frontends()) for _, new in changes.updated
    )
    proxier.table.commit()
    started = time.perf_counter()
    proxier.lace_upserted(_network("unrelated", "l3", ipv4Subnet={"prefix": "10.250.0.0/16"}))
    out["noop_reevaluate_s"] = time.perf_counter() - started
    out["noop_services_dirty"] = proxier.table.pending
    if args.nft:
        out.update(_nft(cluster, change))
    return out


def _nft(cluster: Cluster, change: LaceObject) -> dict[str, Any]:
    """The same policy change through nftables, in a namespace made for it."""
    ns = f"lacenetbench-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        proxier = _proxier(ns)
        _deliver(proxier, cluster)
        started = time.perf_counter()
        assert asyncio.run(proxier.sync(full=True)), proxier.stats.last_error
        cold = time.perf_counter() - started
        proxier.lace_upserted(change)
        started = time.perf_counter()
        assert asyncio.run(proxier.sync()), proxier.stats.last_error
        return {"nft_cold_s": cold, "nft_policy_change_s": time.perf_counter() - started}
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


def _t(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 10 else f"{seconds:.2f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--services", type=int, default=30000)
    parser.add_argument("--networks", type=int, default=50)
    parser.add_argument("--endpoints", type=int, default=10, help="endpoints per service")
    parser.add_argument("--nft", action="store_true", help="also program nftables (root)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    out = run(args)
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        print()
        return 0
    print(
        f"{out['services']} services x {out['endpoints_per_service']} endpoints, "
        f"{out['networks']} networks, {out['policies']} policies"
    )
    overhead = out["load_networks_s"] / out["load_plain_s"]
    print(f"  load + build, no networks     {_t(out['load_plain_s'])}")
    print(f"  load + build, networks        {_t(out['load_networks_s'])}  ({overhead:.2f}x)")
    print(f"  one peering: re-evaluate      {_t(out['policy_reevaluate_s'])}")
    print(
        f"               reach the table  {out['policy_services_dirty']} services, "
        f"{out['policy_plans_changed']} plans, {out['policy_frontends_changed']} frontends"
    )
    print(f"               table build      {_t(out['policy_build_s'])}")
    if "nft_policy_change_s" in out:
        print(
            f"               nftables apply   {_t(out['nft_policy_change_s'])}"
            f"  (cold sync {_t(out['nft_cold_s'])})"
        )
    print(
        f"  unrelated network: re-evaluate {_t(out['noop_reevaluate_s'])}, "
        f"{out['noop_services_dirty']} services reach the table"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
