"""lace-proxy: a kube-proxy replacement with a compiled service table and the Lace network model."""

from __future__ import annotations

__version__ = "0.1.0"


def implementation() -> str:
    """Which service table is active: "compiled" (ext/table.pyx) or "pure" (the twin)."""
    from lace_proxy.table import IMPLEMENTATION

    return IMPLEMENTATION
