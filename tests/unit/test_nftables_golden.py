"""Golden rulesets: the exact transaction the nftables backend sends on its first sync into
an empty table, for representative services, held in tests/unit/golden/ and reviewed like
code (as cilium's testdata/*/expected.maps).

`empty.golden` is the transaction without services: the skeleton and the precreated shared
chains, a valid `nft -f` script. The others hold what a case adds to it, in place: a line
`= N` stands for the next N lines of empty.golden, `- N` for N of them left out, any other
line is the transaction's own; `#` lines are comments. So a change to the skeleton shows
once, in empty.golden, and a change to how a kind of service is rendered in its own file.

Plans are built by the real table, once per twin. After a deliberate change, rewrite the
files and review the diff:

    LACE_PROXY_REGOLD=1 pytest tests/unit/test_nftables_golden.py
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from types import ModuleType

import pytest

from lace_proxy.dataplane.nftables.backend import NftablesBackend
from lace_proxy.dataplane.nftables.settings import NftablesSettings
from lace_proxy.model import EndpointSlice, Service
from lace_proxy.model.endpointslice import EndpointPort
from lace_proxy.model.service import ServicePort
from testkit.fakenft import FakeNft

from .tablekit import ep, eps, svc

GOLDEN = Path(__file__).parent / "golden" / "nftables"
REGOLD = os.environ.get("LACE_PROXY_REGOLD") == "1"
NODE = "node-a"
#: A node as a cluster configures one: pod CIDRs (detectLocal) and service CIDRs.
SETTINGS = NftablesSettings(
    cluster_cidrs=("10.244.0.0/16", "fd00:244::/56"),
    service_cidrs=("10.96.0.0/16", "fd00:96::/112"),
)
REWRITE = "# Rewrite: LACE_PROXY_REGOLD=1 pytest tests/unit/test_nftables_golden.py"
HEADERS = {
    "empty": (
        "# The first transaction into an empty table (tests/unit/test_nftables_golden.py),",
        "# an nft -f script; the other .golden files tell theirs against it.",
        REWRITE,
    ),
    "case": (
        "# The first transaction into an empty table (tests/unit/test_nftables_golden.py).",
        '# "= N": the next N lines of empty.golden; "- N": N of them left out.',
        REWRITE,
    ),
}


def http(node_port: int = 0) -> tuple[ServicePort, ...]:
    return (ServicePort("http", "TCP", 80, 8080, node_port),)


#: name -> (what it shows, the objects); "empty" is the baseline the others are told against.
CASES: dict[str, tuple[str, list[Service | EndpointSlice]]] = {
    "empty": ("No service: the skeleton and the precreated shared chains.", []),
    "clusterip": (
        "A ClusterIP service with two endpoints, one on this node.",
        [
            svc("web", ips=("10.96.0.10",)),
            eps(ep("10.244.1.10", NODE), ep("10.244.2.10", "node-b"), service="web"),
        ],
    ),
    "nodeport-local": (
        "NodePort 30080 with externalTrafficPolicy Local: one endpoint here, one elsewhere.",
        [
            svc(
                "local",
                ips=("10.96.0.11",),
                type="NodePort",
                ports=http(30080),
                external_traffic_policy="Local",
            ),
            eps(ep("10.244.1.11", NODE), ep("10.244.2.11", "node-b"), service="local"),
        ],
    ),
    "affinity": (
        "Dual-stack ClientIP affinity for 600 s: IPv4 as data keyed by an affinity id, IPv6 "
        "as kube-proxy's per-endpoint chains.",
        [
            svc(
                "sticky",
                ips=("10.96.0.12", "fd00:96::12"),
                session_affinity=True,
                affinity_timeout=600,
            ),
            eps(ep("10.244.1.12", NODE), ep("10.244.2.12", "node-b"), service="sticky"),
            eps(
                ep("fd00:244:1::12", NODE),
                ep("fd00:244:2::12", "node-b"),
                service="sticky",
                name="sticky-v6",
                address_type="IPv6",
            ),
        ],
    ),
    "source-ranges": (
        "A LoadBalancer (NodePort 30082) whose ingress IP admits only its "
        "loadBalancerSourceRanges.",
        [
            svc(
                "edge",
                ips=("10.96.0.13",),
                type="LoadBalancer",
                ports=http(30082),
                lb_ingress_ips=("192.0.2.20",),
                lb_source_ranges=("198.51.100.0/24", "203.0.113.7/32"),
            ),
            eps(ep("10.244.2.13", "node-b"), service="edge"),
        ],
    ),
    "no-endpoints": (
        "A ClusterIP service without endpoints: new connections are rejected.",
        [svc("lonely", ips=("10.96.0.14",))],
    ),
    "ipv6": (
        "An IPv6-only service with a UDP and a TCP port.",
        [
            svc(
                "dns",
                ips=("fd00:96::15",),
                ports=(ServicePort("dns", "UDP", 53, 5353), *http()),
            ),
            eps(
                ep("fd00:244:1::15", NODE),
                ep("fd00:244:2::15", "node-b"),
                service="dns",
                address_type="IPv6",
                ports=(EndpointPort("dns", "UDP", 5353), EndpointPort("http", "TCP", 8080)),
            ),
        ],
    ),
}


def first_sync(twin: ModuleType, objects: list[Service | EndpointSlice]) -> list[str]:
    """The lines of the one transaction a new backend sends to an empty kernel."""
    table = twin.ServiceTable(NODE)
    for obj in objects:
        if isinstance(obj, Service):
            table.upsert_service(obj)
        else:
            table.upsert_slice(obj)
    table.build()
    table.commit()
    nft = FakeNft()
    NftablesBackend(SETTINGS, nft).full_sync(list(table.plans()))
    # An empty kernel: the skeleton and chains in one batch, the elements in the next.
    structure, elements = nft.applied
    return structure.lines() + elements.lines()


def encode(lines: list[str], base: list[str]) -> list[str]:
    """`lines` told against `base` (see the module's docstring)."""
    out: list[str] = []
    matcher = difflib.SequenceMatcher(None, base, lines, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            out.append(f"= {i2 - i1}")
            continue
        if i2 > i1:
            out.append(f"- {i2 - i1}")
        out += lines[j1:j2]
    return out


def decode(golden: list[str], base: list[str]) -> list[str]:
    """The transaction a golden file holds, its `= N` and `- N` taken from `base`."""
    out: list[str] = []
    at = 0
    for line in golden:
        if line.startswith("#"):
            continue
        if line.startswith(("= ", "- ")):
            count = int(line[2:])
            if line[0] == "=":
                out += base[at : at + count]
            at += count
        else:
            out.append(line)
    return out


def read(name: str) -> list[str]:
    path = GOLDEN / f"{name}.golden"
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("case", list(CASES))
def test_first_sync_matches_its_golden_ruleset(twin: ModuleType, case: str) -> None:
    what, objects = CASES[case]
    lines = first_sync(twin, objects)
    if REGOLD:
        told = lines if case == "empty" else encode(lines, first_sync(twin, []))
        GOLDEN.mkdir(parents=True, exist_ok=True)
        header = HEADERS["empty" if case == "empty" else "case"]
        text = "\n".join([f"# {what}", *header, *told])
        (GOLDEN / f"{case}.golden").write_text(text + "\n")
    held = decode(read(case), decode(read("empty"), []))
    if held != lines:
        diff = "\n".join(difflib.unified_diff(held, lines, "golden", "sent", lineterm=""))
        pytest.fail(
            f"{case}: the first sync differs from {case}.golden (if the change is meant, "
            f"rewrite it with LACE_PROXY_REGOLD=1 and review the diff):\n{diff}"
        )
