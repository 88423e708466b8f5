"""`lace-proxy explain` through the real pipeline: manifest folder → source → proxier → table.

Each test writes a folder, runs the command in-process (`--no-kernel`: no kernel is read
here; tests/netns/test_explain_kernel.py checks the kernel side) and reads its answer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from lace_proxy.cli import main
from lace_proxy.explain import Query, QueryError, parse_query

from ..helpers import api_service_cidr
from ..lacekit import external, l3, net, routing, service_binding, service_routing

NODE = "node-a"
NODE_IP = "10.250.0.1"
WEB_VIP = "10.96.0.40"
NETWORKS = [
    l3("default", "10.251.0.0/16"),
    l3("blue", "10.254.0.0/16"),
    external("underlay", "10.250.0.0/24"),
    net("host-local", "hostLocal"),
]
INTERNET = external("internet", "0.0.0.0/0")
HOST_PEERING = routing("host-to-default", "host-local", "default")


def service(
    name: str,
    vip: str,
    *,
    labels: dict[str, str] | None = None,
    node_port: int = 0,
    **spec: Any,
) -> dict[str, Any]:
    port: dict[str, Any] = {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}
    if node_port:
        port["nodePort"] = node_port
    status = spec.pop("status", {})
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "labels": labels or {}},
        "spec": {
            "type": "NodePort" if node_port else "ClusterIP",
            "clusterIPs": [vip],
            "ports": [port],
            **spec,
        },
        "status": status,
    }


def endpoints(service: str, *addresses: str, node: str = NODE, **conditions: bool) -> dict:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{service}-{len(addresses)}-{node}",
            "namespace": "default",
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": [a], "nodeName": node, "conditions": {"ready": True, **conditions}}
            for a in addresses
        ],
    }


def node_object(name: str = NODE, address: str = NODE_IP, pod_cidr: str = "10.251.1.0/24") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "spec": {"podCIDRs": [pod_cidr]},
        "status": {"addresses": [{"type": "InternalIP", "address": address}]},
    }


WEB = [
    service("web", WEB_VIP, labels={"app": "web"}, node_port=30080),
    endpoints("web", "10.251.1.11", "10.251.2.12"),
]


class Folder:
    """A manifest folder and the command run on it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.manifests = root / "manifests"
        self.manifests.mkdir()
        self.config: Path | None = None

    def write(self, name: str, *objects: dict[str, Any]) -> None:
        (self.manifests / f"{name}.yaml").write_text(yaml.safe_dump_all(objects))

    def service_cidrs(self, *cidrs: str) -> None:
        self.config = self.root / "config.yaml"
        doc = {
            "apiVersion": "lace-proxy.lace-cni.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "lace": {"serviceCIDRs": list(cidrs)},
        }
        self.config.write_text(yaml.safe_dump(doc))

    def argv(self, src: str, dst: str, *extra: str) -> list[str]:
        argv = ["explain", src, dst, "--manifests", str(self.manifests)]
        argv += ["--hostname-override", NODE, "--no-kernel", *extra]
        if self.config is not None:
            argv += ["--config", str(self.config)]
        return argv


@pytest.fixture
def folder(tmp_path: Path) -> Folder:
    f = Folder(tmp_path)
    f.write("nodes", node_object())
    f.write("web", *WEB)
    f.write("networks", *NETWORKS)
    return f


Run = tuple[int, dict[str, Any]]


def run(capsys: pytest.CaptureFixture[str], folder: Folder, src: str, dst: str, *extra: str) -> Run:
    code = main(folder.argv(src, dst, "-o", "json", *extra))
    return code, json.loads(capsys.readouterr().out)


def text(capsys: pytest.CaptureFixture[str], folder: Folder, src: str, dst: str) -> tuple[int, str]:
    code = main(folder.argv(src, dst))
    return code, capsys.readouterr().out


# -- pods and clients reaching a service --------------------------------------------------------


