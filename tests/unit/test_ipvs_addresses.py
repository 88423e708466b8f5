"""Service address requests as pyroute2 encodes them (the dummy interface's addresses, and
local routes), and refusals mapped back to their addresses (the dumps' parse is
test_rtnetlink's).

Against a recording stand-in for the kernel (codeckit's: every request of a `send`
carried out, an answer only for a refusal or a request that asks for one); the real kernel's
behaviour is tests/vm/inner/test_ipvs_addresses.py's (addresses: this host has no dummy
interface) and tests/netns/test_netlink.py's (local routes).
"""

from __future__ import annotations

import errno
import ipaddress
import random
import struct

from pyroute2 import IPBatch

from lace_proxy.dataplane.ipvs import addresses as rtnl
from lace_proxy.dataplane.ipvs.addresses import AddressChannel, AddressRefusal
from lace_proxy.dataplane.ipvs.model import ROUTE_PROTOCOL
from lace_proxy.dataplane.netlink import CHUNK

from .codeckit import NLMSG, FakeKernel

INDEX = 7


def _random_address(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return str(ipaddress.IPv4Address(rng.getrandbits(32)))
    return str(ipaddress.IPv6Address(rng.getrandbits(128)))


def _pyroute2(command: str, address: str) -> bytes:
    batch = IPBatch()
    try:
        length = 128 if ":" in address else 32
        batch.addr(command, index=INDEX, address=address, prefixlen=length)
        return bytes(batch.batch)
    finally:
        batch.close()


def test_an_address_request_is_encoded_as_pyroute2_encodes_it() -> None:
    """pyroute2 asks for an acknowledgement of each; its sequence and port id are its own."""
    rng = random.Random(11)
    for _ in range(200):
        address, sequence = _random_address(rng), rng.randrange(1, 1 << 31)
        for command, kind, flags in (
            ("add", rtnl.RTM_NEWADDR, rtnl.NLM_F_CREATE | rtnl.NLM_F_EXCL),
            ("del", rtnl.RTM_DELADDR, 0),
        ):
            flags |= rtnl.NLM_F_REQUEST | rtnl.NLM_F_ACK
            ours = rtnl.request(kind, flags, INDEX, address, sequence)
            theirs = _pyroute2(command, address)
            assert ours[:8] + ours[16:] == theirs[:8] + theirs[16:], (command, address)
            assert NLMSG.unpack_from(ours)[3] == sequence


def _pyroute2_route(command: str, address: str) -> bytes:
    batch = IPBatch()
    try:
        length = 128 if ":" in address else 32
        batch.route(
            command,
            dst=f"{address}/{length}",
            table=255,
            type="local",
            scope="host",
            proto=ROUTE_PROTOCOL,
            oif=1,
        )
        return bytes(batch.batch)
    finally:
        batch.close()


def test_a_local_route_request_is_encoded_as_pyroute2_encodes_it() -> None:
    """Type local, scope host, on lo, of lace-proxy's protocol, in the local table; with
    pyroute2's flags for the comparison (the channel's own are below)."""
    rng = random.Random(12)
    for _ in range(200):
        address, sequence = _random_address(rng), rng.randrange(1, 1 << 31)
        for command, kind in (("add", rtnl.RTM_NEWROUTE), ("del", rtnl.RTM_DELROUTE)):
            theirs = _pyroute2_route(command, address)
            flags = NLMSG.unpack_from(theirs)[2]
            ours = rtnl.route_request(kind, flags, ROUTE_PROTOCOL, address, sequence)
            assert ours[:8] + ours[16:] == theirs[:8] + theirs[16:], (command, address)
            assert NLMSG.unpack_from(ours)[3] == sequence


def _channel(kernel: FakeKernel) -> AddressChannel:
    channel = object.__new__(AddressChannel)  # no socket: the fake kernel is its socket
    channel.sock = kernel  # type: ignore[assignment]
    channel._next = 1
    return channel


def _address_of(message: bytes) -> str:
    """The address of a request: its first attribute's, after the ifaddrmsg (8 bytes) of an
    address request or the rtmsg (12) of a route request."""
    at = 16 + (12 if NLMSG.unpack_from(message)[1] in (rtnl.RTM_NEWROUTE, rtnl.RTM_DELROUTE) else 8)
    length = struct.unpack_from("=H", message, at)[0]
    return str(ipaddress.ip_address(message[at + 4 : at + length]))


ADDRESSES = [f"10.96.{i // 256}.{i % 256}" for i in range(2500)] + ["fd00::a", "fd00::b"]
PRESENT = {"10.96.0.7", "10.96.5.200", "fd00::b"}  # EEXIST on add, not added
DISABLED = "fd00::a"  # IPv6 off on the interface: EACCES


def _refuse(message: bytes) -> int:
    address = _address_of(message)
    if address == DISABLED:
        return errno.EACCES
    return errno.EEXIST if address in PRESENT else 0


def test_additions_go_per_send_and_a_refusal_names_its_address() -> None:
    kernel = FakeKernel(_refuse)
    added, refused = _channel(kernel).add(INDEX, ADDRESSES)
    assert added == len(ADDRESSES) - len(PRESENT) - 1
    assert refused == [AddressRefusal(rtnl.RTM_NEWADDR, DISABLED, errno.EACCES)]
    assert str(refused[0]) == (
        "adding fd00::a to the dummy interface refused: EACCES (Permission denied)"
    )
    sent = [m for data in kernel.sent for m in _split(data)]
    assert sorted(map(_address_of, sent)) == sorted(ADDRESSES)
    assert len(kernel.sent) == -(-len(ADDRESSES) // rtnl.PER_SEND)
    assert all(len(data) <= CHUNK for data in kernel.sent)
    for data in kernel.sent:  # one acknowledgement asked per send, by its last request
        flags = [NLMSG.unpack_from(m)[2] for m in _split(data)]
        assert [bool(f & rtnl.NLM_F_ACK) for f in flags] == [False] * (len(flags) - 1) + [True]


def test_deleting_what_is_not_there_is_no_refusal_and_a_lost_barrier_is_one() -> None:
    gone = errno.EADDRNOTAVAIL
    kernel = FakeKernel(lambda m: gone if _address_of(m) in PRESENT else 0)
    deleted, refused = _channel(kernel).delete(INDEX, ADDRESSES)
    assert (deleted, refused) == (len(ADDRESSES) - len(PRESENT), [])
    # Room for two answers a send: the barrier's is lost where two refusals came first.
    kernel = FakeKernel(lambda m: errno.EPERM if _address_of(m).endswith(".1") else 0, room=2)
    deleted, refused = _channel(kernel).delete(INDEX, ADDRESSES)
    assert {r.errno for r in refused} == {errno.EPERM, 0}
    lost = next(r for r in refused if not r.errno)
    assert str(lost).startswith(f"deleting {lost.address} from the dummy interface refused: no")
    assert deleted == len(ADDRESSES) - len(refused)


def test_local_routes_go_per_send_and_a_refusal_names_its_address() -> None:
    kernel = FakeKernel(_refuse)
    added, refused = _channel(kernel).add_routes(ROUTE_PROTOCOL, ADDRESSES)
    assert added == len(ADDRESSES) - len(PRESENT) - 1  # EEXIST: there already, no refusal
    assert refused == [AddressRefusal(rtnl.RTM_NEWROUTE, DISABLED, errno.EACCES)]
    assert (
        str(refused[0]) == "adding the local route of fd00::a refused: EACCES (Permission denied)"
    )
    sent = [m for data in kernel.sent for m in _split(data)]
    assert sorted(map(_address_of, sent)) == sorted(ADDRESSES)
    assert len(kernel.sent) == -(-len(ADDRESSES) // rtnl.PER_SEND)
    assert all(len(data) <= CHUNK for data in kernel.sent)
    # Created, never exclusive: the kernel's route of an address of the same destination (a
    # node leaving the dummy interface) does not stop ours. One acknowledgement per send.
    for data in kernel.sent:
        flags = [NLMSG.unpack_from(m)[2] for m in _split(data)]
        create = rtnl.NLM_F_REQUEST | rtnl.NLM_F_CREATE
        assert flags == [create] * (len(flags) - 1) + [create | rtnl.NLM_F_ACK]
    gone = FakeKernel(lambda m: errno.ESRCH if _address_of(m) in PRESENT else 0)
    deleted, refused = _channel(gone).delete_routes(ROUTE_PROTOCOL, ADDRESSES)
    assert (deleted, refused) == (len(ADDRESSES) - len(PRESENT), [])  # ESRCH: gone already
    assert {NLMSG.unpack_from(m)[2] & ~rtnl.NLM_F_ACK for d in gone.sent for m in _split(d)} == {
        rtnl.NLM_F_REQUEST
    }
    refusing = FakeKernel(lambda m: errno.EPERM)
    _, refused = _channel(refusing).delete_routes(ROUTE_PROTOCOL, ["10.96.0.1"])
    assert str(refused[0]).startswith("deleting the local route of 10.96.0.1 refused: EPERM")


def _split(data: bytes) -> list[bytes]:
    out, at = [], 0
    while at < len(data):
        length = NLMSG.unpack_from(data, at)[0]
        out.append(data[at : at + length])
        at += length
    return out
