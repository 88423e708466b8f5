"""Inside the VM: `lace-proxy cleanup --kube-proxy` on the state kube-proxy's IPVS mode
leaves (kube-ipvs0, a dummy holding the ClusterIPs; virtual services on them and NodePorts on
the node's addresses, made with ipvsadm as kube-proxy makes them over netlink), and a
virtual service of someone else's, which stays."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from lace_proxy.demo.testbed import UPLINK_NODE4, Testbed, remove_stale_namespaces, request_tcp

pytestmark = pytest.mark.ipvs

VIP = "10.96.0.60"
FOREIGN = "10.99.0.1"  # not on kube-ipvs0, not a node address: not kube-proxy's


@pytest.fixture
def tb() -> Iterator[Testbed]:
    remove_stale_namespaces()
    with Testbed(pods=1) as testbed:
        yield testbed


def _services(tb: Testbed) -> set[str]:
    out = tb.exec(tb.node, ["ipvsadm", "-Ln"]).stdout
    return {" ".join(line.split()[:2]) for line in out.splitlines() if line[:3] in ("TCP", "UDP")}


def test_cleanup_kube_proxy_removes_its_ipvs_state(tb: Testbed) -> None:
    pod = f"{tb.pods[0].ipv4}:8080"
    sh = tb.exec
    sh(tb.node, ["ip", "link", "add", "kube-ipvs0", "type", "dummy"])
    sh(tb.node, ["ip", "addr", "add", f"{VIP}/32", "dev", "kube-ipvs0"])
    for vs in (f"{VIP}:80", f"{UPLINK_NODE4}:30080", f"{FOREIGN}:80"):
        sh(tb.node, ["ipvsadm", "-A", "-t", vs, "-s", "rr"])
        sh(tb.node, ["ipvsadm", "-a", "-t", vs, "-r", pod, "-m"])
    sh(tb.node, ["ipvsadm", "-A", "-u", f"{VIP}:53", "-s", "rr"])
    # kube-proxy's IPVS mode masquerades with iptables; here the pod answers the client
    # directly (its route back goes through the node), which is enough to see IPVS at work.
    result = request_tcp(tb.client, VIP, 80)
    assert result.reply is not None and result.reply.name == "pod1", result

    argv = [sys.executable, "-m", "lace_proxy", "cleanup", "--kube-proxy"]
    done = sh(tb.node, argv)
    assert "removed  kube-ipvs0 and 3 IPVS virtual services" in done.stdout, done.stdout
    assert _services(tb) == {f"TCP {FOREIGN}:80"}
    links = sh(tb.node, ["ip", "-o", "link"]).stdout
    assert "kube-ipvs0" not in links
    again = subprocess.run(
        ["ip", "netns", "exec", tb.node.ns.name, *argv], capture_output=True, text=True
    )
    assert again.returncode == 0, again.stderr
    assert "skipped  kube-ipvs0: not present" in again.stdout


@pytest.mark.parametrize("addresses", ["interface", "localRoutes"])
def test_with_lace_proxys_ipvs_mode_in_place_its_state_and_node_ports_stay(
    tb: Testbed, addresses: str
) -> None:
    """lace-proxy's IPVS mode is in place (lace-ipvs0, or its local routes): the NodePorts on
    the node's addresses are left to it (it owns that range too, and its next full sync
    rewrites them), and so are its service addresses and their virtual services."""
    sh = tb.exec
    mine = "10.96.0.61"
    sh(tb.node, ["ip", "link", "add", "kube-ipvs0", "type", "dummy"])
    sh(tb.node, ["ip", "addr", "add", f"{VIP}/32", "dev", "kube-ipvs0"])
    if addresses == "interface":
        sh(tb.node, ["ip", "link", "add", "lace-ipvs0", "type", "dummy"])
        sh(tb.node, ["ip", "addr", "add", f"{mine}/32", "dev", "lace-ipvs0"])
    else:
        where = ["dev", "lo", "table", "local", "proto", "145"]
        sh(tb.node, ["ip", "route", "add", "local", f"{mine}/32", *where])
    for vs in (f"{VIP}:80", f"{UPLINK_NODE4}:30080", f"{mine}:80"):
        sh(tb.node, ["ipvsadm", "-A", "-t", vs, "-s", "rr"])
    try:
        done = sh(tb.node, [sys.executable, "-m", "lace_proxy", "cleanup", "--kube-proxy"])
        assert "removed  kube-ipvs0 and 1 IPVS virtual services" in done.stdout, done.stdout
        assert _services(tb) == {f"TCP {UPLINK_NODE4}:30080", f"TCP {mine}:80"}
        local = sh(tb.node, ["ip", "route", "show", "table", "local", mine]).stdout
        assert f"local {mine} dev" in local, local
    finally:
        sh(tb.node, ["ip", "link", "del", "lace-ipvs0"], check=False)
