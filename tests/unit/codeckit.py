"""What the tests of the two netlink codecs (nf_tables, IPVS) share: their twin fixtures and
the random addresses both feed their twins, the edges where hand-written C goes wrong among
them (zero runs, IPv4-mapped IPv6); and what the tests of the channels that send encoded
requests share: a stand-in for the kernel's end of a netlink socket."""

from __future__ import annotations

import ipaddress
import random
import struct
from collections.abc import Callable
from types import ModuleType

import pytest

from lace_proxy.dataplane.netlink import Answer

#: A netlink message's header: length, type, flags, sequence, port id.
NLMSG = struct.Struct("=IHHII")


def codec_fixtures(compiled: str, pure: ModuleType) -> tuple[object, object]:
    """A codec's `compiled` fixture (its compiled twin; the test skipped where it is not
    built) and `twin` fixture (each twin in turn), to be bound to those names in the test
    module: `compiled, twin = codec_fixtures(...)`."""

    @pytest.fixture(name="compiled")
    def compiled_fixture() -> ModuleType:
        return pytest.importorskip(
            compiled, reason="the compiled codec is not built (python setup.py build_ext --inplace)"
        )

    @pytest.fixture(name="twin", params=["pure", "compiled"])
    def twin_fixture(request: pytest.FixtureRequest) -> ModuleType:
        if request.param == "pure":
            return pure
        module: ModuleType = request.getfixturevalue("compiled")
        return module

    return compiled_fixture, twin_fixture


def random_ipv6(rng: random.Random) -> str:
    """An IPv6 address in `ipaddress`'s text: now and then IPv4-mapped (its text differs
    between Python versions) or an edge, else hextets that are often zero, often short."""
    roll = rng.random()
    if roll < 0.05:
        return str(ipaddress.IPv6Address(f"::ffff:{ipaddress.IPv4Address(rng.getrandbits(32))}"))
    if roll < 0.1:
        return str(ipaddress.IPv6Address(rng.choice([0, 1, (1 << 128) - 1, 1 << 112])))
    hextets = [
        0 if rng.random() < 0.45 else rng.getrandbits(rng.choice([4, 8, 16])) for _ in "12345678"
    ]
    return str(ipaddress.IPv6Address(sum(h << (16 * (7 - i)) for i, h in enumerate(hextets))))


def random_address(rng: random.Random, version: int) -> str:
    """An IPv4 (`version` 4) or IPv6 address in `ipaddress`'s text."""
    return str(ipaddress.IPv4Address(rng.getrandbits(32))) if version == 4 else random_ipv6(rng)


class FakeKernel:
    """A netlink socket's two ends: what `send` got, and the answers it left waiting
    (at most `room` of them per send, as a receive buffer that fills up)."""

    def __init__(self, refuse: Callable[[bytes], int], room: int = 10_000) -> None:
        self.refuse = refuse
        self.room = room
        self.sent: list[bytes] = []
        self._waiting: dict[int, Answer] = {}

    def send(self, data: bytes) -> None:
        self.sent.append(data)
        at = 0
        while at < len(data):
            length, _, flags, sequence, _ = NLMSG.unpack_from(data, at)
            code = self.refuse(data[at : at + length])
            if (code or flags & 0x4) and len(self._waiting) < self.room:
                self._waiting[sequence] = Answer(code)
            at += length

    def replies(self) -> dict[int, Answer]:
        out, self._waiting = self._waiting, {}
        return out
