"""Inside the VM: what the guest gives tests, and a failure on request that proves the outer
harness reports inner failures (tests/vm/test_vm.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import pytest

pytestmark = pytest.mark.ipvs

FAIL_ON_PURPOSE = "LACE_PROXY_VM_FAIL_ON_PURPOSE"


def test_guest_environment() -> None:
    assert os.environ["LACE_PROXY_IN_VM"] == "1"
    assert os.geteuid() == 0
    for tool in ("ip", "nft", "ipvsadm"):
        assert shutil.which(tool), f"{tool} missing from the host root"
    assert os.path.isdir("/run/netns")
    with tempfile.NamedTemporaryFile(dir="/tmp") as f:  # the guest's own overlay on the host's
        f.write(b"x")
    # The host's root is shared read-only (a checkout under /tmp is in the writable overlay).
    assert not os.access("/usr/bin", os.W_OK)
    lo = subprocess.run(["ip", "-o", "link", "show", "lo"], capture_output=True, text=True)
    assert "UP" in lo.stdout.partition(">")[0], lo.stdout


def test_fails_on_purpose_when_asked() -> None:
    if os.environ.get(FAIL_ON_PURPOSE) == "1":
        pytest.fail(f"failing on purpose ({FAIL_ON_PURPOSE}=1)")
