"""`lace-proxy services`/`endpoints --kubeconfig`: the state computed from the API (over real
HTTP, against the emulator), and a clear error when the API does not answer."""

from __future__ import annotations

import json

import pytest

from lace_proxy.cli import main
from lace_proxy.sandbox.apiserver import ApiServer

from ..helpers import api_service, api_slice


def test_services_computed_from_the_api(api: ApiServer, capsys: pytest.CaptureFixture[str]) -> None:
    api.apply(api_service("web"))
    api.apply(api_slice("web-1", "web", "10.0.0.1"))
    other = api_service("db")
    other["spec"]["clusterIP"] = "10.96.0.11"
    api.apply(other)
    kubeconfig = str(api.kubeconfig_path)
    assert (
        main(["services", "--kubeconfig", kubeconfig, "--hostname-override", "n1", "-o", "json"])
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    by_name = {s["name"]: s for s in doc["services"]}
    assert set(by_name) == {"web", "db"}
    [frontend] = by_name["web"]["frontends"]
    assert frontend["frontend"] == "10.96.0.10:80/TCP"
    assert frontend["backends"] == [{"endpoint": "10.0.0.1:8080", "state": "ready", "local": False}]
    assert [f["action"] for f in by_name["db"]["frontends"]] == ["reject"]
    assert main(["endpoints", "--kubeconfig", kubeconfig, "web", "-o", "json"]) == 0
    [ep] = json.loads(capsys.readouterr().out)["endpoints"]
    assert (ep["endpoint"], ep["usedBy"], ep["excluded"]) == ("10.0.0.1:8080", ["cluster"], None)


def test_an_unreachable_api_is_a_clear_error(
    api: ApiServer, capsys: pytest.CaptureFixture[str]
) -> None:
    api.unavailable(refuse=True)
    argv = ["services", "--kubeconfig", str(api.kubeconfig_path), "--timeout", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "no complete list" in err and "within 1 s" in err
