"""Both backends keep the dataplane contract (lace_proxy/dataplane/base.py): every method of
the protocol, with its parameters in the same order (a type checker would say as much)."""

from __future__ import annotations

import inspect

import pytest

from lace_proxy.dataplane.base import Dataplane
from lace_proxy.dataplane.ipvs import IpvsBackend
from lace_proxy.dataplane.nftables.backend import NftablesBackend

METHODS = sorted(
    name for name, value in vars(Dataplane).items() if inspect.isfunction(value) and name[0] != "_"
)


def test_the_contract_is_what_the_proxier_and_cleanup_call() -> None:
    assert METHODS == ["apply", "cleanup", "full_sync", "node_addresses_changed"]


@pytest.mark.parametrize("backend", [NftablesBackend, IpvsBackend])
@pytest.mark.parametrize("method", METHODS)
def test_each_backend_keeps_the_contract(backend: type, method: str) -> None:
    wanted = list(inspect.signature(getattr(Dataplane, method)).parameters)
    held = inspect.signature(getattr(backend, method)).parameters
    assert list(held)[: len(wanted)] == wanted
    extra = list(held)[len(wanted) :]
    assert all(held[name].default is not inspect.Parameter.empty for name in extra)
