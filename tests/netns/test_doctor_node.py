"""`lace-proxy doctor node` on a node namespace made wrong the way real nodes are: kube-proxy's
leftovers created as kube-proxy creates them (its nftables table, iptables-nft chains,
kube-ipvs0), forwarding off, MTUs that disagree; then put right."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from lace_proxy.cli import main
from lace_proxy.demo.testbed import Testbed

pytestmark = pytest.mark.netns


def doctor(
    tb: Testbed, tmp_path: Path, capsys: pytest.CaptureFixture[str], *nodes: dict[str, Any]
) -> tuple[int, dict[str, dict[str, str]]]:
    folder = tmp_path / "manifests"
    folder.mkdir(exist_ok=True)
    (folder / "nodes.yaml").write_text(yaml.safe_dump_all(nodes))
    argv = ["doctor", "node", "--netns", tb.node.ns.name, "-o", "json"]
    argv += ["--hostname-override", "node-a", "--manifests", str(folder)]
    config = tmp_path / "proxy.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
                "kind": "KubeProxyConfiguration",
                "detectLocalMode": "InterfaceNamePrefix",
                "detectLocal": {"interfaceNamePrefix": "vp"},  # the pods' veths: vp1, ...
            }
        )
    )
    argv += ["--config", str(config)]
    code = main(argv)
    out = capsys.readouterr()
    assert code in (0, 1), out.err
    doc = json.loads(out.out)
    return code, {c["check"]: c for c in doc["checks"]}


def node(name: str, mtu: int) -> dict[str, Any]:
    meta = {"name": name, "annotations": {"lace-cni.io/mtu": str(mtu)}}
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta}


def test_doctor_node_finds_leftovers_sysctls_and_mtus(
    make_testbed: Callable[..., Testbed], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tb = make_testbed(pods=1)
    code, checks = doctor(tb, tmp_path, capsys, node("node-a", 1500), node("node-b", 1500))
    assert code == 0, checks
    assert checks["kube_proxy"]["status"] == "ok" and checks["ip_forward"]["status"] == "ok"
    assert checks["mtu"]["message"] == "uplink gw0 MTU 1500, consistent"

    sh = tb.exec
    sh(tb.node, ["nft", "add", "table", "ip", "kube-proxy"])
    sh(tb.node, ["nft", "add", "table", "ip", "nat"])
    sh(tb.node, ["nft", "add", "chain", "ip", "nat", "KUBE-SERVICES"])
    sh(tb.node, ["nft", "add", "chain", "ip", "nat", "KUBE-KUBELET-CANARY"])  # kubelet's own
    sh(tb.node, ["sysctl", "-qw", "net.ipv4.conf.gw0.rp_filter=1"])
    sh(tb.node, ["ip", "link", "add", "kube-ipvs0", "type", "veth", "peer", "name", "kipvs-peer"])
    sh(tb.node, ["ip", "addr", "add", "10.96.0.1/32", "dev", "kube-ipvs0"])
    sh(tb.node, ["sysctl", "-qw", "net.ipv4.ip_forward=0"])
    sh(tb.node, ["ip", "link", "set", "gw0", "mtu", "1400"])
    code, checks = doctor(tb, tmp_path, capsys, node("node-a", 1500), node("node-b", 9000))
    assert code == 1
    problems = {name for name, c in checks.items() if c["status"] == "problem"}
    assert problems == {
        "kube_proxy_nftables",
        "kube_proxy_iptables",
        "kube_ipvs0",
        "ip_forward",
        "mtu",
    }
    assert "ip kube-proxy" in checks["kube_proxy_nftables"]["message"]
    assert "(1: ip nat KUBE-SERVICES)" in checks["kube_proxy_iptables"]["message"]
    assert checks["rp_filter"]["status"] == "note"  # the uplink's own setting counts
    assert "net.ipv4.conf.gw0.rp_filter" in checks["rp_filter"]["message"]
    assert "lace-proxy cleanup --kube-proxy" in checks["kube_ipvs0"]["action"]
    assert checks["ip_forward"]["action"] == "set net.ipv4.ip_forward=1"

    # Put right: lace-proxy's own view agrees again.
    sh(tb.node, ["nft", "delete", "table", "ip", "kube-proxy"])
    sh(tb.node, ["nft", "delete", "table", "ip", "nat"])
    sh(tb.node, ["ip", "link", "del", "kube-ipvs0"])
    sh(tb.node, ["sysctl", "-qw", "net.ipv4.ip_forward=1"])
    sh(tb.node, ["ip", "link", "set", "gw0", "mtu", "1500"])
    code, checks = doctor(tb, tmp_path, capsys, node("node-a", 1500), node("node-b", 1500))
    assert code == 0, checks


def test_doctor_node_names_each_mtu_disagreement(
    make_testbed: Callable[..., Testbed], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tb = make_testbed(pods=1)
    tb.exec(tb.node, ["ip", "link", "set", "gw0", "mtu", "1400"])
    code, _ = doctor(tb, tmp_path, capsys, node("node-a", 1400), node("node-b", 1400))
    assert code == 1  # the pod interface vp1 (1500) is above the uplink
    tb.exec(tb.node, ["ip", "link", "set", "vp1", "mtu", "1400"])
    code, checks = doctor(tb, tmp_path, capsys, node("node-a", 1500), node("node-b", 1400))
    assert code == 1
    assert "Node object says MTU 1500" in checks["mtu"]["message"]
