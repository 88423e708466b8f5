"""Bad input, fuzzed: random Services, EndpointSlices and Lace objects through the whole
pipeline (manifest folder → model → table → proxier → nftables) on a real kernel.

Each example is one state of the folder, written over the last one, so the proxy sees a
stream of random worlds as it would under churn. Whatever the input: every document is
either delivered or rejected with a reason (nothing dropped silently, every rejection
counted), the kernel accepts every sync (no invalid rule reaches it), and what it holds is
exactly what the proxy meant (a full reconcile right after finds nothing to change).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from lace_proxy.dataplane.nftables.transaction import Transaction
from lace_proxy.demo.testbed import Testbed
from lace_proxy.model.load import load_manifests

from ..lacekit import GV, external, l3, routing, selector, service_binding, service_routing
from .proxykit import NODE, Harness, RecordingNft

pytestmark = pytest.mark.netns

EXAMPLES = int(os.environ.get("LACE_PROXY_FUZZ_EXAMPLES", "40"))

# -- the raw material: (good, bad) pairs; an object is intact, or broken in a few fields --

Pair = tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]

NAMES: Pair = (
    st.sampled_from(["web", "api", "dns"]),
    st.sampled_from(["db", "a" * 63, "a" * 64, "Web", "ünïcode", "x.y", "-bad", ""]),
)
NAMESPACES: Pair = (st.just("default"), st.sampled_from(["prod", "Prod", "ns_ü", ""]))
V4 = st.builds(lambda a, b: f"10.96.{a}.{b}", st.integers(0, 3), st.integers(0, 255))
V6 = st.builds(lambda a: f"fd00:96::{a:x}", st.integers(0, 1023))
POD4 = st.builds(lambda a, b: f"10.251.{a}.{b}", st.integers(0, 3), st.integers(1, 254))
POD6 = st.builds(lambda a: f"fd00:251::{a:x}", st.integers(1, 1023))
BAD_ADDRESSES = st.one_of(
    st.sampled_from(
        [
            "",
            "999.1.1.1",
            "10.96.0",
            " 10.96.0.1",
            "10.96.0.1/32",
            "fd00::zz",
            "::ffff:10.96.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "127.0.0.1",
            "::",
            "fe80::1",
            "None",
            "\uff11\uff10.96.0.1",  # fullwidth digits
            "10.96.0.01",
        ]
    ),
    st.text(max_size=8),
)
PORTS: Pair = (
    st.integers(1, 65535),
    st.sampled_from([0, -1, 65536, 70000, "80", "http", None, 1.5, True]),
)
PROTOCOLS: Pair = (
    st.sampled_from(["TCP", "UDP"]),
    st.sampled_from(["SCTP", "tcp", "ICMP", None, 6]),
)
CIDRS: Pair = (
    st.sampled_from(["10.0.0.0/8", "10.250.0.0/24", "0.0.0.0/0", "::/0", "fd00::/8"]),
    st.sampled_from(["10.0.0.1/8", "10.0.0.0/33", "banana", "", "10.0.0.0"]),
)
CONDITIONS: Pair = (st.sampled_from([True, False, None]), st.just("yes"))


def chooser(draw: st.DrawFn) -> Callable[[Pair], Any]:
    """One object in four is broken; a broken one takes the bad value in a field one time in
    three (so a rejection names one of several problems), an intact one never."""
    broken = draw(st.integers(0, 3)) == 3

    def pick(pair: Pair) -> Any:
        good, bad = pair
        return draw(bad) if broken and draw(st.integers(0, 2)) == 2 else draw(good)

    return pick


def sometimes(draw: st.DrawFn, n: int = 4) -> bool:
    return draw(st.integers(0, n - 1)) == 0


@st.composite
def services(draw: st.DrawFn) -> dict[str, Any]:
    pick = chooser(draw)
    kind = pick(
        (st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer"]), st.sampled_from(["X", ""]))
    )
    ports = [
        {
            "name": name,
            "port": pick(PORTS),
            "targetPort": pick((st.one_of(PORTS[0], st.just("http")), PORTS[1])),
            "protocol": pick(PROTOCOLS),
            **(
                {"nodePort": pick((st.integers(30000, 30010), PORTS[1]))} if sometimes(draw) else {}
            ),
        }
        for name in pick((st.sampled_from([["p"], ["p", "q"]]), st.just(["p", "p"])))
    ]
    spec: dict[str, Any] = {
        "type": kind,
        "clusterIPs": pick(
            (
                st.one_of(st.tuples(V4).map(list), st.tuples(V4, V6).map(list)),
                st.lists(st.one_of(V4, V6, BAD_ADDRESSES), max_size=3),
            )
        ),
        "ports": ports,
    }
    optional: tuple[tuple[str, Pair], ...] = (
        (
            "externalIPs",
            (st.just(["10.252.0.30"]), st.lists(BAD_ADDRESSES, min_size=1, max_size=2)),
        ),
        ("sessionAffinity", (st.sampled_from(["ClientIP", "None"]), st.just("Sticky"))),
        ("externalTrafficPolicy", (st.sampled_from(["Local", "Cluster"]), st.just("x"))),
        ("internalTrafficPolicy", (st.sampled_from(["Local", "Cluster"]), st.just(1))),
        (
            "loadBalancerSourceRanges",
            (st.lists(CIDRS[0], max_size=3), st.lists(CIDRS[1], min_size=1)),
        ),
        (
            "sessionAffinityConfig",
            (
                st.just({"clientIP": {"timeoutSeconds": 60}}),
                st.sampled_from([{"clientIP": {"timeoutSeconds": t}} for t in (0, 90000, "1")]),
            ),
        ),
        ("trafficDistribution", (st.just("PreferClose"), st.just("Bogus"))),
    )
    for field, pair in optional:
        if sometimes(draw):
            spec[field] = pick(pair)
    if sometimes(draw, 8):
        spec["clusterIP"] = draw(st.sampled_from(["None", "", "10.96.9.9"]))  # headless, or not
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": pick(NAMES), "namespace": pick(NAMESPACES)},
        "spec": spec,
    }
    if sometimes(draw, 8):
        obj["metadata"]["labels"] = {"service.kubernetes.io/service-proxy-name": "other"}
    if kind == "LoadBalancer" and sometimes(draw, 2):
        ingress = pick((st.just(["10.252.0.20"]), st.lists(BAD_ADDRESSES, min_size=1)))
        obj["status"] = {"loadBalancer": {"ingress": [{"ip": ip} for ip in ingress]}}
    return obj


@st.composite
def slices(draw: st.DrawFn, services: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    """A slice, most often of one of `services` (by name and namespace)."""
    pick = chooser(draw)
    owner = draw(st.sampled_from(services)) if services and not sometimes(draw) else None
    family = pick((st.sampled_from(["IPv4", "IPv6"]), st.sampled_from(["FQDN", "IPv5"])))
    pod = POD6 if family == "IPv6" else POD4
    endpoints = [
        {
            "addresses": pick((st.tuples(pod).map(list), st.lists(BAD_ADDRESSES, max_size=2))),
            "conditions": {
                k: pick(CONDITIONS) for k in ("ready", "serving", "terminating") if sometimes(draw)
            },
            "nodeName": pick((st.sampled_from([NODE, "node-b", None]), st.just(""))),
            **({"zone": "a"} if sometimes(draw) else {}),
        }
        for _ in range(draw(st.integers(0, 6)))
    ]
    if sometimes(draw, 10):  # now and then a huge slice
        endpoints += [
            {"addresses": [f"10.251.{4 + i // 250}.{1 + i % 250}"], "nodeName": NODE}
            for i in range(1500)
        ]
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": pick(NAMES) + draw(st.sampled_from(["", "-1", "-2"])),
            "namespace": owner["metadata"]["namespace"] if owner else pick(NAMESPACES),
            "labels": {
                "kubernetes.io/service-name": owner["metadata"]["name"] if owner else pick(NAMES)
            },
        },
        "addressType": family,
        "ports": [
            {
                "name": pick((st.just(name), st.just(""))),
                "port": pick(PORTS),
                "protocol": pick(PROTOCOLS),
            }
            for name in pick((st.sampled_from([["p"], ["p", "q"]]), st.just([])))
        ],
        "endpoints": endpoints,
    }


NETWORKS = st.sampled_from(["pods", "blue", "internet", "host", "ghost", "ü"])


@st.composite
def lace_objects(draw: st.DrawFn) -> dict[str, Any]:
    name = draw(NETWORKS)
    choice = draw(st.integers(0, 6))
    if choice == 0:
        return l3(
            name,
            draw(
                st.sampled_from(
                    ["10.251.0.0/16", "10.251.0.0/24", "10.0.0.0/8", "10.251.0.1/16", "nope"]
                )
            ),
        )
    if choice == 1:
        return external(name, *draw(st.lists(st.one_of(*CIDRS), max_size=2)))
    if choice == 2:
        return {
            "apiVersion": GV,
            "kind": "Network",
            "metadata": {"name": name},
            "spec": {"type": draw(st.sampled_from(["hostLocal", "l2", "mesh"]))},
        }
    if choice == 3:
        return routing(draw(st.one_of(*NAMES)), draw(NETWORKS), draw(NETWORKS))
    if choice == 4:
        return service_routing(
            draw(st.one_of(*NAMES)),
            draw(NETWORKS),
            draw(NETWORKS),
            draw(st.sampled_from([None, {"app": "web"}])),
        )
    if choice == 5:
        chosen = {"name": draw(st.one_of(*NAMES)), "namespace": draw(st.one_of(*NAMESPACES))}
        return service_binding(draw(st.one_of(*NAMES)), draw(NETWORKS), chosen)
    return {
        "apiVersion": GV,
        "kind": "NetworkRoutingPolicy",
        "metadata": {"name": draw(st.one_of(*NAMES))},
        "spec": {"srcSelector": selector(draw(NETWORKS)), "destSelector": "everything"},
    }


@st.composite
def worlds(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A folder's worth: services, slices mostly of those services, Lace objects, shuffled."""
    svcs = draw(st.lists(services(), min_size=1, max_size=5))
    objs = [*svcs, *draw(st.lists(slices(tuple(svcs)), min_size=1, max_size=6))]
    objs += draw(st.lists(lace_objects(), max_size=4))
    return draw(st.permutations(objs))


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], Harness]]:
    """One proxy pipeline on one testbed for every example (a long-running proxy)."""
    made: list[Harness] = []
    with Testbed(pods=1) as tb:

        def get() -> Harness:
            if not made:
                harness = Harness(tb, tmp_path_factory.mktemp("fuzz"))
                harness.nft.nft = RecordingNft(tb.node.ns.name)
                harness.nft.verify_every = 1  # every full sync reads every element back
                made.append(harness)
            return made[0]

        yield get
        for harness in made:
            harness.close()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(world=worlds())
