"""`lace-proxy kernel` on the host (no IPVS here): bad input, nftables mode and a missing
ip_vs are exit code 2 with a clear message; the diff's rules, given a kernel view as data
(`kernel_document`, the report the command prints).

The real kernel, witnessed by ipvsadm, is tests/vm/inner/test_kernel_cli.py's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lace_proxy.cli import build_parser, main
from lace_proxy.cli.kernel import ipvs_plans
from lace_proxy.config import config_from_args
from lace_proxy.dataplane.ipvs import KernelView, RealServer, Target, VirtualServer
from lace_proxy.dataplane.ipvs.report import IPVS_UNAVAILABLE, ipvs_text, kernel_document

EXAMPLES = Path(__file__).resolve().parents[2] / "lace_proxy" / "demo" / "manifests"
IPVS_ARGS = ["--manifests", str(EXAMPLES), "--proxy-mode", "ipvs"]
NODE = ["--hostname-override", "sandbox-node"]
VIP4 = VirtualServer("TCP", "10.96.0.10", 80)
VIP6 = VirtualServer("TCP", "fd00:96::10", 80)
PORT4 = VirtualServer("TCP", "10.250.0.1", 30080)
PORT6 = VirtualServer("TCP", "fd00:250::1", 30080)
PODS4 = tuple(f"10.251.0.1{i}" for i in (1, 2, 3))
PODS6 = tuple(f"fd00:251::1{i}" for i in (1, 2, 3))


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["kernel", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--manifests", str(EXAMPLES)], "the proxy mode is nftables: it programs no IPVS"),
        (["--proxy-mode", "ipvs"], "give --manifests DIR"),
        (["--proxy-mode", "ipvs", "--manifests", "/nonexistent"], "no such file or folder"),
        ([*IPVS_ARGS, "--netns", "bad/name"], "invalid network namespace name"),
        ([*IPVS_ARGS, "--netns", "lace-no-such-ns"], "no network namespace lace-no-such-ns"),
    ],
)
def test_bad_input_is_exit_code_2_naming_it(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(args, capsys)
    assert code == 2 and out == ""
    assert err.startswith("lace-proxy: kernel: ") and message in err, err


@pytest.mark.skipif(
    Path("/proc/net/ip_vs").exists(), reason="this kernel has IPVS (the VM tests cover it)"
)
def test_a_kernel_without_ipvs_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(IPVS_ARGS, capsys)
    assert (code, out) == (2, "")
    assert err == f"lace-proxy: kernel: {IPVS_UNAVAILABLE}\n"


def _rs(address: str, port: int, weight: int = 1, forward: str = "Masq") -> RealServer:
    return RealServer(address, port, forward, weight, 0, 0)


def _view(services: dict[VirtualServer, tuple[str, int, tuple[RealServer, ...]]]) -> KernelView:
    targets = {
        vs: Target(sched, persistence, frozenset((r.address, r.port) for r in rs if r.weight))
        for vs, (sched, persistence, rs) in services.items()
    }
    real = {vs: rs for vs, (_, _, rs) in services.items()}
    return KernelView(
        targets, real, frozenset({"10.96.0.10", "fd00:96::10"}), ("10.250.0.1", "fd00:250::1")
    )


def _in_sync() -> dict[VirtualServer, tuple[str, int, tuple[RealServer, ...]]]:
    v4 = tuple(_rs(a, 8000) for a in PODS4)
    v6 = tuple(_rs(a, 8000) for a in PODS6)
    return {VIP4: ("rr", 0, v4), VIP6: ("rr", 0, v6), PORT4: ("rr", 0, v4), PORT6: ("rr", 0, v6)}


def report(view: KernelView, output: str = "text") -> tuple[int, str]:
    """The command's report for this kernel view and the example manifests (exit code, text)."""
    args = build_parser().parse_args(["kernel", *IPVS_ARGS, *NODE])
    cfg = config_from_args(args)
    backend, plans = ipvs_plans(args, cfg)  # reads the manifests; touches no kernel
    doc = kernel_document(cfg, backend, plans, view)
    text = json.dumps(doc) if output == "json" else ipvs_text(doc)
    return (0 if doc["inSync"] else 1), text


