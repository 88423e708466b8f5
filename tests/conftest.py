"""Fixtures shared by every test directory."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest


def _twin(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        pytest.skip(f"compiled table not built in this environment ({exc})")


@pytest.fixture(params=["compiled", "pure"])
def twin(request: pytest.FixtureRequest) -> ModuleType:
    """Each table test runs once per twin: the compiled core and the pure-Python twin."""
    if request.param == "compiled":
        return _twin("lace_proxy.table._ctable")
    return _twin("lace_proxy.table._pytable")
