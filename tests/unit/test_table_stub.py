"""The compiled table's stub (`lace_proxy/table/_ctable.pyi`) is held to both twins, and so
are the compiled nf_tables and IPVS codecs' (`lace_proxy/dataplane/nftables/_ccodec.pyi`,
`lace_proxy/dataplane/ipvs/_ccodec.pyi`), and the endpoint parse's (`lace_proxy/model/_cplain.pyi`).

mypy's stubtest checks each against its compiled module (every public name, signature and
property); the pure twin is held to it here by names and parameter names. mypy, in the lint
step, holds both table twins to the `Plan`/`Backend` contract
(`lace_proxy/table/changeset.py`).
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from lace_proxy.dataplane.ipvs import _pycodec as _pyipvscodec
from lace_proxy.dataplane.nftables import _pycodec
from lace_proxy.model import _pyplain
from lace_proxy.table import _pytable, changeset

STUB = Path(_pytable.__file__).with_name("_ctable.pyi")
CODEC_STUB = Path(_pycodec.__file__).with_name("_ccodec.pyi")
IPVS_CODEC_STUB = Path(_pyipvscodec.__file__).with_name("_ccodec.pyi")
ROOT = Path(__file__).resolve().parents[2]

#: What Cython adds to every module and extension type: pickling support, doctest's table.
STUBTEST_ALLOWLIST = """
{module}\\.(\\w+\\.)?__reduce_cython__
{module}\\.(\\w+\\.)?__setstate_cython__
{module}\\.__test__
"""


def _stub_classes(stub: Path = STUB) -> dict[str, dict[str, list[str] | None]]:
    """Each class of the stub: its public members, with a method's parameter names (None for
    a property or an attribute)."""
    classes: dict[str, dict[str, list[str] | None]] = {}
    for node in ast.parse(stub.read_text()).body:
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


@pytest.mark.parametrize(
    "module",
    [
        "lace_proxy.table._ctable",
        "lace_proxy.dataplane.nftables._ccodec",
        "lace_proxy.dataplane.ipvs._ccodec",
        "lace_proxy.model._cplain",
    ],
)
def test_stub_matches_the_compiled_module(tmp_path: Path, module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} not built in this environment")
    allowlist = tmp_path / "allowlist.txt"
    allowlist.write_text(STUBTEST_ALLOWLIST.format(module=module.replace(".", "\\.")))
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
            module,
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


def _module_names(module: ModuleType) -> set[str]:
    """A module's own public names (not what it imports)."""
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, ModuleType)
        and getattr(value, "__module__", module.__name__) == module.__name__
    }


@pytest.mark.parametrize(
    ("stub", "twin", "instances"),
    [
        pytest.param(
            CODEC_STUB,
            _pycodec,
            lambda: {
                "Batch": _pycodec.Batch("t", 1),
                "DumpParser": _pycodec.DumpParser((0,), (), False),
            },
            id="nftables",
        ),
        pytest.param(
            IPVS_CODEC_STUB,
            _pyipvscodec,
            lambda: {
                "Requests": _pyipvscodec.Requests(0x10, 1),
                "ServerDump": _pyipvscodec.ServerDump(4),
                "ServiceDump": _pyipvscodec.ServiceDump(),
            },
            id="ipvs",
        ),
    ],
)
def test_codec_stub_names_what_the_pure_twin_has(
    stub: Path, twin: ModuleType, instances: Callable[[], dict[str, object]]
) -> None:
    """A codec's stub names the pure twin's public names, its functions' and methods'
    parameters, and its classes: CodecError and one per instance given."""
    tree = ast.parse(stub.read_text())
    names = {
        n.target.id
        for n in tree.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    } | {n.name for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef)}
    assert names == _module_names(twin)
    for function in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        signature = inspect.signature(getattr(twin, function.name))
        assert list(signature.parameters) == [a.arg for a in function.args.args], function.name
    made = instances()
    classes = _stub_classes(stub)
    assert set(classes) == {"CodecError", *made}
    for name, members in classes.items():
        cls = getattr(twin, name)
        public = {k for k in dir(cls) if not k.startswith("_")} - set(dir(ValueError))
        callables = {k for k in public if callable(getattr(cls, k))}
        methods = {k for k, v in members.items() if v is not None}
        assert callables == {k for k in methods if not k.startswith("_")}, name
        assert public - callables <= set(members) - methods, name  # attributes, properties
        for member, params in members.items():
            if params is None:  # an attribute: the pure twin sets it on each instance
                assert hasattr(made[name], member), f"{name}.{member}"
            else:
                signature = inspect.signature(getattr(cls, member))
                assert list(signature.parameters) == params, f"{name}.{member}"


def test_endpoint_parse_stub_names_what_the_pure_twin_has() -> None:
    tree = ast.parse(Path(_pyplain.__file__).with_name("_cplain.pyi").read_text())
    names = {
        n.target.id
        for n in tree.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    } | {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert names == _module_names(_pyplain) == {"IMPLEMENTATION", "plain_endpoint"}
    (function,) = (n for n in tree.body if isinstance(n, ast.FunctionDef))
    parameters = inspect.signature(_pyplain.plain_endpoint).parameters
    assert list(parameters) == [a.arg for a in function.args.args]