def test_random_worlds_never_crash_or_reach_the_kernel_invalid(
    pipeline: Callable[[], Harness], world: list[dict[str, Any]]
) -> None:
    harness = pipeline()
    folder = harness.folder
    for old in folder.glob("*.yaml"):
        old.unlink()
    for i, obj in enumerate(world):
        (folder / f"{i:02d}.yaml").write_text(yaml.safe_dump(obj, allow_unicode=True))
    # The model: each document is delivered or rejected with a reason, never dropped.
    loaded = load_manifests(folder)
    delivered = len(loaded.services) + len(loaded.slices) + len(loaded.nodes) + len(loaded.lace)
    assert delivered + len(loaded.rejected) == len(world), loaded.rejected
    assert all(e.code and e.reason for e in loaded.rejected)
    counted = sum(harness.rejections.counts.values())
    # The pipeline: the kernel takes every sync, and holds what the proxy meant.
    harness.sync()
    assert sum(harness.rejections.counts.values()) - counted == len(loaded.rejected)
    plans = list(harness.table.plans())
    event(f"service ports programmed: {min(len(plans), 3)}+")
    event(f"with backends: {any(p.cluster_backends for p in plans)}")
    event(f"network model: {harness.proxier.networks.enabled}")
    event(f"services delivered: {min(len(loaded.services), 3)}+")
    for plan in plans:
        ipaddress.ip_address(plan.cluster_ip)
        assert 1 <= plan.port <= 65535 and plan.protocol in ("TCP", "UDP", "SCTP")
        assert all(
            ipaddress.ip_address(b.ip).version == plan.family
            for b in (*plan.cluster_backends, *plan.local_backends)
        )
    recorder = harness.nft.nft
    assert isinstance(recorder, RecordingNft)
    recorder.applied.clear()
    harness.sync(full=True)
    assert recorder.applied == [], _head(recorder.applied)


def _head(applied: list[Transaction]) -> list[str]:
    return [c for tx in applied for c in tx.lines()][:10]
