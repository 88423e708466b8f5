"""`lace-proxy explain --netns`: the kernel's sets agree with the table's verdict, and a
tampered set is reported, on a node programmed by the real pipeline (and real packets
confirm each verdict)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lace_proxy.cli import main
from lace_proxy.dataplane.nftables.render import name_hash
from lace_proxy.demo.testbed import (
    CLIENT4,
    POD_CIDR4,
    POD_CIDR6,
    UPLINK_NODE4,
    Result,
    Testbed,
    request_tcp,
)

from ..lacekit import external, l3, net
from .proxykit import NODE, Harness, endpoints, service

pytestmark = pytest.mark.netns

VIP = "10.96.0.31"
NODE_PORT = 30080
OWN_POD_CIDR = "10.251.0.8/30"  # pod1 (.11) is this node's own pod, pod2 (.12) is not
NETWORKS = [
    l3("default", POD_CIDR4, POD_CIDR6),
    external("underlay", "10.250.0.0/24"),
    net("host-local", "hostLocal"),
]


def node_object() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE},
        "spec": {"podCIDRs": [OWN_POD_CIDR]},
        "status": {"addresses": [{"type": "InternalIP", "address": UPLINK_NODE4}]},
    }


@pytest.fixture(params=[0, 4], ids=["whole", "split"])
def node(
    request: pytest.FixtureRequest, make_testbed: Callable[..., Testbed], tmp_path: Path
) -> Iterator[Harness]:
    """The node's proxy, its table whole or its biggest containers split in four (explain
    looks a frontend up in each part)."""
    tb = make_testbed(pods=2)
    proxy = Harness(tb, tmp_path / "manifests", parts=request.param)
    try:
        svc = service("web", [VIP], type="NodePort", node_port=NODE_PORT)
        proxy.write("web", svc, endpoints("web", tb.pods))
        proxy.write("node", node_object())
        proxy.write("networks", *NETWORKS)
        yield proxy
    finally:
        proxy.close()


def explain(
    capsys: pytest.CaptureFixture[str], proxy: Harness, src: str, dst: str
) -> tuple[int, dict[str, Any]]:
    netns = proxy.tb.node.ns.name  # type: ignore[attr-defined]
    argv = ["explain", src, dst, "--manifests", str(proxy.folder), "--hostname-override", NODE]
    code = main([*argv, "--cluster-cidr", POD_CIDR4, "--netns", netns, "-o", "json"])
    return code, json.loads(capsys.readouterr().out)


def nft(proxy: Harness, command: str) -> None:
    proxy.tb.exec(proxy.tb.node, ["nft", command])


def denied(result: Result) -> bool:
    return result.icmp is not None and (result.icmp.type, result.icmp.code) == (3, 13)


def test_kernel_agrees_with_allowed_and_denied_and_tells_a_tampered_set(
    capsys: pytest.CaptureFixture[str], node: Harness
) -> None:
    tb = node.tb
    pod = tb.pods[0].ipv4
    code, doc = explain(capsys, node, pod, f"{VIP}:80")
    assert doc["kernel"]["status"] == "not programmed", doc["kernel"]
    assert doc["kernel"]["detail"] == "no table inet lace-proxy"
    node.sync()

    code, doc = explain(capsys, node, pod, f"{VIP}:80")
    assert (code, doc["verdict"]) == (0, "allowed")
    assert doc["kernel"]["status"] == "agrees", doc["kernel"]
    assert request_tcp(tb.pods[0], VIP, 80).outcome == "reply"

    code, doc = explain(capsys, node, CLIENT4, f"{VIP}:80")
    assert (code, doc["verdict"], doc["source"]["network"]) == (1, "denied", "underlay")
    assert doc["kernel"]["status"] == "agrees", doc["kernel"]
    assert denied(request_tcp(tb.client, VIP, 80))

    code, doc = explain(capsys, node, CLIENT4, f"{UPLINK_NODE4}:{NODE_PORT}")
    assert (code, doc["destination"]["kind"]) == (1, "NodePort")
    assert doc["kernel"]["status"] == "agrees", doc["kernel"]
    assert denied(request_tcp(tb.client, UPLINK_NODE4, NODE_PORT))

    # Take the frontend out of default's reach set: the kernel now refuses what the table allows.
    reach = f"reach-{name_hash('default')}-v4"
    nft(node, f"delete element inet lace-proxy {reach} {{ {VIP} . tcp . 80 }}")
    code, doc = explain(capsys, node, pod, f"{VIP}:80")
    assert (code, doc["verdict"]) == (0, "allowed")  # the table's verdict is unchanged
    assert doc["kernel"]["status"] == "differs", doc["kernel"]
    assert f"{reach} (default's reach set) should hold {VIP} . tcp . 80" in doc["kernel"]["detail"]
    assert denied(request_tcp(tb.pods[0], VIP, 80))  # and the kernel indeed differs

    # Let underlay in behind the table's back: a denied verdict the kernel does not enforce.
    underlay = f"reach-{name_hash('underlay')}-v4"
    nft(node, f"add element inet lace-proxy {underlay} {{ {VIP} . tcp . 80 }}")
    code, doc = explain(capsys, node, CLIENT4, f"{VIP}:80")
    assert (code, doc["kernel"]["status"]) == (1, "differs")
    assert "should not hold" in doc["kernel"]["detail"]
    assert request_tcp(tb.client, VIP, 80).outcome == "reply"

    # A full sync repairs the kernel, and explain agrees again.
    node.sync(full=True)
    assert explain(capsys, node, pod, f"{VIP}:80")[1]["kernel"]["status"] == "agrees"
    assert explain(capsys, node, CLIENT4, f"{VIP}:80")[1]["kernel"]["status"] == "agrees"

    # A service in the manifests that the proxy has not synced yet.
    node.write("late", service("late", ["10.96.0.32"]), endpoints("late", tb.pods, name="late"))
    code, doc = explain(capsys, node, pod, "10.96.0.32:80")
    assert (code, doc["kernel"]["status"]) == (0, "not programmed")
    assert "10.96.0.32 . tcp . 80 is not in service-ips-v4" in doc["kernel"]["detail"]


def test_kernel_agrees_on_the_nodes_own_traffic_to_pods(
    capsys: pytest.CaptureFixture[str], node: Harness
) -> None:
    tb = node.tb
    node.sync()
    own, other = tb.pods[0], tb.pods[1]
    code, doc = explain(capsys, node, "node", f"{own.ipv4}:8080")
    assert (code, doc["reason"]) == (0, "the node reaches its own podCIDRs always (kubelet probes)")
    assert doc["kernel"]["status"] == "agrees", doc["kernel"]
    assert request_tcp(tb.node, own.ipv4, 8080).outcome == "reply"

    code, doc = explain(capsys, node, "node", f"{other.ipv4}:8080")
    assert (code, doc["verdict"]) == (1, "denied")
    assert doc["kernel"]["status"] == "agrees", doc["kernel"]
    assert denied(request_tcp(tb.node, other.ipv4, 8080))

    # Without the node's podCIDRs in the kernel, its own pod would be refused: reported.
    nft(node, f"delete element inet lace-proxy local-pod-cidrs-v4 {{ {OWN_POD_CIDR} }}")
    code, doc = explain(capsys, node, "node", f"{own.ipv4}:8080")
    assert (code, doc["kernel"]["status"]) == (0, "differs")
    assert "local-pod-cidrs-v4" in doc["kernel"]["detail"]
    assert denied(request_tcp(tb.node, own.ipv4, 8080))
