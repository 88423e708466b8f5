"""`--help`, `version` and shell completion start fast: building the parser imports none of
the modules the proxy is made of (they take most of a second); the handlers import them. A
proxy on a manifest folder without BGP loads neither the Kubernetes client nor the speaker
(a third of the rest: 20 s of the IPVS VM's start under emulation)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = (
    "kubernetes",
    "aiohttp",
    "pyroute2",
    "prometheus_client",
    "uvloop",
    "lace_proxy.app",
    "lace_proxy.proxier",
    "lace_proxy.sources",
    "lace_proxy.health",
    "lace_proxy.metrics",
)


def loaded_after(statements: str, heavy: tuple[str, ...]) -> list[str]:
    """The modules of `heavy` (or under them) a fresh interpreter holds after `statements`:
    this one has imported everything already."""
    probe = f"import json, sys\n{statements}\nprint(json.dumps(sorted(sys.modules)))\n"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    loaded = json.loads(done.stdout)
    return [m for m in loaded if any(m == h or m.startswith(f"{h}.") for h in heavy)]


def test_building_the_parser_imports_nothing_heavy() -> None:
    assert loaded_after("from lace_proxy.cli import build_parser; build_parser()", HEAVY) == []


def test_the_composition_root_leaves_the_api_client_and_bgp_to_who_chooses_them() -> None:
    optional = ("kubernetes", "lace_proxy.sources.kube", "lace_proxy.bgp.speaker")
    assert loaded_after("import lace_proxy.app", optional) == []
    # The API source, chosen, brings the client: the names above are the ones it loads.
    chosen = loaded_after("import lace_proxy.app, lace_proxy.sources.kube", optional)
    assert {"kubernetes", "lace_proxy.sources.kube"} <= set(chosen)
