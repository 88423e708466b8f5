"""pytest fixtures for the real control plane; import them into a conftest.py.

* ``control_plane``: one etcd + kube-apiserver per test session (starting takes a few
  seconds). Tests share it: put what you create in a namespace of your own, or name it
  uniquely, and delete it.
* ``real_kube``: an admin ``kubernetes.client.ApiClient`` for it, closed after the test.

The binaries are built by ``python -m testkit.controlplane.build`` (about 10 minutes the
first time). If they are not built, the fixture skips, unless LACE_PROXY_CONTROLPLANE_BUILD=1
asks it to build them itself; with LACE_PROXY_CONTROLPLANE_REQUIRE=1 it fails instead of
skipping (for CI, where a skip would hide a broken build).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from testkit.controlplane import build
from testkit.controlplane.cluster import ControlPlane


def _binaries() -> build.Binaries:
    bins = build.binaries()
    if build.is_built(bins):
        return bins
    if os.environ.get("LACE_PROXY_CONTROLPLANE_BUILD") == "1":
        return build.build()
    message = f"control plane not built ({bins.directory}): python -m testkit.controlplane.build"
    if os.environ.get("LACE_PROXY_CONTROLPLANE_REQUIRE") == "1":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    with ControlPlane(bins=_binaries()) as plane:
        yield plane


@pytest.fixture
def real_kube(control_plane: ControlPlane) -> Iterator[Any]:
    api = control_plane.admin_client()
    try:
        yield api
    finally:
        api.close()