def test_in_sync_lists_like_ipvsadm_with_service_names() -> None:
    services = _in_sync()
    # A draining real server (removed, weight 0) is what the proxy leaves: not a difference;
    # a virtual service on an address that is not ours is listed, never diffed.
    services[VIP4] = ("rr", 0, (*services[VIP4][2], _rs("10.251.0.19", 8000, weight=0)))
    services[VirtualServer("UDP", "10.77.0.1", 53)] = ("wlc", 0, (_rs("10.77.0.2", 53),))
    code, out = report(_view(services))
    assert code == 0, out
    lines = out.splitlines()
    assert lines[1].split() == ["Prot", "LocalAddress:Port", "Scheduler", "Flags", "SERVICE"]
    assert lines[2].split() == [
        "->",
        "RemoteAddress:Port",
        "Forward",
        "Weight",
        "ActiveConn",
        "InActConn",
    ]
    assert lines[3].split() == ["TCP", "10.96.0.10:80", "rr", "default/web:http"]
    assert lines[4].split() == ["->", "10.251.0.11:8000", "Masq", "1", "0", "0"]
    assert "TCP  [fd00:250::1]:30080 rr" in out
    assert "  -> [fd00:251::13]:8000" in out
    assert "UDP  10.77.0.1:53 wlc" in out and "(foreign)" in out
    assert "draining    TCP  10.96.0.10:80 -> 10.251.0.19:8000" in out
    assert lines[-1] == "in sync: IPVS holds the table's 4 virtual services"


def test_diff_names_each_difference() -> None:
    services = _in_sync()
    del services[PORT6]  # missing
    # Scheduler changed, pod3 deleted, pod2 at weight 0 though desired, a stranger serving.
    services[VIP4] = (
        "wlc",
        0,
        (_rs(PODS4[0], 8000), _rs(PODS4[1], 8000, weight=0), _rs("10.251.0.20", 8000)),
    )
    services[PORT4] = ("rr", 10800, services[PORT4][2])  # persistence
    services[VirtualServer("TCP", "10.96.0.10", 81)] = ("rr", 0, (_rs(PODS4[0], 8000),))
    services[VirtualServer("TCP", "10.250.0.1", 30999)] = ("rr", 0, ())  # a NodePort of ours
    services[VirtualServer("TCP", "10.250.0.1", 22)] = ("rr", 0, ())  # not in the range
    code, out = report(_view(services), "json")
    assert code == 1
    doc: dict[str, Any] = json.loads(out)
    diff = doc["diff"]
    assert doc["inSync"] is False and doc["node"] == "sandbox-node" and doc["netns"] is None
    assert [(m["address"], m["port"], m["service"]) for m in diff["missing"]] == [
        ("fd00:250::1", 30080, "default/web:http")
    ]
    assert [(u["address"], u["port"]) for u in diff["unexpected"]] == [
        ("10.96.0.10", 81),
        ("10.250.0.1", 30999),
    ]
    assert diff["different"] == [
        {
            "protocol": "TCP",
            "address": "10.96.0.10",
            "port": 80,
            "service": "default/web:http",
            "scheduler": {"kernel": "wlc", "table": "rr"},
            "missingRealServers": [{"address": "10.251.0.13", "port": 8000}],
            "unexpectedRealServers": [{"address": "10.251.0.20", "port": 8000, "weight": 1}],
            "zeroWeightRealServers": [{"address": "10.251.0.12", "port": 8000}],
        },
        {
            "protocol": "TCP",
            "address": "10.250.0.1",
            "port": 30080,
            "service": "default/web:http",
            "persistence": {"kernel": 10800, "table": 0},
        },
    ]
    assert diff["draining"] == []
    listed = {(s["address"], s["port"]): s for s in doc["services"]}
    assert listed[("10.250.0.1", 22)]["ours"] is False
    assert listed[("10.250.0.1", 22)]["service"] is None
    assert listed[("10.96.0.10", 80)]["realServers"][1] == {
        "address": "10.251.0.12",
        "port": 8000,
        "forward": "Masq",
        "weight": 0,
        "activeConns": 0,
        "inactiveConns": 0,
    }
    # The same in text.
    code, out = report(_view(services))
    assert code == 1
    diff_text = out[out.index("Against the table") :]
    assert "missing     TCP  [fd00:250::1]:30080 rr" in diff_text
    assert "unexpected  TCP  10.96.0.10:81 rr" in diff_text
    assert "-> 10.251.0.13:8000  missing" in diff_text
    assert "-> 10.251.0.20:8000  unexpected (weight 1)" in diff_text
    assert "-> 10.251.0.12:8000  at weight 0, but in the table" in diff_text
    assert "persistence 10800 s in the kernel, none in the table" in diff_text
    assert "10.250.0.1:22" not in diff_text
    assert out.splitlines()[-1] == "not in sync: 5 virtual services differ"