def test_pod_of_the_services_own_network_is_allowed(
    capsys: pytest.CaptureFixture[str], folder: Folder
) -> None:
    code, doc = run(capsys, folder, "10.251.3.3", f"{WEB_VIP}:80")
    assert code == 0
    assert doc["verdict"] == "allowed"
    assert doc["source"] == {"network": "default", "reason": doc["source"]["reason"]}
    assert "10.251.0.0/16" in doc["source"]["reason"]
    assert doc["destination"]["kind"] == "ClusterIP"
    assert doc["destination"]["service"] == "default/web"
    assert doc["binding"]["network"] == "default"
    assert "its endpoints' pod network" in doc["binding"]["reason"]
    assert doc["allowedBy"] == [{"kind": "own network", "name": "default"}]
    assert [(b["ip"], b["port"], b["ready"], b["local"]) for b in doc["backends"]] == [
        ("10.251.1.11", 8080, True, True),
        ("10.251.2.12", 8080, True, True),
    ]


def test_pod_of_another_network_needs_peering_and_then_names_it(
    capsys: pytest.CaptureFixture[str], folder: Folder
) -> None:
    code, doc = run(capsys, folder, "10.254.0.7", f"{WEB_VIP}:80")
    assert code == 1
    assert doc["verdict"] == "denied"
    assert doc["source"]["network"] == "blue"
    assert doc["reason"] == (
        "needs a NetworkRoutingPolicy from blue to default "
        "(or a ServiceRoutingPolicy granting blue the services of default)"
    )
    assert doc["backends"] == []
    folder.write("peering", routing("blue-to-default", "blue", "default"))
    code, doc = run(capsys, folder, "10.254.0.7", f"{WEB_VIP}:80")
    assert code == 0
    assert doc["verdict"] == "allowed"
    assert doc["allowedBy"] == [{"kind": "NetworkRoutingPolicy", "name": "blue-to-default"}]
    assert "NetworkRoutingPolicy blue-to-default (peers blue to default)" in doc["reason"]


def test_service_routing_policy_grants_only_the_services_it_selects(
    capsys: pytest.CaptureFixture[str], folder: Folder
) -> None:
    # A client of the underlay network, to the NodePort on the node's address.
    folder.write("grant", service_routing("underlay-db", "underlay", "default", {"app": "db"}))
    code, doc = run(capsys, folder, "10.250.0.2", f"{NODE_IP}:30080")
    assert code == 1
    assert doc["destination"]["kind"] == "NodePort"
    assert doc["source"]["network"] == "underlay"
    assert doc["verdict"] == "denied"
    assert "needs a NetworkRoutingPolicy from underlay to default" in doc["reason"]
    assert (
        "ServiceRoutingPolicy underlay-db grants underlay the services of default, but its "
        "serviceSelector does not pick default/web" in doc["reason"]
    )
    folder.write("grant", service_routing("underlay-web", "underlay", "default", {"app": "web"}))
    code, doc = run(capsys, folder, "10.250.0.2", f"{NODE_IP}:30080")
    assert code == 0
    assert doc["allowedBy"] == [{"kind": "ServiceRoutingPolicy", "name": "underlay-web"}]
    assert "grants underlay the services of default" in doc["reason"]


def test_source_in_no_network_has_no_identity(
    capsys: pytest.CaptureFixture[str], folder: Folder
) -> None:
    code, doc = run(capsys, folder, "192.0.2.9", f"{WEB_VIP}:80")
    assert code == 1
    assert doc["source"]["network"] is None
    assert doc["reason"] == "no identity: the source lies in no network"
    # The internet network covers every address: then it is that network's.
    folder.write("internet", INTERNET)
    code, doc = run(capsys, folder, "192.0.2.9", f"{WEB_VIP}:80")
    assert doc["source"]["network"] == "internet"
    assert "longest-prefix match over 0.0.0.0/0" in doc["source"]["reason"]


# -- the node's own traffic (DESIGN.md §3's table) ----------------------------------------------


