"""The package as `pip install .` makes it, away from the checkout: the wheel holds the package
and its data (the sandbox's example manifests) and nothing from tests/, and installed in a
fresh venv it finds and loads those manifests from any directory (`lace-proxy sandbox`'s
default)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "lace_proxy" / "demo" / "manifests"
# What a clean checkout does not have: environments, caches and build output.
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", ".tox", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "*.so", "*.c"
)

pytestmark = pytest.mark.wheel


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One wheel per session, built by pip (isolated build: setuptools and Cython from the
    index) from a copy of the checkout, so the build's output stays out of the shared tree."""
    source = tmp_path_factory.mktemp("source") / "lace-proxy"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    out = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)]
    subprocess.run(pip, check=True)
    (built,) = out.glob("lace_proxy-*.whl")
    return built


@pytest.fixture(scope="session")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel and no other lace_proxy. The dependencies are this test
    environment's, on a .pth line after the venv's own site-packages: no index needed."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    python = str(root / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "--no-deps", "-q", str(wheel)], check=True)
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = subprocess.run([python, "-c", where], capture_output=True, text=True, check=True)
    ours = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    (Path(site.stdout.strip()) / "test-dependencies.pth").write_text("\n".join(ours) + "\n")
    return root.resolve()


def outside(argv: list[str], cwd: Path) -> str:
    """Run from a directory outside the checkout, with nothing pointing Python at it."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_wheel_holds_the_package_and_its_manifests_and_no_tests(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        prefix = "lace_proxy/demo/manifests/"
        shipped = {n.removeprefix(prefix): whl.read(n) for n in names if n.startswith(prefix)}
        sources = {n: whl.read(n).decode() for n in names if n.endswith(".py")}
    assert not [n for n in names if n.startswith("tests/")]
    assert {n.split("/")[0] for n in names if ".dist-info/" not in n} == {"lace_proxy"}
    assert shipped == {p.name: p.read_bytes() for p in EXAMPLES.iterdir()}
    # Nothing shipped leans on test support (testkit/, tests/), which is not installed.
    leaning = re.compile(r"^\s*(from|import)\s+(testkit|tests)\b", re.MULTILINE)
    assert [n for n, text in sources.items() if leaning.search(text)] == []


def test_the_installed_package_finds_and_loads_its_example_manifests(
    venv: Path, tmp_path: Path
) -> None:
    script = textwrap.dedent("""
        import json, lace_proxy
        from lace_proxy.model import load_manifests
        from lace_proxy.demo.sandbox import example_manifests
        with example_manifests() as folder:
            loaded = load_manifests(folder)
            print(json.dumps({"package": lace_proxy.__file__, "folder": str(folder),
                              "services": sorted(loaded.services), "nodes": sorted(loaded.nodes),
                              "rejected": [str(e) for e in loaded.rejected]}))
    """)
    doc = json.loads(outside([str(venv / "bin" / "python"), "-c", script], tmp_path))
    assert Path(doc["package"]).resolve().is_relative_to(venv)
    folder = Path(doc["folder"]).resolve()
    assert folder.is_relative_to(venv) and folder.is_dir()
    assert doc["services"] == ["default/web"] and doc["nodes"] == ["sandbox-node"]
    assert doc["rejected"] == []
    # The installed command serves that folder: the example service's four frontends.
    table = [str(venv / "bin" / "lace-proxy"), "table", "--manifests", str(folder)]
    out = outside([*table, "--hostname-override", "sandbox-node", "-o", "json"], tmp_path)
    frontends = json.loads(out)["frontends"]
    assert sorted((f["family"], f["kind"]) for f in frontends) == [
        ("IPv4", "ClusterIP"),
        ("IPv4", "NodePort"),
        ("IPv6", "ClusterIP"),
        ("IPv6", "NodePort"),
    ]
