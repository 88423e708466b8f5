"""The command line: the table view, config errors and missing sources (no root needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lace_proxy.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "lace_proxy" / "demo" / "manifests"


def test_table_json_lists_every_frontend_with_backend_state(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert (
        main(
            [
                "table",
                "--manifests",
                str(EXAMPLES),
                "--hostname-override",
                "sandbox-node",
                "-o",
                "json",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["node"] == "sandbox-node"
    rows = sorted((f["family"], f["kind"], f["frontend"]) for f in doc["frontends"])
    assert rows == [
        ("IPv4", "ClusterIP", "10.96.0.10:80/TCP"),
        ("IPv4", "NodePort", "*:30080/TCP"),
        ("IPv6", "ClusterIP", "[fd00:96::10]:80/TCP"),
        ("IPv6", "NodePort", "*:30080/TCP"),
    ]
    frontends = {(f["family"], f["kind"]): f for f in doc["frontends"]}
    cluster = frontends[("IPv4", "ClusterIP")]
    assert cluster["action"] == "forward"
    assert [(b["ip"], b["port"], b["ready"], b["local"]) for b in cluster["backends"]] == [
        ("10.251.0.11", 8000, True, True),
        ("10.251.0.12", 8000, True, True),
        ("10.251.0.13", 8000, True, True),
    ]


def test_table_text_marks_remote_endpoints(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["table", "--manifests", str(EXAMPLES), "--hostname-override", "elsewhere"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == [
        "SERVICE",
        "PORT",
        "KIND",
        "FRONTEND",
        "ACTION",
        "BACKENDS",
    ]
    assert "10.251.0.11:8000 (ready,remote)" in out


def test_unknown_config_field_is_an_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
        "nftables:\n  syncPeriodd: 30s\n"
    )
    assert main(["table", "--config", str(config), "--manifests", str(EXAMPLES)]) == 2
    assert "nftables.syncPeriodd" in capsys.readouterr().err


def test_bad_flag_value_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["table", "--manifests", str(EXAMPLES), "--sync-period", "soon"]) == 2
    assert "--sync-period" in capsys.readouterr().err


def test_run_without_a_reachable_source_says_what_is_wrong(tmp_path: Path) -> None:
    # No --manifests and no in-cluster environment: the API client cannot be configured.
    with pytest.raises(SystemExit, match="cannot configure the API client"):
        main(["run", "--kubeconfig", str(tmp_path / "missing")])
    with pytest.raises(SystemExit, match="no such file or folder"):
        main(["run", "--manifests", "/nonexistent/lace"])


def test_run_takes_the_kubeconfig_from_client_connection(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    missing = tmp_path / "kubeconfig.conf"
    config.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
        f"clientConnection:\n  kubeconfig: {missing}\n"
    )
    with pytest.raises(SystemExit, match=str(missing)):
        main(["run", "--config", str(config)])


def test_table_shows_networks_and_excluded_endpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for source in EXAMPLES.glob("*.yaml"):
        (tmp_path / source.name).write_text(source.read_text())
    (tmp_path / "networks.yaml").write_text(
        "apiVersion: lace-cni.io/v1alpha1\nkind: Network\nmetadata: {name: default}\n"
        "spec: {type: l3, ipv4Subnet: {prefix: 10.251.0.0/24}}\n"
    )
    args = ["table", "--manifests", str(tmp_path), "--hostname-override", "sandbox-node"]
    assert main([*args, "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {f["network"] for f in doc["frontends"]} == {"default"}
    assert [e["address"] for e in doc["excluded"]["default/web"]] == [
        "fd00:251::11",
        "fd00:251::12",
        "fd00:251::13",
    ]
    v6 = [f for f in doc["frontends"] if f["family"] == "IPv6"]
    assert {f["action"] for f in v6} == {"reject"}  # no IPv6 prefix in the network
    assert {tuple(f["reachableFrom"]) for f in doc["frontends"]} == {("default",)}
    assert main(args) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert header[:3] == ["NETWORK", "FROM", "SERVICE"]


def test_sandbox_serves_the_packaged_examples_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import lace_proxy.demo
    import lace_proxy.demo.sandbox

    served: list[tuple[Path, list[str]]] = []

    def fake_demo(manifests: Path, keep: bool, requests: int) -> int:
        served.append((manifests, sorted(p.name for p in manifests.iterdir())))
        return 0

    monkeypatch.setattr(lace_proxy.demo.sandbox, "run_demo", fake_demo)
    assert main(["sandbox"]) == 0
    # The package's own folder (site-packages when installed), not one beside the checkout.
    package = Path(lace_proxy.demo.__file__).parent
    assert served == [(package / "manifests", ["node.yaml", "web.yaml"])]
    assert main(["sandbox", "--manifests", str(tmp_path)]) == 0
    assert served[1] == (tmp_path, [])
    with pytest.raises(SystemExit, match="no such file or folder"):
        main(["sandbox", "--manifests", str(tmp_path / "missing")])
