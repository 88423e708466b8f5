"""`lace-proxy services`/`endpoints --kubeconfig`: the state computed from the real apiserver,
and a clear error when the API does not answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lace_proxy.cli import main
from testkit.controlplane.cluster import ControlPlane, free_port

from ..kubekit import Rest, endpoint_slice, service


def test_services_computed_from_the_api(
    control_plane: ControlPlane, admin: Rest, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.create(service("web", namespace))
    admin.create(endpoint_slice("web-1", namespace, "web", "10.0.0.1"))
    admin.create(service("db", namespace))  # no endpoints
    kubeconfig = str(control_plane.admin_kubeconfig)
    argv = ["services", "--kubeconfig", kubeconfig, "--hostname-override", "n1", "-o", "json"]
    assert main([*argv, "-n", namespace]) == 0
    doc = json.loads(capsys.readouterr().out)
    by_name = {s["name"]: s for s in doc["services"]}
    assert set(by_name) == {"web", "db"}
    [frontend] = by_name["web"]["frontends"]
    _status, web = admin.call("GET", f"/api/v1/namespaces/{namespace}/services/web")
    assert frontend["frontend"] == f"{web['spec']['clusterIP']}:80/TCP"  # the server's choice
    assert frontend["backends"] == [{"endpoint": "10.0.0.1:8080", "state": "ready", "local": False}]
    assert [f["action"] for f in by_name["db"]["frontends"]] == ["reject"]
    argv = ["endpoints", "--kubeconfig", kubeconfig, f"{namespace}/web", "-o", "json"]
    assert main(argv) == 0
    [ep] = json.loads(capsys.readouterr().out)["endpoints"]
    assert (ep["endpoint"], ep["usedBy"], ep["excluded"]) == ("10.0.0.1:8080", ["cluster"], None)


def test_an_unreachable_api_is_a_clear_error(
    control_plane: ControlPlane, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The admin's kubeconfig, dialling a port nothing listens on: refused, at once."""
    nowhere = control_plane.write_admin_kubeconfig(
        tmp_path / "nowhere.kubeconfig", server=f"https://127.0.0.1:{free_port()}"
    )
    argv = ["services", "--kubeconfig", str(nowhere), "--timeout", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "no complete list" in err and "within 1 s" in err
