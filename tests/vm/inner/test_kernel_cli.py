"""Inside the VM: `lace-proxy kernel` against IPVS as the proxy programmed it, witnessed by
``ipvsadm -Ln`` in the same namespace; then changes made behind the proxy's back are the
diff, and what is not the proxy's is listed but never diffed.

One single-node testbed and one programmed proxy for the module (TCG makes every start
expensive); the CLI runs in-process, reading the node's namespace with --netns.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from lace_proxy.cli import main
from lace_proxy.demo.testbed import UPLINK_NODE4, Testbed, remove_stale_namespaces
from tests.netns.proxykit import LB4, NODE, Harness, endpoints, service

pytestmark = pytest.mark.ipvs

VIP4, VIP6, API4 = "10.96.0.10", "fd00:96::10", "10.96.0.20"
FOREIGN = "10.77.0.1"  # not an address of lace-proxy's: IPVS state of someone else's

Listing = dict[str, tuple[str, set[tuple[str, str, int]]]]


@pytest.fixture(scope="module")
def tb() -> Iterator[Testbed]:
    remove_stale_namespaces()
    with Testbed(pods=3) as testbed:
        yield testbed


@pytest.fixture(scope="module")
def proxy(tb: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    """web: every frontend kind, dual-stack; api: ClientIP affinity (persistence), two pods."""
    harness = Harness(tb, tmp_path_factory.mktemp("kernel") / "manifests", mode="ipvs")
    web = service("web", [VIP4, VIP6], type="LoadBalancer", node_port=30080)
    web["status"] = {"loadBalancer": {"ingress": [{"ip": LB4}]}}
    harness.write("web", web, endpoints("web", tb.pods), endpoints("web", tb.pods, v6=True))
    api = service("api", [API4], port=8080, sessionAffinity="ClientIP")
    harness.write("api", api, endpoints("api", tb.pods[:2]))
    harness.sync()
    try:
        yield harness
    finally:
        sh(tb, "ipvsadm", "-D", "-u", f"{FOREIGN}:53", check=False)
        harness.close()


def sh(tb: Testbed, *argv: str, check: bool = True) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", tb.node.ns.name, *argv],
        check=check,
        capture_output=True,
        text=True,
    ).stdout


def parse(text: str) -> Listing:
    """An `ipvsadm -Ln` layout as {"TCP 10.96.0.10:80": (scheduler and flags, {(real
    server, forward, weight)})}: connection counts left out, they move between two reads."""
    services: Listing = {}
    current: set[tuple[str, str, int]] = set()
    for line in text.splitlines():
        words = line.split()
        if words and words[0] in ("TCP", "UDP", "SCTP"):
            current = set()
            flags = words[2:5] if words[3:4] == ["persistent"] else words[2:3]
            services[f"{words[0]} {words[1]}"] = (" ".join(flags), current)
        elif words[:1] == ["->"] and words[1] != "RemoteAddress:Port":
            current.add((words[1], words[2], int(words[3])))
        elif not words:
            break  # the diff follows the listing
    return services


def kernel(
    tb: Testbed, proxy: Harness, capsys: pytest.CaptureFixture[str], *more: str
) -> tuple[int, str]:
    """`lace-proxy kernel` on the node's namespace with the proxy's manifests."""
    capsys.readouterr()
    code = main(
        [
            "kernel",
            "--manifests",
            str(proxy.folder),
            "--proxy-mode",
            "ipvs",
            "--hostname-override",
            NODE,
            "--netns",
            tb.node.ns.name,
            *more,
        ]
    )
    out, err = capsys.readouterr()
    assert err == "", err
    return code, out


def service_column(text: str) -> dict[str, str]:
    """The SERVICE column: {"TCP 10.96.0.10:80": "default/web:p"}."""
    return {
        f"{w[0]} {w[1]}": w[-1]
        for w in (line.split() for line in text.split("\n\n")[0].splitlines())
        if w and w[0] in ("TCP", "UDP", "SCTP")
    }


def test_in_sync_shows_what_ipvsadm_shows_with_service_names(
    proxy: Harness, tb: Testbed, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = kernel(tb, proxy, capsys)
    assert code == 0, out
    shown, witness = parse(out), parse(sh(tb, "ipvsadm", "-Ln"))
    assert shown == witness
    pods = {(f"10.251.0.1{i}:8080", "Masq", 1) for i in (1, 2, 3)}
    assert witness[f"TCP {VIP4}:80"] == ("rr", pods)
    two = {p for p in pods if not p[0].startswith("10.251.0.13")}
    assert witness[f"TCP {API4}:8080"] == ("rr persistent 10800", two)
    names = service_column(out)
    assert names == {key: "default/api:p" if API4 in key else "default/web:p" for key in witness}
    for key in (f"TCP [{VIP6}]:80", f"TCP {LB4}:80", f"TCP {UPLINK_NODE4}:30080"):
        assert names[key] == "default/web:p"
    assert (
        out.splitlines()[-1] == f"in sync: IPVS holds the table's {len(witness)} virtual services"
    )
    code, out = kernel(tb, proxy, capsys, "-o", "json")
    doc = json.loads(out)
    assert code == 0 and doc["inSync"] is True
    assert UPLINK_NODE4 in doc["nodeAddresses"]
    assert doc["diff"] == {"missing": [], "unexpected": [], "different": [], "draining": []}


def test_changes_behind_the_proxys_back_are_the_diff(
    proxy: Harness, tb: Testbed, capsys: pytest.CaptureFixture[str]
) -> None:
    proxy.sync(full=True)  # whatever the test before left
    assert kernel(tb, proxy, capsys)[0] == 0
    # Behind the proxy's back: a real server deleted, a virtual service added on one of the
    # dummy interface's addresses (the proxy's by its ownership rule), and one elsewhere.
    sh(tb, "ipvsadm", "-d", "-t", f"{VIP4}:80", "-r", "10.251.0.13:8080")
    sh(tb, "ipvsadm", "-A", "-t", f"{VIP4}:81", "-s", "wlc")
    sh(tb, "ipvsadm", "-a", "-t", f"{VIP4}:81", "-r", "10.251.0.11:8080", "-m")
    sh(tb, "ipvsadm", "-A", "-u", f"{FOREIGN}:53", "-s", "rr")
    code, out = kernel(tb, proxy, capsys, "-o", "json")
    assert code == 1, out
    diff: dict[str, Any] = json.loads(out)["diff"]
    assert diff["missing"] == [] and diff["draining"] == []
    assert diff["unexpected"] == [
        {
            "protocol": "TCP",
            "address": VIP4,
            "port": 81,
            "scheduler": "wlc",
            "persistence": 0,
            "realServers": [{"address": "10.251.0.11", "port": 8080, "weight": 1}],
        }
    ]
    assert diff["different"] == [
        {
            "protocol": "TCP",
            "address": VIP4,
            "port": 80,
            "service": "default/web:p",
            "missingRealServers": [{"address": "10.251.0.13", "port": 8080}],
        }
    ]
    code, out = kernel(tb, proxy, capsys)
    assert code == 1
    assert parse(out) == parse(sh(tb, "ipvsadm", "-Ln"))  # the foreign one listed, too
    names = service_column(out)
    assert (names[f"TCP {VIP4}:81"], names[f"UDP {FOREIGN}:53"]) == ("-", "(foreign)")
    diff_text = out.split("\n\n", 1)[1]
    assert f"unexpected  TCP  {VIP4}:81 wlc" in diff_text
    assert f"different   TCP  {VIP4}:80" in diff_text
    assert "-> 10.251.0.13:8080  missing" in diff_text
    assert FOREIGN not in diff_text
    assert out.splitlines()[-1] == "not in sync: 2 virtual services differ"
    # The diff is what a full sync changes: after one, in sync again (the foreign one stays).
    proxy.sync(full=True)
    code, out = kernel(tb, proxy, capsys)
    assert code == 0, out
    assert f"UDP  {FOREIGN}:53 rr" in out
