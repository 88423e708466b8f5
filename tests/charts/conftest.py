"""Rendering and linting the charts with Helm's own engine (helm-python-sdk), in process.

`Chart.render` validates the values against the chart's values.schema.json before it renders
(a refused value raises HelmValuesError; a template's `fail` raises HelmRenderError), so a
rendered manifest is always one Helm would install.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import pytest
import yaml

from ..crdschema import validator as crd_validator

CHARTS = Path(__file__).resolve().parents[2] / "charts"
PROXY_CHART = CHARTS / "lace-proxy"
NETWORKS_CHART = CHARTS / "lace-networks"

RELEASE = "lace"
NAMESPACE = "kube-system"

#: The lace-networks chart's value sets under test (and the real apiserver's CRD tests).
HOST_LOCAL = {"hostLocalNetwork": {"enabled": True}}
ROUTED = {**HOST_LOCAL, "hostLocalRouting": {"enabled": True}}
ROUTED_TO_OTHER = {
    **HOST_LOCAL,
    "hostLocalRouting": {"enabled": True, "dest": "other"},
    "extraNetworks": [
        {"name": "other", "spec": {"type": "l3", "ipv4Subnet": {"prefix": "10.245.0.0/16"}}}
    ],
}
DUAL_STACK = {"defaultNetwork": {"ipv6Subnet": {"prefix": "fd00:10:244::/56"}}}
IPV6_ONLY = {
    "defaultNetwork": {
        "name": "pods",
        "type": "l2",
        "ipv4Subnet": {"prefix": ""},
        "ipv6Subnet": {"prefix": "fd00:10:244::/56"},
        "labels": {"tier": "pods"},
    },
    "internet": {"enabled": False},
}
EXTRA = {
    "commonLabels": {"team": "net"},
    "extraNetworks": [
        {
            "name": "corp",
            "labels": {"zone": "a"},
            "spec": {"type": "external", "externalPrefixes": ["192.0.2.0/24", "2001:db8::/32"]},
        },
        {"name": "storage", "spec": {"type": "l2", "ipv6Subnet": {"prefix": "fd00:20::/64"}}},
    ],
}

VALUE_SETS = {
    "defaults": {},
    "host-local": HOST_LOCAL,
    "routed": ROUTED,
    "routed-to-other": ROUTED_TO_OTHER,
    "dual-stack": DUAL_STACK,
    "ipv6-only": IPV6_ONLY,
    "extra": EXTRA,
}

#: helm lint severities (0 unknown, 1 info, 2 warning, 3 error).
WARNING = 2


@pytest.fixture(scope="session")
def proxy_chart() -> Iterator[helm_python.Chart]:
    with helm_python.Chart.load(PROXY_CHART) as chart:
        yield chart


@pytest.fixture(scope="session")
def networks_chart() -> Iterator[helm_python.Chart]:
    with helm_python.Chart.load(NETWORKS_CHART) as chart:
        yield chart


def render_text(chart: helm_python.Chart, values: dict[str, Any] | None = None) -> dict[str, str]:
    """{template path: rendered text}, as Helm would install release RELEASE in NAMESPACE."""
    return chart.render(values or {}, name=RELEASE, namespace=NAMESPACE)


def manifests(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """The Kubernetes objects of a render (NOTES.txt and empty documents left out)."""
    objects = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc is not None:
                assert isinstance(doc, dict), f"{path}: not an object: {doc!r}"
                objects.append(doc)
    return objects


def render(chart: helm_python.Chart, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return manifests(render_text(chart, values))


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [obj] = of_kind(objects, kind)
    return obj


def lint_findings(path: Path, values: dict[str, Any] | None = None) -> list[str]:
    """What `helm lint --strict` reports at warning level or above, and its errors."""
    report = helm_python.lint(path, values or {}, strict=True, namespace=NAMESPACE)
    found = [
        f"{m['severity']} {m['path']}: {m['error']}"
        for m in report["messages"]
        if m["severity"] >= WARNING
    ]
    return found + list(report.get("errors") or [])


# --- the Lace CRDs as JSON Schema -----------------------------------------------------------


def _crd_validators() -> dict[tuple[str, str], jsonschema.Draft4Validator]:
    """(apiVersion, kind) -> a validator of that CRD version's openAPIV3Schema."""
    validators = {}
    for path in sorted((NETWORKS_CHART / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text(encoding="utf-8"))
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = version["schema"]["openAPIV3Schema"]
            validators[(f"{group}/{version['name']}", kind)] = crd_validator(schema)
    return validators


CRD_VALIDATORS = _crd_validators()


def crd_errors(obj: dict[str, Any]) -> list[str]:
    """Why the API server would refuse `obj` by its CRD's schema ([]: it accepts it)."""
    validator = CRD_VALIDATORS[(obj["apiVersion"], obj["kind"])]
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)
    ]


def refusal(chart: helm_python.Chart, values: dict[str, Any]) -> str:
    """Why values.schema.json refuses `values`; rendering must refuse them too (nothing is
    ever rendered from refused values)."""
    with pytest.raises(helm_python.HelmValuesError) as info:
        chart.validate_schema(values)
    with pytest.raises(helm_python.HelmValuesError, match="values don't meet the specifications"):
        render_text(chart, values)
    return str(info.value)
