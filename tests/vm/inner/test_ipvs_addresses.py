"""Inside the VM: the dummy interface's addresses added and deleted in batches (several
`send`s each), read back by one dump, and the kernel's refusals mapped back to their
addresses; witnessed by ``ip addr``.

The kernel's own behaviour is what is tested: an address added that is there already
(EEXIST) and one deleted that is not (EADDRNOTAVAIL) are no refusals, and an IPv6 address on
an interface with IPv6 disabled is refused (EACCES) while the rest of its batch lands.
"""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyroute2 import IPRoute

from lace_proxy.dataplane.ipvs.addresses import PER_SEND, RTM_NEWADDR, AddressChannel

pytestmark = pytest.mark.ipvs

DUMMY = "lvs-addrs"
IPV6_OFF = Path("/proc/sys/net/ipv6/conf", DUMMY, "disable_ipv6")
V4 = [f"10.97.{i // 250}.{i % 250 + 1}" for i in range(PER_SEND * 5 // 2)]  # three sends
V6 = [f"fd00:97::{i:x}" for i in range(1, 11)]


def ip_addresses() -> set[str]:
    """The dummy's addresses as ``ip -o addr`` lists them."""
    out = subprocess.run(
        ["ip", "-o", "addr", "show", "dev", DUMMY], check=True, capture_output=True, text=True
    ).stdout
    return {str(ipaddress.ip_address(line.split()[3].split("/")[0])) for line in out.splitlines()}


@pytest.fixture
def dummy() -> Iterator[int]:
    subprocess.run(["ip", "link", "add", DUMMY, "type", "dummy"], check=True)
    try:
        with IPRoute() as ipr:
            yield int(ipr.link_lookup(ifname=DUMMY)[0])
    finally:
        subprocess.run(["ip", "link", "del", DUMMY], check=True)


def test_a_batch_lands_but_for_the_address_the_kernel_refuses(dummy: int) -> None:
    there = V4[7], V4[PER_SEND + 3]  # EEXIST: not added again, not refused
    for address in there:
        subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", DUMMY], check=True)
    IPV6_OFF.write_text("1\n")
    with AddressChannel() as channel:
        added, refused = channel.add(dummy, [*V4, V6[0]])
        assert added == len(V4) - len(there)
        assert [(r.command, r.address, r.errno) for r in refused] == [(RTM_NEWADDR, V6[0], 13)]
        assert str(refused[0]).startswith(f"adding {V6[0]} to the dummy interface refused: EACCES")
        assert ip_addresses() == set(V4)
        assert {a for i, a in channel.addresses() if i == dummy} == set(V4)


def test_deleting_many_and_some_that_are_not_there(dummy: int) -> None:
    IPV6_OFF.write_text("0\n")
    with AddressChannel() as channel:
        assert channel.add(dummy, V4 + V6) == (len(V4) + len(V6), [])
        assert ip_addresses() == set(V4 + V6)
        assert {a for i, a in channel.addresses() if i == dummy} == set(V4 + V6)
        absent = ["10.97.200.1", "fd00:97::ffff"]  # EADDRNOTAVAIL: no refusal, not counted
        assert channel.delete(dummy, V4 + V6 + absent) == (len(V4) + len(V6), [])
        assert ip_addresses() == set()
        assert not [a for i, a in channel.addresses() if i == dummy]
