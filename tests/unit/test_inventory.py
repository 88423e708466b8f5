"""`lace-proxy services` and `endpoints` computed from a manifest folder: what each endpoint
serves, and the reason given for every one that serves nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from lace_proxy.cli import main

NODE = "node-a"


def _service(name: str, ip: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": spec.pop("namespace", "shop")},
        "spec": {
            "clusterIP": ip,
            "clusterIPs": [ip],
            "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}],
            **spec,
        },
    }


def _slice(service: str, endpoints: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": more.pop("name", f"{service}-1"),
            "namespace": more.pop("namespace", "shop"),
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": more.pop("addressType", "IPv4"),
        "ports": more.pop("ports", [{"name": "http", "protocol": "TCP", "port": 8080}]),
        "endpoints": endpoints,
    }


def _ep(ip: str, node: str = NODE, **conditions: Any) -> dict[str, Any]:
    hints = conditions.pop("hints", None)
    ep: dict[str, Any] = {"addresses": [ip], "nodeName": node, "conditions": conditions}
    if hints:
        ep["hints"] = hints
    return ep


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    docs = [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE, "labels": {"topology.kubernetes.io/zone": "z1"}},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.250.0.1"}]},
        },
        # cart: one ready, one not ready, one terminating (ready ones exist), one hinted
        # for a zone... (hints only count when all ready endpoints carry them: see `zoned`).
        _service("cart", "10.96.0.1"),
        _slice(
            "cart",
            [
                _ep("10.251.0.1"),
                _ep("10.251.0.2", ready=False, serving=False),
                _ep("10.251.0.3", ready=False, serving=True, terminating=True),
            ],
        ),
        # local: internalTrafficPolicy Local; one endpoint here, one elsewhere.
        _service("local", "10.96.0.2", internalTrafficPolicy="Local"),
        _slice("local", [_ep("10.251.0.4"), _ep("10.251.1.4", node="node-b")]),
        # zoned: every ready endpoint hinted, one for our zone z1.
        _service("zoned", "10.96.0.3"),
        _slice(
            "zoned",
            [
                _ep("10.251.0.5", hints={"forZones": [{"name": "z1"}]}),
                _ep("10.251.1.5", node="node-b", hints={"forZones": [{"name": "z2"}]}),
            ],
        ),
        # a headless service and a slice port the service does not have.
        _service("db", "None"),
        _slice("db", [_ep("10.251.0.6")]),
        _service("web", "10.96.0.4", type="NodePort", namespace="front"),
        _slice(
            "web",
            [_ep("10.251.0.7")],
            namespace="front",
            ports=[{"name": "metrics", "protocol": "TCP", "port": 9090}],
        ),
    ]
    docs[-2]["spec"]["ports"][0]["nodePort"] = 30080
    (tmp_path / "all.yaml").write_text(yaml.safe_dump_all(docs))
    return tmp_path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    assert main(list(argv)) == 0
    out = capsys.readouterr().out
    return json.loads(out) if "json" in argv else out


def _endpoints(capsys: pytest.CaptureFixture[str], manifests: Path) -> dict[str, Any]:
    doc = _run(
        capsys,
        "endpoints",
        "--manifests",
        str(manifests),
        "--hostname-override",
        NODE,
        "-o",
        "json",
    )
    assert doc["node"] == NODE
    return {e["endpoint"].split(":")[0]: e for e in doc["endpoints"]}


def test_every_endpoint_says_what_uses_it_or_why_nothing_does(
    capsys: pytest.CaptureFixture[str], manifests: Path
) -> None:
    eps = _endpoints(capsys, manifests)
    assert {ip: (e["usedBy"], e["excluded"]) for ip, e in eps.items()} == {
        "10.251.0.1": (["cluster"], None),
        "10.251.0.2": ([], "not ready"),
        "10.251.0.3": ([], "terminating: ready endpoints are used first"),
        "10.251.0.4": (["cluster"], None),
        "10.251.1.4": ([], "on node node-b: the traffic policy is Local"),
        "10.251.0.5": (["cluster"], None),
        "10.251.1.5": ([], "topology hints for zones z2; this node is in z1"),
        "10.251.0.6": ([], "headless service: no ClusterIP"),
        "10.251.0.7": ([], "the service has no port metrics/TCP"),
    }
    assert eps["10.251.0.3"]["state"] == "terminating"
    assert eps["10.251.0.2"]["state"] == "not-ready"
    assert (eps["10.251.1.4"]["node"], eps["10.251.1.4"]["local"]) == ("node-b", False)


def test_services_show_frontends_backends_and_why_a_service_is_skipped(
    capsys: pytest.CaptureFixture[str], manifests: Path
) -> None:
    args = ("services", "--manifests", str(manifests), "--hostname-override", NODE)
    doc = _run(capsys, *args, "-o", "json")
    by_name = {s["name"]: s for s in doc["services"]}
    cart = by_name["cart"]
    assert [(f["kind"], f["frontend"], f["action"]) for f in cart["frontends"]] == [
        ("ClusterIP", "10.96.0.1:80/TCP", "forward")
    ]
    assert cart["frontends"][0]["backends"] == [
        {"endpoint": "10.251.0.1:8080", "state": "ready", "local": True}
    ]
    assert by_name["db"]["skipped"] == "headless service: no ClusterIP"
    web = by_name["web"]
    assert [(f["kind"], f["action"]) for f in web["frontends"]] == [
        ("ClusterIP", "reject"),
        ("NodePort", "reject"),
    ]
    # Filters: by namespace, and by NAME or NAMESPACE/NAME.
    only = _run(capsys, *args, "-n", "front", "-o", "json")
    assert [s["name"] for s in only["services"]] == ["web"]
    named = _run(capsys, *args, "shop/local", "zoned", "-o", "json")
    assert [s["name"] for s in named["services"]] == ["local", "zoned"]
    text = _run(capsys, *args, "cart", "web")
    lines = text.splitlines()
    assert lines[0].split() == ["NAMESPACE", "NAME", "TYPE", "NETWORK", "FRONTENDS", "BACKENDS"]
    assert lines[1].split()[:2] == ["front", "web"]
    assert lines[1].endswith(" none (reject)")
    assert lines[2].split()[:2] == ["shop", "cart"]
    assert lines[2].endswith(" 10.251.0.1:8080(ready)")
    as_yaml = yaml.safe_load(_run(capsys, *args, "cart", "-o", "yaml"))
    assert as_yaml["services"][0]["clusterIPs"] == ["10.96.0.1"]


def test_endpoints_outside_the_bound_network_say_so(
    capsys: pytest.CaptureFixture[str], manifests: Path
) -> None:
    (manifests / "networks.yaml").write_text(
        "apiVersion: lace-cni.io/v1alpha1\nkind: Network\nmetadata: {name: blue}\n"
        "spec: {type: l3, ipv4Subnet: {prefix: 10.251.0.0/24}}\n"
    )
    eps = _endpoints(capsys, manifests)
    # node-b's endpoints (10.251.1.x) lie in no network: the service is bound to blue.
    assert eps["10.251.1.4"]["network"] == "blue"
    assert eps["10.251.1.4"]["usedBy"] == []
    assert "blue" in eps["10.251.1.4"]["excluded"]
    assert eps["10.251.0.1"]["usedBy"] == ["cluster"]


def test_without_a_running_proxy_the_error_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    socket_path = tmp_path / "state.sock"
    assert main(["services", "--state-socket", str(socket_path)]) == 2
    err = capsys.readouterr().err
    assert str(socket_path) in err
    assert "--kubeconfig" in err


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completion_offers_the_commands_and_their_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["completion", "bash"]) == 0
    script = tmp_path / "lace-proxy.bash"
    script.write_text(capsys.readouterr().out)

    def complete(*words: str) -> list[str]:
        line = " ".join(words)
        probe = (
            f"source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; "
            f'COMP_LINE="{line}"; COMP_POINT=${{#COMP_LINE}}; _shtab_lace_proxy; '
            'printf "%s\\n" "${COMPREPLY[@]}"'
        )
        run = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True)
        return run.stdout.split()

    assert {"services", "endpoints", "cleanup"} <= set(complete("lace-proxy", "''"))
    assert "--namespace" in complete("lace-proxy", "endpoints", "--na")
