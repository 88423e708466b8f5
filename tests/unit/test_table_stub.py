"""The compiled table's stub (`lace_proxy/table/_ctable.pyi`) is held to both twins.

mypy's stubtest checks it against the compiled module (every public name, signature and
property); the pure twin is held to it here by names and parameter names. mypy, in the lint
step, holds both twins to the `Plan`/`Backend` contract (`lace_proxy/table/changeset.py`).
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from lace_proxy.table import _pytable, changeset

STUB = Path(_pytable.__file__).with_name("_ctable.pyi")
ROOT = Path(__file__).resolve().parents[2]

#: What Cython adds to every module and extension type: pickling support, doctest's table.
STUBTEST_ALLOWLIST = """
lace_proxy\\.table\\._ctable\\.(\\w+\\.)?__reduce_cython__
lace_proxy\\.table\\._ctable\\.(\\w+\\.)?__setstate_cython__
lace_proxy\\.table\\._ctable\\.__test__
"""


def _stub_classes() -> dict[str, dict[str, list[str] | None]]:
    """Each class of the stub: its public members, with a method's parameter names (None for
    a property or an attribute)."""
    classes: dict[str, dict[str, list[str] | None]] = {}
    for node in ast.parse(STUB.read_text()).body:
        if not isinstance(node, ast.ClassDef):
            continue
        members: dict[str, list[str] | None] = {}
        for item in node.body:
            if isinstance(item, ast.FunctionDef):
                is_property = any(
                    isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list
                )
                params = [a.arg for a in (*item.args.posonlyargs, *item.args.args)]
                members[item.name] = None if is_property else params
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                members[item.target.id] = None
        classes[node.name] = members
    return classes


def _public(members: dict[str, list[str] | None]) -> dict[str, list[str] | None]:
    return {k: v for k, v in members.items() if not k.startswith("_")}


def test_stub_matches_the_compiled_module(tmp_path: Path) -> None:
    if importlib.util.find_spec("lace_proxy.table._ctable") is None:
        pytest.skip("compiled table not built in this environment")
    allowlist = tmp_path / "allowlist.txt"
    allowlist.write_text(STUBTEST_ALLOWLIST)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy.stubtest",
            "--mypy-config-file",
            str(ROOT / "pyproject.toml"),
            "--allowlist",
            str(allowlist),
            # Which Cython helpers a build adds depends on the Cython that built it.
            "--ignore-unused-allowlist",
            "lace_proxy.table._ctable",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # no mypy cache in the tree
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_stub_names_what_the_pure_twin_has() -> None:
    stub = _stub_classes()
    assert set(stub) == {"Backend", "Plan", "ServiceTable"}
    tree = ast.parse(STUB.read_text())
    assert "IMPLEMENTATION" in {
        n.target.id
        for n in tree.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    for name, members in stub.items():
        cls = getattr(_pytable, name)
        runtime = {k for k in vars(cls) if not k.startswith("_")}
        assert set(_public(members)) == runtime, name
        for member, params in _public(members).items():
            if params is not None:
                signature = inspect.signature(getattr(cls, member))
                assert list(signature.parameters) == params, f"{name}.{member}"
    # The constructors both twins share (Plan is built by the tables only).
    for name in ("Backend", "ServiceTable"):
        params = stub[name]["__init__"]
        assert params is not None
        assert ["self", *inspect.signature(getattr(_pytable, name)).parameters] == params, name


@pytest.mark.parametrize(
    ("name", "protocol"), [("Plan", changeset.Plan), ("Backend", changeset.Backend)]
)
def test_contract_is_what_the_stub_declares(name: str, protocol: type) -> None:
    """The Protocols the dataplane is typed against name every member the twins share."""
    members = {k for k in vars(protocol) if not k.startswith("_")}
    assert members == set(_public(_stub_classes()[name]))
