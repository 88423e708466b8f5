"""Runs the ``ipvs`` tests in the VM (tests/vm/inner/, and the ipvs mode of the traffic tests
in tests/netns) once with each way of making service addresses local (lace.ipvs.
serviceAddresses: the tests read it as IPVS_ADDRESSES), and proves the harness both ways: a
failure inside fails here with the inner output, a hung guest is killed in time."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from lace_proxy.config import SERVICE_ADDRESSES

from .conftest import Vm
from .harness import Job, VmError

INNER = "tests/vm/inner"
SKIP_LINE = re.compile(r"^SKIPPED \[(?P<count>\d+)\] [^:]+:\d+: (?P<why>.*)$", re.MULTILINE)


def children() -> set[int]:
    """Live processes whose parent is this one (qemu and virtiofsd while a VM runs)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


def setting(addresses: str) -> dict[str, str]:
    """The guest's environment for a run with lace.ipvs.serviceAddresses `addresses`."""
    return {"LACE_PROXY_IPVS_ADDRESSES": addresses}


@pytest.mark.parametrize("addresses", SERVICE_ADDRESSES)
def test_ipvs_suite_passes_in_the_vm(vm: Vm, addresses: str) -> None:
    result = vm.pytest([INNER, "-q", "-rs"], env=setting(addresses))
    assert result.passed, result.report()
    assert result.junit is not None, result.report()
    assert result.junit.tests > 0 and result.junit.skipped == 0, result.report()


@pytest.mark.parametrize("addresses", SERVICE_ADDRESSES)
def test_mode_parity_the_behavioural_suite_passes_in_ipvs_mode(vm: Vm, addresses: str) -> None:
    """tests/netns' traffic tests parametrized over modes, their ipvs half, on real IPVS."""
    args = ["tests/netns", "-m", "ipvs", "-q", "-rs"]
    result = vm.pytest(args, env=setting(addresses), timeout=1200)
    assert result.passed, result.report()
    assert result.junit is not None and result.junit.tests >= 15, result.report()
    # -rs folds the skips of one reason and place into one line: "SKIPPED [4] file:line: why"
    skipped = list(SKIP_LINE.finditer(result.output))
    assert sum(int(m["count"]) for m in skipped) == result.junit.skipped, result.report()
    assert all("nftables mode only" in m["why"] for m in skipped), result.report()


def test_inner_failure_fails_with_inner_output(vm: Vm) -> None:
    result = vm.pytest(
        [f"{INNER}/test_guest.py::test_fails_on_purpose_when_asked", "-q"],
        env={"LACE_PROXY_VM_FAIL_ON_PURPOSE": "1"},
    )
    assert result.returncode == 1, result.report()
    assert result.junit is not None and result.junit.failures == 1, result.report()
    assert "failing on purpose (LACE_PROXY_VM_FAIL_ON_PURPOSE=1)" in result.output
    assert "failing on purpose" in result.report()


def test_hung_guest_is_killed_at_the_timeout(vm: Vm) -> None:
    before = children()
    with pytest.raises(VmError, match=r"did not finish within 10 s") as failure:
        vm.run([Job(["sleep", "600"])], timeout=10)
    assert "--- VM console ---" in str(failure.value)
    assert children() == before  # qemu and both virtiofsd are gone