def test_node_to_cluster_ip_needs_service_cidrs_then_peering(
    capsys: pytest.CaptureFixture[str], folder: Folder
) -> None:
    code, doc = run(capsys, folder, "node", f"{WEB_VIP}:80")
    assert code == 1
    assert doc["verdict"] == "unproxied"
    assert doc["source"]["network"] == "host-local"
    assert doc["reason"] == (
        f"needs node.serviceCIDRs (lace.serviceCIDRs) to cover {WEB_VIP}: without it the "
        "node's connection leaves by its own routes"
    )
    # In IPVS mode the address is local: IPVS would take the connection, so it is refused.
    code, doc = run(capsys, folder, "node", f"{WEB_VIP}:80", "--proxy-mode", "ipvs")
    assert (code, doc["verdict"]) == (1, "unproxied")
    assert doc["reason"].endswith(
        "node's connection is refused as unroutable (IPVS would take it: the address is local)"
    )
    folder.service_cidrs("10.96.0.0/16")
    code, doc = run(capsys, folder, "node", f"{WEB_VIP}:80")
    assert code == 1
    assert doc["verdict"] == "denied"
    assert doc["reason"].startswith(
        "needs a NetworkRoutingPolicy from host-local to default (or a ServiceRoutingPolicy "
        "granting host-local the services of default)"
    )
    folder.write("peering", HOST_PEERING)
    code, doc = run(capsys, folder, "node", f"{WEB_VIP}:80")
    assert code == 0
    assert doc["verdict"] == "allowed"
    assert doc["allowedBy"] == [{"kind": "NetworkRoutingPolicy", "name": "host-to-default"}]
    assert len(doc["backends"]) == 2


def test_an_unallocated_cluster_ip_is_dropped_and_named(
    capsys: pytest.CaptureFixture[str], folder: Folder
) -> None:
    # No service CIDR known: the address is not lace-proxy's.
    code, doc = run(capsys, folder, "10.251.3.3", "10.96.0.99:80")
    assert (code, doc["verdict"], doc["destination"]["kind"]) == (0, "passes", "none")
    # lace.serviceCIDRs stands in while the cluster has no ServiceCIDR objects.
    folder.service_cidrs("10.96.0.0/16")
    code, doc = run(capsys, folder, "10.251.3.3", "10.96.0.99:80")
    assert (code, doc["verdict"]) == (1, "dropped")
    assert doc["destination"]["kind"] == "unallocated ClusterIP"
    assert doc["destination"]["description"] == (
        "an address of service CIDR 10.96.0.0/16 (lace.serviceCIDRs; the cluster has no "
        "ServiceCIDR objects) that no Service holds"
    )
    assert "no Service holds this address" in doc["reason"]
    # A ServiceCIDR object, once there, decides (here: a range without the address).
    folder.write("cidrs", api_service_cidr("10.97.0.0/16", "fd00:97::/112", name="kubernetes"))
    code, doc = run(capsys, folder, "node", "10.96.0.99:80")
    assert doc["destination"]["kind"] == "none"
    code, doc = run(capsys, folder, "node", "10.97.3.4:80")
    assert (code, doc["verdict"]) == (1, "dropped")
    assert "10.97.0.0/16 (ServiceCIDR kubernetes)" in doc["destination"]["description"]
    # Allocated ClusterIPs are unchanged.
    folder.write("cidrs", api_service_cidr("10.96.0.0/16", name="kubernetes"))
    code, doc = run(capsys, folder, "10.251.3.3", f"{WEB_VIP}:80")
    assert (code, doc["verdict"]) == (0, "allowed")


def test_a_service_cidr_with_a_bad_prefix_is_rejected_with_its_reason(
    capsys: pytest.CaptureFixture[str], folder: Folder
) -> None:
    folder.write("cidrs", api_service_cidr("10.96.0.1/16", name="kubernetes"))
    code, doc = run(capsys, folder, "10.251.3.3", "10.96.0.99:80")
    assert (code, doc["verdict"]) == (0, "passes")
    assert [r.split(": ", 1)[1] for r in doc["rejected"]] == [
        'ServiceCIDR kubernetes: spec.cidrs[0]="10.96.0.1/16": host bits set '
        "(the network is 10.96.0.0/16)"
    ]


