"""Fixtures shared by every test directory."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

from lace_proxy.config import SERVICE_ADDRESSES

from .kubekit import admin, control_plane, cuts, fault_proxy, namespace, real_kube

__all__ = ["admin", "control_plane", "cuts", "fault_proxy", "namespace", "real_kube"]  # fixtures


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


#: Set inside the IPVS test VM (tests/vm/harness.py).
IN_VM = os.environ.get("LACE_PROXY_IN_VM") == "1"
#: The proxy's modes, for tests that hold in both; ipvs runs only inside the VM.
MODES = ["nftables", pytest.param("ipvs", marks=pytest.mark.ipvs)]
#: How the ipvs tests' IPVS mode makes service addresses local (lace.ipvs.serviceAddresses):
#: tests/vm/test_vm.py runs them once with each setting, passing it into the VM.
IPVS_ADDRESSES = os.environ.get("LACE_PROXY_IPVS_ADDRESSES", "interface")
if IPVS_ADDRESSES not in SERVICE_ADDRESSES:
    raise ValueError(f"LACE_PROXY_IPVS_ADDRESSES={IPVS_ADDRESSES}: not one of {SERVICE_ADDRESSES}")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("ipvs") is not None and not IN_VM:
        pytest.skip("needs an IPVS kernel: runs inside the VM via tests/vm")
