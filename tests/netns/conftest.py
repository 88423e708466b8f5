"""Fixtures for tests that drive real packets through network namespaces (see testbed.py).

* ``testbed``: a fresh two-pod testbed per test.
* ``session_testbed``: one two-pod testbed shared by the whole session; a test using it must
  undo what it changes (e.g. delete the nft tables it adds).
* ``make_testbed``: a factory for testbeds with other parameters, torn down after the test.
* ``cluster``: one two-node ClusterTestbed (cluster.py) per test module; a test using it must
  undo what it changes.

Tests marked ``netns`` (and every test using these fixtures) are skipped unless run as root
with ``ip`` and ``nft`` available.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from lace_proxy.demo.testbed import Testbed, remove_stale_namespaces
from testkit.cluster_testbed import ClusterTestbed


def skip_unless_capable() -> None:
    if os.geteuid() != 0:
        pytest.skip("netns tests need root (network namespaces, veth pairs, nftables)")
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"netns tests need {' and '.join(missing)} on PATH")


@pytest.fixture(scope="session", autouse=True)
def _stale_namespaces_removed() -> None:
    """Clean up after earlier runs that were killed before their teardown could run."""
    if os.geteuid() == 0 and shutil.which("ip"):
        remove_stale_namespaces()


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("netns") is not None:
        skip_unless_capable()


@pytest.fixture
def testbed() -> Iterator[Testbed]:
    skip_unless_capable()
    with Testbed() as tb:
        yield tb


@pytest.fixture(scope="session")
def session_testbed() -> Iterator[Testbed]:
    skip_unless_capable()
    with Testbed() as tb:
        yield tb


@pytest.fixture
def make_testbed() -> Iterator[Callable[..., Testbed]]:
    """Call with Testbed's keyword arguments, e.g. make_testbed(pods=3, ports=(53,))."""
    skip_unless_capable()
    with contextlib.ExitStack() as stack:

        def make(**kwargs: Any) -> Testbed:
            return stack.enter_context(Testbed(**kwargs))

        yield make


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterTestbed]:
    """Per module rather than per test: ten namespaces and nine servers take ~0.15 s to build."""
    skip_unless_capable()
    with ClusterTestbed() as tb:
        yield tb