def test_source_ranges_decide_for_the_node_by_its_address(
    capsys: pytest.CaptureFixture[str], folder: Folder
) -> None:
    folder.write("networks")  # plain kube-proxy
    lb = {"loadBalancer": {"ingress": [{"ip": "10.252.0.20"}]}}

    def guarded(*ranges: str) -> None:
        folder.write(
            "web",
            service(
                "web",
                WEB_VIP,
                type="LoadBalancer",
                status=lb,
                loadBalancerSourceRanges=list(ranges),
            ),
            WEB[1],
        )

    guarded("10.250.0.2/32")
    code, doc = run(capsys, folder, "node", "10.252.0.20:80")
    assert (code, doc["verdict"]) == (1, "dropped")
    assert "cover no InternalIP of this node" in doc["reason"]
    code, doc = run(capsys, folder, "10.250.0.2", "10.252.0.20:80")
    assert (code, doc["verdict"]) == (0, "allowed")
    guarded(f"{NODE_IP}/32")
    code, doc = run(capsys, folder, "node", "10.252.0.20:80")
    assert (code, doc["verdict"]) == (0, "allowed")
    code, doc = run(capsys, folder, "10.250.0.2", "10.252.0.20:80")
    assert (code, doc["verdict"]) == (1, "dropped")


def test_node_without_a_host_local_network_has_no_identity(
    capsys: pytest.CaptureFixture[str], folder: Folder
) -> None:
    folder.write("networks", *NETWORKS[:3])
    folder.service_cidrs("10.96.0.0/16")
    code, doc = run(capsys, folder, "node", f"{WEB_VIP}:80")
    assert code == 1
    assert doc["source"]["network"] is None
    assert doc["reason"].startswith("no identity: no hostLocal Network is declared")


def test_node_port_on_the_nodes_own_address_is_never_answered(
    capsys: pytest.CaptureFixture[str], folder: Folder
) -> None:
    folder.write("peering", HOST_PEERING)
    code, doc = run(capsys, folder, "node", f"{NODE_IP}:30080")
    assert code == 1
    assert doc["verdict"] == "dropped"
    assert doc["reason"] == "a NodePort on the node's own address is never answered from the node"
    # Without a Node object, --node-address says where the NodePorts answer.
    folder.write("nodes", node_object(name="elsewhere", address="10.250.0.9"))
    code, doc = run(capsys, folder, "node", f"{NODE_IP}:30080")
    assert doc["destination"]["kind"] == "none"
    assert any("--node-address" in n for n in doc["notes"])
    code, doc = run(capsys, folder, "node", f"{NODE_IP}:30080", "--node-address", NODE_IP)
    assert (code, doc["verdict"]) == (1, "dropped")


def test_node_to_another_nodes_node_port_is_decided_there_by_its_address(
    capsys: pytest.CaptureFixture[str], folder: Folder
) -> None:
    folder.write("nodes", node_object(), node_object("node-b", "10.250.0.9", "10.251.2.0/24"))
    folder.write("peering", HOST_PEERING)  # does not count: node-b sees node-a's address
    code, doc = run(capsys, folder, "node", "10.250.0.9:30080")
    assert (code, doc["verdict"]) == (1, "denied")
    assert doc["destination"]["kind"] == "NodePort"
    assert doc["destination"]["description"].startswith("NodePort on node-b of service default/web")
    assert doc["source"]["network"] == "underlay"
    assert doc["source"]["reason"] == (
        f"underlay: node-b sees this node's address {NODE_IP}; an external network, by "
        "longest-prefix match over 10.250.0.0/24"
    )
    assert "from underlay to default" in doc["reason"]
    assert doc["kernel"]["detail"] == "--no-kernel"
    folder.write("grant", service_routing("underlay-web", "underlay", "default", {"app": "web"}))
    code, doc = run(capsys, folder, "node", "10.250.0.9:30080")
    assert (code, doc["verdict"]) == (0, "allowed")
    assert doc["allowedBy"] == [{"kind": "ServiceRoutingPolicy", "name": "underlay-web"}]


