"""The Grafana dashboard (charts/lace-proxy/dashboards/lace-proxy.json) against the code.

It may only chart series a `ProxyMetrics` exports, every family exported needs a panel, and
every expression must be PromQL that promtool accepts. Series names are matched exactly
against the exposition's sample names (`..._bucket` of a histogram, `..._total` of a
counter, a gauge's own name), so a suffix the family does not export fails too.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from lace_proxy.metrics import ProxyMetrics

from ..helpers import exercise_metrics

DASHBOARD = Path(__file__).parents[2] / "charts/lace-proxy/dashboards/lace-proxy.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
PREFIXES = ("kubeproxy_", "lace_proxy_")
NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# PromQL string literals: their contents (label values, regexes) are not series names.
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
# A series of ours and its label matchers, if any.
SELECTOR = re.compile(r"(?<![\w:])((?:kubeproxy_|lace_proxy_)[\w:]*)\s*(\{[^}]*\})?")
# Grafana variables as a rules file has to spell them.
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
VARIABLE_VALUES = {
    "instance": ".*",
    "node": ".*",
    "__rate_interval": "5m",
    "__interval": "1m",
    "__range": "1h",
}
LABEL_VALUES = re.compile(r"label_values\((.+),\s*\w+\)")


@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    """Each family of the exposition (as its TYPE line names it) -> its sample names."""
    m = ProxyMetrics(mode="nftables")  # the mode with every family (IPVS lacks one)
    exercise_metrics(m)
    families: dict[str, set[str]] = {}
    current: set[str] = set()
    for line in generate_latest(m.registry).decode().splitlines():
        if line.startswith("# TYPE "):
            current = families.setdefault(line.split()[2], set())
        elif line and not line.startswith("#"):
            current.add(NAME.match(line).group())  # type: ignore[union-attr]
    unsampled = sorted(name for name, samples in families.items() if not samples)
    assert not unsampled, f"exercise_metrics() records nothing for {unsampled}: call what sets them"
    return families


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def all_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows included, and those inside collapsed rows."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", ())


def charts(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in all_panels(dashboard) if p["type"] != "row"]


def expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, expr) for each panel target and each query variable's series selector."""
    found = [
        (f"panel {p['id']} {p['title']!r} target {t.get('refId')}", t.get("expr", ""))
        for p in charts(dashboard)
        for t in p.get("targets", ())
    ]
    for variable in variables(dashboard).values():
        if variable["type"] == "query":
            query = variable["query"]
            text = query["query"] if isinstance(query, dict) else query
            match = LABEL_VALUES.fullmatch(text.strip())
            assert match, f"variable {variable['name']}: not label_values(series, label): {text}"
            found.append((f"variable {variable['name']}", match.group(1)))
    return found


def variables(dashboard: dict[str, Any]) -> dict[str, dict[str, Any]]:
    listed = dashboard["templating"]["list"]
    by_name = {v["name"]: v for v in listed}
    assert len(by_name) == len(listed), "template variable names repeat"
    return by_name


def mask_strings(expr: str) -> str:
    """`expr` with the insides of string literals blanked (positions kept)."""
    return STRING.sub(lambda s: s.group()[0] + " " * (len(s.group()) - 2) + s.group()[-1], expr)


def series_names(expr: str) -> set[str]:
    return {n for n in NAME.findall(mask_strings(expr)) if n.startswith(PREFIXES)}


def test_dashboard_settings(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "lace-proxy"
    assert dashboard["title"] == "lace-proxy"
    assert dashboard["schemaVersion"] == 39
    assert dashboard["time"] == {"from": "now-1h", "to": "now"}
    assert dashboard["refresh"] == "30s"
    v = variables(dashboard)
    assert (v["datasource"]["type"], v["datasource"]["query"]) == ("datasource", "prometheus")
    for name in ("instance", "node"):
        assert v[name]["type"] == "query"
        assert v[name]["datasource"] == DATASOURCE
        assert v[name]["includeAll"] and v[name]["allValue"] == ".*"


def test_panels_are_complete(dashboard: dict[str, Any]) -> None:
    ids = [p["id"] for p in all_panels(dashboard)]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {sorted(ids)}"
    occupied: dict[tuple[int, int], str] = {}
    for p in all_panels(dashboard):
        grid = p.get("gridPos", {})
        assert all(isinstance(grid.get(k), int) for k in "hwxy"), f"{p['title']!r}: gridPos"
        assert grid["x"] + grid["w"] <= 24, f"{p['title']!r} is wider than the dashboard"
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                other = occupied.setdefault((x, y), p["title"])
                assert other == p["title"], f"{p['title']!r} overlaps {other!r}"
    panels = charts(dashboard)
    assert panels
    for p in panels:
        where = f"panel {p['id']} {p['title']!r}"
        assert p["type"] in ("timeseries", "stat"), where
        assert p.get("datasource") == DATASOURCE, f"{where}: datasource"
        assert p.get("description", "").strip(), f"{where} has no description"
        targets = p.get("targets", [])
        assert targets, f"{where} has no target"
        assert all(t.get("expr", "").strip() for t in targets), f"{where}: an empty expr"
        assert all(t.get("datasource", DATASOURCE) == DATASOURCE for t in targets), where
        refs = [t["refId"] for t in targets]
        assert len(refs) == len(set(refs)), f"{where}: refIds repeat"


def test_every_series_is_filtered_by_instance(dashboard: dict[str, Any]) -> None:
    unfiltered = []
    for where, expr in expressions(dashboard):
        if not where.startswith("panel"):
            continue
        for match in SELECTOR.finditer(mask_strings(expr)):
            matchers = expr[match.start(2) : match.end(2)] if match.group(2) else ""
            if 'instance=~"$instance"' not in matchers:
                unfiltered.append(f"{where}: {match.group(1)}{matchers}")
    assert not unfiltered, 'without {instance=~"$instance"}:\n' + "\n".join(unfiltered)


def test_only_exported_series_are_charted(
    dashboard: dict[str, Any], exported: dict[str, set[str]]
) -> None:
    samples = set().union(*exported.values())
    unknown = [
        f"{where}: {name}"
        for where, expr in expressions(dashboard)
        for name in sorted(series_names(expr) - samples)
    ]
    assert not unknown, "not in ProxyMetrics' exposition:\n" + "\n".join(unknown)


def test_every_exported_family_has_a_panel(
    dashboard: dict[str, Any], exported: dict[str, set[str]]
) -> None:
    used = set().union(*(series_names(expr) for _, expr in expressions(dashboard)))
    charted = {family for family, samples in exported.items() if samples & used}
    missing = sorted(f for f in exported if f.startswith(PREFIXES) and f not in charted)
    assert not missing, f"exported but on no panel (add one to {DASHBOARD.name}): {missing}"


def promql(expr: str) -> str:
    """`expr` with Grafana's variables replaced as Prometheus would receive them."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in VARIABLE_VALUES, f"unknown Grafana variable ${name} in {expr}"
        return VARIABLE_VALUES[name]

    return VARIABLE.sub(value, expr)


def test_expressions_are_valid_promql(dashboard: dict[str, Any], tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (the prometheus Debian package has it)")
    rules = [
        {"record": f"dashboard:expr_{i}", "expr": promql(expr), "labels": {"where": where}}
        for i, (where, expr) in enumerate(expressions(dashboard))
    ]
    path = tmp_path / "dashboard.rules.yml"
    # JSON is YAML: no YAML library needed.
    path.write_text(json.dumps({"groups": [{"name": "lace-proxy-dashboard", "rules": rules}]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, f"promtool check rules:\n{result.stdout}{result.stderr}"
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout, result.stdout
