"""The Dockerfile matches the repository: what it copies exists and is what the build needs,
the runtime has the tools the proxy runs, and its commands are the package's own."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from lace_proxy import implementation
from lace_proxy.cli import main
from lace_proxy.dataplane.ipvs import codec as ipvs_codec
from lace_proxy.dataplane.nftables import codec
from lace_proxy.model import plain

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _copied() -> list[str]:
    sources = []
    for word, rest in _instructions():
        if word == "COPY" and not rest.startswith("--from"):
            sources += rest.split()[:-1]
    return sources


def test_every_copied_path_exists_and_the_build_has_what_it_reads() -> None:
    copied = _copied()
    for source in copied:
        assert (ROOT / source).exists(), f"Dockerfile copies {source}, which is not in the repo"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["readme"] in copied  # read by the build backend
    assert "setup.py" in copied and "pyproject.toml" in copied
    # setup.py compiles ext/*.pyx into lace_proxy; both folders go in.
    assert {"ext/", "lace_proxy/"} <= set(copied)
    assert "ext/table.pyx" in (ROOT / "setup.py").read_text()


def test_runtime_has_the_tools_the_proxy_and_operators_run() -> None:
    stages = DOCKERFILE.split("\nFROM ")
    assert len(stages) == 3, "a build stage and a runtime stage"
    runtime = re.sub(r"\\\n\s*", " ", stages[2])
    installed = set(re.search(r"apt-get install -y --no-install-recommends ([^&]+)", runtime)
                    .group(1).split())  # fmt: skip
    assert {"nftables", "iproute2", "conntrack", "ipvsadm", "iptables", "ipset"} <= installed


def test_entrypoint_and_checks_are_the_packages_own(capsys: pytest.CaptureFixture[str]) -> None:
    instructions = dict(_instructions())
    entrypoint = json.loads(instructions["ENTRYPOINT"])
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert entrypoint == ["lace-proxy"] and "lace-proxy" in project["project"]["scripts"]
    assert json.loads(instructions["CMD"]) == ["run"]
    # The image refuses to build without the compiled core, in `version`'s own words.
    expected = re.search(r'lace-proxy version \| grep -q "([^"]+)"', DOCKERFILE)
    compiled = (
        "(compiled service table, compiled nftables codec, compiled IPVS codec,"
        " compiled endpoint parse)"
    )
    assert expected is not None and expected.group(1) == compiled
    assert main(["version"]) == 0
    twins = (
        f"({implementation()} service table, {codec.IMPLEMENTATION} nftables codec,"
        f" {ipvs_codec.IMPLEMENTATION} IPVS codec, {plain.IMPLEMENTATION} endpoint parse)"
    )
    assert twins in capsys.readouterr().out
    python = re.search(r"ARG PYTHON_VERSION=(\d+)\.(\d+)", DOCKERFILE)
    assert python is not None
    minimum = re.search(r">=(\d+)\.(\d+)", project["project"]["requires-python"])
    assert minimum is not None
    assert tuple(map(int, python.groups())) >= tuple(map(int, minimum.groups()))