def test_node_to_pods_needs_peering_except_its_own_pod_cidrs(
    capsys: pytest.CaptureFixture[str], folder: Folder
) -> None:
    code, doc = run(capsys, folder, "node", "10.251.2.12:8080")  # another node's pod
    assert code == 1
    assert doc["verdict"] == "denied"
    assert doc["destination"] == {
        "kind": "pod",
        "description": "a pod address in network default",
        "service": None,
        "portName": None,
        "network": "default",
    }
    assert "needs a NetworkRoutingPolicy from host-local to default" in doc["reason"]
    code, doc = run(capsys, folder, "node", "10.251.1.11:8080")  # in Node.spec.podCIDRs
    assert code == 0
    assert doc["reason"] == "the node reaches its own podCIDRs always (kubelet probes)"
    folder.write("peering", HOST_PEERING)
    code, doc = run(capsys, folder, "node", "10.251.2.12:8080")
    assert code == 0
    assert doc["allowedBy"] == [{"kind": "NetworkRoutingPolicy", "name": "host-to-default"}]
    # Peering covers the peered network only.
    code, doc = run(capsys, folder, "node", "10.254.0.7:8080")
    assert (code, doc["verdict"]) == (1, "denied")
    assert "from host-local to blue" in doc["reason"]


def test_node_reaches_a_peered_prefix_inside_an_unpeered_one(
    capsys: pytest.CaptureFixture[str], folder: Folder
) -> None:
    """The longer prefix classifies the address, so peering it is enough."""
    folder.write("networks", *NETWORKS, l3("lab", "10.251.5.0/24"))
    folder.write("peering", routing("host-to-lab", "host-local", "lab"))
    code, doc = run(capsys, folder, "node", "10.251.5.7:8080")
    assert doc["destination"]["network"] == "lab"
    assert (code, doc["verdict"]) == (0, "allowed"), doc
    assert "host-to-lab" in doc["reason"]
    code, doc = run(capsys, folder, "node", "10.251.6.7:8080")  # default's, outside lab
    assert (code, doc["verdict"]) == (1, "denied")


def test_external_traffic_policy_local_without_local_endpoints_drops_outside_clients_only(
    capsys: pytest.CaptureFixture[str], folder: Folder
) -> None:
    """The node and pods in the clusterCIDR are short-circuited to the other nodes' endpoints."""
    lb = service(
        "lb",
        "10.96.0.50",
        type="LoadBalancer",
        externalTrafficPolicy="Local",
        status={"loadBalancer": {"ingress": [{"ip": "10.252.0.20"}]}},
    )
    folder.write("networks")
    folder.write("lb", lb, endpoints("lb", "10.251.2.12", node="node-b"))
    cidr = ("--cluster-cidr", "10.251.0.0/16")
    code, doc = run(capsys, folder, "node", "10.252.0.20:80", *cidr)
    assert (code, doc["verdict"]) == (0, "allowed")
    assert doc["destination"]["kind"] == "LoadBalancer"
    code, doc = run(capsys, folder, "10.251.1.11", "10.252.0.20:80", *cidr)
    assert (code, doc["verdict"]) == (0, "allowed")
    assert [(b["ip"], b["local"]) for b in doc["backends"]] == [("10.251.2.12", False)]
    code, doc = run(capsys, folder, "10.250.0.2", "10.252.0.20:80", *cidr)
    assert (code, doc["verdict"]) == (1, "dropped")


# -- bindings, conditions, rejections -----------------------------------------------------------


