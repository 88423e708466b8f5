"""`--help`, `version` and shell completion start fast: building the parser imports none of
the modules the proxy is made of (they take most of a second); the handlers import them."""

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


def test_building_the_parser_imports_nothing_heavy() -> None:
    # A fresh interpreter: this one has imported everything already.
    probe = (
        "import json, sys\n"
        "from lace_proxy.cli import build_parser\n"
        "build_parser()\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    loaded = json.loads(done.stdout)
    heavy = [m for m in loaded if any(m == h or m.startswith(f"{h}.") for h in HEAVY)]
    assert heavy == []
