"""First-packet latency through a ClusterIP, with 100 and with 30,000 services programmed.

    python bench/bench_latency.py [--sizes 100,30000] [--connects 400] [--json]

A namespace testbed (client → node → pod, lace_proxy.demo.testbed) has the node's
nftables programmed with bench_scale's synthetic cluster of each size plus one probe
service whose ClusterIP leads to the testbed's pod. The client then opens `--connects` new
TCP connections to the probe's ClusterIP, one at a time, each from a fresh source port: the
connect() time is one round trip whose first packet goes through the table's lookups and
DNAT (conntrack has no entry for it yet). The same is measured straight to the pod, as the
floor. Needs root. Like every benchmark, it asserts nothing; it prints medians, p99 and the
ratio of the largest size to the smallest (the target: within 1.2x).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from bench_scale import POD_CIDR, THIS_NODE, THIS_ZONE, make_cluster

from lace_proxy.dataplane.nft import Nft
from lace_proxy.dataplane.nftables.backend import NftablesBackend
from lace_proxy.dataplane.nftables.settings import NftablesSettings
from lace_proxy.demo.testbed import Host, Testbed
from lace_proxy.model.endpointslice import SERVICE_NAME_LABEL, Endpoint, EndpointPort, EndpointSlice
from lace_proxy.model.service import Service, ServicePort
from lace_proxy.table import ServiceTable

PROBE_VIP = "10.95.0.1"


def probe(pod: Host) -> tuple[Service, EndpointSlice]:
    svc = Service(
        namespace="bench",
        name="probe",
        type="ClusterIP",
        cluster_ips=(PROBE_VIP,),
        ports=(ServicePort("http", "TCP", 80, 8080, 0),),
    )
    sl = EndpointSlice(
        namespace="bench",
        name="probe-1",
        service_name="probe",
        address_type="IPv4",
        endpoints=(Endpoint(addresses=(pod.ipv4,), node_name=THIS_NODE),),
        ports=(EndpointPort("http", "TCP", 8080),),
        labels=((SERVICE_NAME_LABEL, "probe"),),
    )
    return svc, sl


def connects(tb: Testbed, ip: str, port: int, n: int) -> list[float]:
    """connect() times of `n` new connections from the client, one after the other."""
    times = []
    linger = struct.pack("ii", 1, 0)  # close with RST: no TIME_WAIT piles up
    for _ in range(n):
        with tb.client.ns.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
            sock.settimeout(2)
            t0 = time.perf_counter()
            sock.connect((ip, port))
            times.append(time.perf_counter() - t0)
    return times


def measure(tb: Testbed, size: int, n: int) -> dict[str, Any]:
    cluster = make_cluster(size, 10)
    table = ServiceTable(THIS_NODE, THIS_ZONE)
    svc, sl = probe(tb.pods[0])
    for s in (*cluster.services, svc):
        table.upsert_service(s)
    for x in (*cluster.slices, sl):
        table.upsert_slice(x)
    table.build()
    table.commit()
    backend = NftablesBackend(NftablesSettings(cluster_cidrs=(POD_CIDR,)), Nft(tb.node.ns.name))
    backend.cleanup()
    backend.full_sync(list(table.plans()))
    connects(tb, PROBE_VIP, 80, 20)  # warm up (ARP, caches)
    via = connects(tb, PROBE_VIP, 80, n)
    direct = connects(tb, tb.pods[0].ipv4, 8080, n)
    backend.cleanup()

    def figures(times: list[float]) -> dict[str, float]:
        ordered = sorted(times)
        return {
            "median_s": statistics.median(ordered),
            "p99_s": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        }

    return {"size": size, "via_cluster_ip": figures(via), "direct": figures(direct)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,30000", help="services, comma-separated")
    parser.add_argument("--connects", type=int, default=400)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    with Testbed(pods=1) as tb:
        results = [measure(tb, size, args.connects) for size in sizes]
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"first-packet latency: connect() to a ClusterIP, {args.connects} new connections")
    print(f"{'services':>8} {'median':>9} {'p99':>9}   {'direct median':>13} {'direct p99':>10}")
    for r in results:
        v, d = r["via_cluster_ip"], r["direct"]
        print(
            f"{r['size']:>8} {v['median_s'] * 1e6:>7.0f}µs {v['p99_s'] * 1e6:>7.0f}µs"
            f"   {d['median_s'] * 1e6:>11.0f}µs {d['p99_s'] * 1e6:>8.0f}µs"
        )
    small, large = results[0]["via_cluster_ip"], results[-1]["via_cluster_ip"]
    ratio = large["median_s"] / small["median_s"]
    verdict = "PASS" if ratio <= 1.2 else "MISS"
    print(
        f"{results[-1]['size']} / {results[0]['size']} services, median: {ratio:.2f}x "
        f"(target <= 1.2x: {verdict}); p99: {large['p99_s'] / small['p99_s']:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