def test_host_network_service_is_bound_to_none_and_lists_excluded_endpoints(
    capsys: pytest.CaptureFixture[str], folder: Folder
) -> None:
    folder.write(
        "metrics",
        service("lace-node-metrics", "10.96.0.41"),
        endpoints("lace-node-metrics", NODE_IP, "10.250.0.3"),
    )
    code, doc = run(capsys, folder, "10.251.1.11", "10.96.0.41:80")
    assert code == 1
    assert doc["binding"]["network"] is None
    assert doc["binding"]["reason"].startswith("none: its endpoints lie in no network")
    assert doc["excluded"] == [
        {"address": NODE_IP, "reason": "in no network; bind the service to one"},
        {"address": "10.250.0.3", "reason": "in no network; bind the service to one"},
    ]
    assert "bound to no network" in doc["reason"]
    out = text(capsys, folder, "10.251.1.11", "10.96.0.41:80")[1]
    assert f"excluded     {NODE_IP}: in no network; bind the service to one" in out
    # Bound to internet it is internet's, and its endpoints are the node addresses.
    folder.write("internet", INTERNET)
    binding = service_binding("node-metrics", "internet", {"name": "lace-node-metrics"})
    folder.write("binding", binding)
    code, doc = run(capsys, folder, "192.0.2.9", "10.96.0.41:80")
    assert code == 0
    assert doc["binding"] == {
        "network": "internet",
        "boundBy": "node-metrics",
        "reason": "internet: bound by NetworkBindingPolicy node-metrics",
    }
    assert {b["ip"] for b in doc["backends"]} == {NODE_IP, "10.250.0.3"}


def test_a_binding_to_an_unknown_network_shows_the_condition(
    capsys: pytest.CaptureFixture[str], folder: Folder
) -> None:
    folder.write("binding", service_binding("web-nowhere", "nowhere", {"name": "web"}))
    code, doc = run(capsys, folder, "10.251.3.3", f"{WEB_VIP}:80")
    assert code == 0  # the rule is ignored: still bound to its endpoints' network
    assert doc["conditions"] == [
        {
            "code": "unknown_network",
            "subject": "NetworkBindingPolicy/web-nowhere",
            "message": "rule 0 binds to network 'nowhere', which does not exist: the rule "
            "is ignored until it does",
        }
    ]
    # A condition that has nothing to do with this service is left out.
    folder.write("binding", service_binding("db-nowhere", "nowhere", {"name": "db"}))
    assert run(capsys, folder, "10.251.3.3", f"{WEB_VIP}:80")[1]["conditions"] == []


def test_objects_rejected_while_loading_are_listed(
    capsys: pytest.CaptureFixture[str], folder: Folder
) -> None:
    broken = routing("broken", "blue", "default")
    del broken["spec"]["srcSelector"]
    folder.write("broken", broken)
    code, doc = run(capsys, folder, "10.254.0.7", f"{WEB_VIP}:80")
    assert code == 1  # the policy that would have peered blue never took effect
    (rejected,) = doc["rejected"]
    assert "NetworkRoutingPolicy broken: spec.srcSelector" in rejected


def test_without_network_objects_it_is_plain_kube_proxy(
    capsys: pytest.CaptureFixture[str], folder: Folder
) -> None:
    folder.write("networks")
    code, out = text(capsys, folder, "192.0.2.9", f"{WEB_VIP}:80")
    assert code == 0
    lines = dict(line.split(None, 1) for line in out.splitlines() if not line.startswith(" "))
    assert lines["verdict"] == "allowed"
    assert lines["why"] == "no Network objects: every source reaches every frontend"
    assert lines["destination"] == "ClusterIP of service default/web port http (80/TCP)"
    assert "10.251.1.11:8080 (ready,serving,local)" in lines["backends"]
    assert "bound to" not in out
    # Even the node's own NodePort answers, as with kube-proxy.
    assert run(capsys, folder, "node", f"{NODE_IP}:30080")[0] == 0


# -- output and input ---------------------------------------------------------------------------


