"""Tests that need a kernel with IPVS (see harness.py).

* Tests marked ``ipvs`` (tests/vm/inner/, and the ipvs mode of tests parametrized over
  modes) run only inside the VM, where LACE_PROXY_IN_VM=1 (tests/conftest.py skips them
  anywhere else). ``tests/vm/test_vm.py`` runs them there.
* ``vm``: runs jobs in the VM, e.g. ``vm.pytest(["tests/vm/inner", "-q"])``. It skips only
  when the VM cannot start here at all (not root, qemu or virtiofsd missing, no kernel to
  fetch), and in CI (CI set) fails instead: scripts/setup installs all of it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import pytest

from ..conftest import IN_VM
from .harness import DEFAULT_TIMEOUT, Job, VmResult, VmUnavailable, prepare, run_jobs


class Vm:
    """Boots a fresh VM per call (nothing leaks from one run into the next)."""

    def run(self, jobs: Sequence[Job], *, timeout: float = DEFAULT_TIMEOUT) -> list[VmResult]:
        return run_jobs(jobs, timeout=timeout)

    def pytest(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> VmResult:
        [result] = run_jobs([Job.pytest(args, env)], timeout=timeout)
        return result


@pytest.fixture(scope="session")
def vm() -> Vm:
    if IN_VM:
        pytest.skip("already inside the VM")
    try:
        prepare()  # fetches the kernel and builds the initramfs on first use
    except VmUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"the IPVS VM cannot start in CI: {exc}")
        pytest.skip(f"the IPVS VM cannot start here: {exc}")
    return Vm()
