"""The real kube-proxy v1.37.2 in a network namespace (testkit.kubeproxy), against the real
kube-apiserver: proof that the runner works, for the tests that compare lace-proxy with it or
switch a node over from it.

The session's control plane listens on loopback only, which a namespace cannot reach; this
test starts one of its own on 0.0.0.0 and dials it through an ApiLink.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from typing import Any

import pytest
from kubernetes import client

from testkit.controlplane.cluster import ControlPlane
from testkit.controlplane.pytest_plugin import _binaries
from testkit.kubeproxy import ApiLink, KubeProxy, Netns, node_object, ruleset

pytestmark = pytest.mark.netns

NODE = "kp-node"
PORT = 80


@pytest.fixture(autouse=True)
def _capable() -> None:
    """tests/api has no netns conftest: skip here as tests/netns does."""
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces, veth pairs, nftables)")
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"needs {' and '.join(missing)} on PATH")


def service_ips(objects: list[dict[str, Any]]) -> set[tuple[str, str, int]]:
    """The keys (address, protocol, port) of kube-proxy's `service-ips` verdict map."""
    keys = set()
    for obj in objects:
        found = obj.get("map")
        if found and found["table"] == "kube-proxy" and found["name"] == "service-ips":
            for key, _verdict in found.get("elem", []):
                address, protocol, port = key["concat"]
                keys.add((address, protocol, port))
    return keys


def test_kube_proxy_programs_a_cluster_ip_in_its_namespace() -> None:
    bins = _binaries()
    with contextlib.ExitStack() as stack:
        ns = stack.enter_context(Netns())
        link = stack.enter_context(ApiLink(ns.name))
        cp = stack.enter_context(
            ControlPlane(bins=bins, bind_address="0.0.0.0", sans=[link.host_address])
        )
        kubeconfig = cp.write_admin_kubeconfig(
            cp.directory / "netns.kubeconfig", server=link.url(cp.port)
        )
        api = stack.enter_context(cp.admin_client())
        core, discovery = client.CoreV1Api(api), client.DiscoveryV1Api(api)
        core.create_node(node_object(NODE, link.netns_address))
        svc = core.create_namespaced_service(
            "default",
            {
                "metadata": {"name": "web"},
                "spec": {"ports": [{"name": "http", "port": PORT, "targetPort": 8080}]},
            },
        )
        cluster_ip = svc.spec.cluster_ip
        discovery.create_namespaced_endpoint_slice(
            "default",
            {
                "metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                "endpoints": [
                    {"addresses": [ip], "conditions": {"ready": True}, "nodeName": node}
                    for ip, node in (("10.128.0.1", NODE), ("10.128.1.1", "other-node"))
                ],
            },
        )
        proxy = stack.enter_context(KubeProxy(ns.name, kubeconfig, NODE, bins=bins))

        def programmed(objects: list[dict[str, Any]]) -> bool:
            """The ClusterIP in the IPv4 table, and the IPv6 table (synced after it) made."""
            return (cluster_ip, "tcp", PORT) in service_ips(objects) and ("ip6", "kube-proxy") in {
                (o["table"]["family"], o["table"]["name"]) for o in objects if "table" in o
            }

        deadline = time.monotonic() + 20
        objects = ruleset(ns.name)
        while not programmed(objects):
            proxy.check_alive()
            assert time.monotonic() < deadline, f"not programmed:\n{proxy.logs()}"
            time.sleep(0.1)
            objects = ruleset(ns.name)
        dnat = json.dumps(
            [o for o in objects if "-default/web/tcp/http" in o.get("rule", {}).get("chain", "")]
        )
        for endpoint in ("10.128.0.1", "10.128.1.1"):  # the service chain's DNAT map (1.35+)
            assert f'"{endpoint}"' in dnat, dnat

        proxy.stop()  # kube-proxy has no SIGTERM handler: it dies of the signal, rules kept
        assert service_ips(ruleset(ns.name)), "kube-proxy removed its rules on SIGTERM"
        proxy.cleanup()
        assert not any("table" in o for o in ruleset(ns.name)), "left after --cleanup"