def test_json_document_shape(capsys: pytest.CaptureFixture[str], folder: Folder) -> None:
    code, doc = run(capsys, folder, "10.251.3.3", f"{WEB_VIP}:80/tcp")
    assert code == doc["exitCode"] == 0
    assert list(doc) == [
        "query",
        "networkModel",
        "source",
        "destination",
        "binding",
        "verdict",
        "allowed",
        "reason",
        "allowedBy",
        "backends",
        "noBackends",
        "excluded",
        "conditions",
        "rejected",
        "notes",
        "kernel",
        "exitCode",
    ]
    assert doc["query"] == {
        "source": "10.251.3.3",
        "destination": WEB_VIP,
        "port": 80,
        "protocol": "TCP",
    }
    assert doc["networkModel"] is True and doc["allowed"] is True
    assert doc["kernel"] == {"status": "not checked", "detail": "--no-kernel"}
    assert set(doc["backends"][0]) == {"ip", "port", "ready", "serving", "terminating", "local"}


def test_text_output_aligns_labels(capsys: pytest.CaptureFixture[str], folder: Folder) -> None:
    code, out = text(capsys, folder, "10.254.0.7", f"{WEB_VIP}:80")
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == f"connection   10.254.0.7 -> {WEB_VIP}:80/TCP"
    assert "verdict      denied" in lines
    assert lines[-1] == "kernel       not checked: --no-kernel"
    # Every value starts in one column, after the longest label ("destination") and two spaces.
    assert all(line[11:13] == "  " and line[13] != " " for line in lines), out


@pytest.mark.parametrize(
    ("src", "dst", "message"),
    [
        ("pod", f"{WEB_VIP}:80", "SRC 'pod' is not an IP address"),
        ("10.0.0.300", f"{WEB_VIP}:80", "is not an IP address"),
        ("node", WEB_VIP, "has no port"),
        ("node", f"{WEB_VIP}:0", "is not in 1-65535"),
        ("node", f"{WEB_VIP}:65536", "is not in 1-65535"),
        ("node", f"{WEB_VIP}:http", "is not in 1-65535"),
        ("node", f"{WEB_VIP}:80/ICMP", "is not TCP, UDP or SCTP"),
        ("node", "fd00::1:80", "[IP]:PORT"),
        ("node", "[fd00::1]80", "[IP]:PORT"),
        ("10.251.0.1", "[fd00::1]:80", "different IP families"),
    ],
)
def test_bad_input_is_exit_code_2_with_a_clear_message(
    capsys: pytest.CaptureFixture[str], folder: Folder, src: str, dst: str, message: str
) -> None:
    assert main(folder.argv(src, dst)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err and captured.err.startswith("lace-proxy: explain: ")


def test_missing_manifests_and_bad_options_are_exit_code_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["explain", "node", f"{WEB_VIP}:80", "--no-kernel"]) == 2
    assert "--manifests" in capsys.readouterr().err
    missing = str(tmp_path / "nowhere")
    assert main(["explain", "node", f"{WEB_VIP}:80", "--manifests", missing]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    argv = ["explain", "node", f"{WEB_VIP}:80", "--manifests", str(tmp_path)]
    assert main([*argv, "--node-address", "nonsense"]) == 2
    assert main([*argv, "--netns", "a b"]) == 2


def test_help_explains_arguments_examples_and_exit_codes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["explain", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for needle in ("SRC", "DST", "[fd00::1]:80/UDP", "--node-address", "--no-kernel", "--netns"):
        assert needle in out, needle
    assert "exit codes:" in out and "2  bad input" in out
    assert "lace-proxy explain node 10.96.0.10:53/UDP" in out


def test_parse_query_accepts_ipv6_in_brackets_and_any_protocol_case() -> None:
    assert parse_query("NODE", "[fd00::0001]:80/udp") == Query("node", "fd00::1", 80, "UDP")
    assert parse_query("[fd00:251::11]", "[fd00::1]:443") == Query(
        "fd00:251::11", "fd00::1", 443, "TCP"
    )
    with pytest.raises(QueryError):
        parse_query("node", "[fd00::1]:80/")
