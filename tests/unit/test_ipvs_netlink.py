"""IPVS batches to the kernel and the kernel's refusals back to what each request asked, and
the real servers the codec leaves out.

The kernel here is a stand-in with the behaviour tests/netns can only show in the VM
(/work/shared/notes/netlink.md): generic netlink handles every request of a `send`,
answers an error for each it refuses (with the request's sequence number) and an
acknowledgement only for a request that asks for one. The channel is built around it without
a socket; the codec is the one `codec.py` picks.
"""

from __future__ import annotations

import errno
import ipaddress
import random
import struct
from types import ModuleType

import pytest

from lace_proxy.dataplane.ipvs import _pycodec
from lace_proxy.dataplane.ipvs.codec import CodecError
from lace_proxy.dataplane.ipvs.model import Target, VirtualServer
from lace_proxy.dataplane.ipvs.netlink import Batch, Change, IpvsChannel, Refusal
from lace_proxy.dataplane.netlink import CHUNK, Answer

from .codeckit import NLMSG, FakeKernel, codec_fixtures

FAMILY = 0x1F

compiled, twin = codec_fixtures("lace_proxy.dataplane.ipvs._ccodec", _pycodec)


def _port_of_dest(message: bytes) -> int | None:
    """The real server's port of a NEW/SET/DEL_DEST request (None for a service's)."""
    at = 20
    while at + 4 <= len(message):
        length, kind = struct.unpack_from("=HH", message, at)
        if kind & 0x3FFF == 2:  # IPVS_CMD_ATTR_DEST: its IPVS_DEST_ATTR_PORT
            inner = at + 4
            while inner + 4 <= at + length:
                size, attr = struct.unpack_from("=HH", message, inner)
                if attr == 2:
                    return int(struct.unpack_from(">H", message, inner + 4)[0])
                inner += (size + 3) & ~3
        at += (length + 3) & ~3
    return None


def _channel(kernel: FakeKernel) -> IpvsChannel:
    channel = object.__new__(IpvsChannel)  # no socket: the fake kernel is its socket
    channel.sock = kernel  # type: ignore[assignment]
    channel.family = FAMILY
    channel._next = 1
    return channel


VS = [VirtualServer(p, a, 80 + i) for i, (p, a) in enumerate([("TCP", "10.96.0.1")] * 3)]
VS += [VirtualServer("UDP", "fd00:96::a", 53), VirtualServer("SCTP", "10.96.0.9", 3868)]


def _big_batch(channel: IpvsChannel) -> tuple[Batch, list[Change]]:
    """Thousands of requests: a virtual service each, with its real servers."""
    batch = channel.batch()
    changes = []
    target = Target("rr", 0, frozenset())
    for i in range(1500):
        vs = VirtualServer("TCP", f"10.96.{i // 256}.{i % 256}", 80)
        batch.add_service(vs, target)
        changes.append(Change(1, vs))
        for port in (8080, 13, 8081):
            batch.add_server(vs, (f"10.1.{i // 256}.{i % 256}", port), 1)
            changes.append(Change(5, vs, (f"10.1.{i // 256}.{i % 256}", port), 1))
    return batch, changes


def test_a_batch_goes_in_buffers_under_the_limit_and_refusals_name_their_requests() -> None:
    kernel = FakeKernel(lambda m: errno.EEXIST if _port_of_dest(m) == 13 else 0)
    channel = _channel(kernel)
    batch, changes = _big_batch(channel)
    refused = channel.send(batch)
    assert len(kernel.sent) > 1 and all(len(data) <= CHUNK for data in kernel.sent)
    assert [r.change for r in refused] == [c for c in changes if c.server and c.server[1] == 13]
    assert {r.errno for r in refused} == {errno.EEXIST}
    assert [batch.change(r.sequence) for r in refused] == [r.change for r in refused]
    # One acknowledgement asked per buffer, by its last request.
    acks = 0
    for data in kernel.sent:
        at = 0
        while at < len(data):
            length, _, flags, _, _ = NLMSG.unpack_from(data, at)
            at += length
            acks += bool(flags & 0x4)
            assert bool(flags & 0x4) == (at == len(data))
    assert acks == len(kernel.sent)


def test_a_lost_barrier_makes_every_unanswered_request_of_its_buffer_a_refusal() -> None:
    kernel = FakeKernel(lambda m: errno.EEXIST if _port_of_dest(m) == 13 else 0, room=5)
    channel = _channel(kernel)
    batch, changes = _big_batch(channel)
    refused = channel.send(batch)
    # Each buffer: its first five refusals arrived, the rest of its requests' fate is unknown.
    assert [r.change for r in refused] == changes
    assert sum(r.errno == errno.EEXIST for r in refused) == 5 * len(kernel.sent)
    unknown = [r for r in refused if r.errno == 0]
    assert len(unknown) == len(changes) - 5 * len(kernel.sent)
    assert "no answer" in str(unknown[0])


def test_a_send_the_socket_refuses_refuses_its_buffer_and_the_rest_is_sent() -> None:
    kernel = FakeKernel(lambda m: 0)
    channel = _channel(kernel)
    batch, _ = _big_batch(channel)
    sent = kernel.send

    def first_fails(data: bytes) -> None:
        if not kernel.sent:
            kernel.sent.append(b"")
            raise OSError(errno.ENOBUFS, "no room")
        sent(data)

    kernel.send = first_fails  # type: ignore[method-assign]
    refused = channel.send(batch)
    first = batch.buffers()[0][1]
    assert [r.sequence for r in refused] == list(first)
    assert {r.errno for r in refused} == {errno.ENOBUFS}
    assert len(kernel.sent) == len(batch.buffers())


def test_sequence_numbers_do_not_repeat_across_batches() -> None:
    channel = _channel(FakeKernel(lambda m: 0))
    one = channel.batch()
    one.delete_service(VS[0])
    one.delete_server(VS[1], ("10.1.0.1", 80))
    channel.send(one)
    two = channel.batch()
    assert two.first == one.first + 2


@pytest.mark.parametrize(
    ("change", "text"),
    [
        (Change(1, VS[0]), "add virtual server TCP 10.96.0.1:80"),
        (Change(2, VS[3]), "change virtual server UDP [fd00:96::a]:53"),
        (Change(3, VS[4]), "delete virtual server SCTP 10.96.0.9:3868"),
        (Change(5, VS[0], ("10.1.0.1", 8080), 1), "add real server 10.1.0.1:8080 (weight 1) of"),
        (Change(6, VS[3], ("fd00::5", 53), 0), "change real server [fd00::5]:53 (weight 0) of UDP"),
        (Change(7, VS[1], ("10.1.0.1", 8080)), "delete real server 10.1.0.1:8080 of TCP"),
    ],
)
def test_a_refusal_names_what_was_refused_and_why(change: Change, text: str) -> None:
    refusal = Refusal(7, change, errno.EINVAL, "address not unicast")
    assert str(refusal).startswith(f"IPVS {text}")
    assert str(refusal).endswith("refused: EINVAL (Invalid argument): address not unicast")


def _ipaddress_unicast(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return not (ip.is_multicast or ip.is_unspecified or (ip.version == 6 and ip.is_link_local))


def _addresses(seed: int) -> list[str]:
    """Random addresses, and the edges of each range IPVS refuses as real servers."""
    rng = random.Random(seed)
    edges = ["0.0.0.0", "::", "223.255.255.255", "224.0.0.0", "239.255.255.255", "240.0.0.0"]
    edges += ["fe80::1", "fe80::1%eth0", "febf:ffff::1", "fec0::1", "ff02::1", "::ffff:224.0.0.1"]
    edges += ["0.0.0.1", "::1", "::ffff:0.0.0.0", "fe7f:ffff::1", "fe80::", "ff00::", "feff::1"]
    return (
        edges
        + [str(ipaddress.IPv4Address(rng.getrandbits(32))) for _ in range(3000)]
        + [
            str(
                ipaddress.IPv6Address(
                    (rng.choice([0, 0xFD, 0xFE, 0xFF]) << 120) | rng.getrandbits(120)
                )
            )
            for _ in range(3000)
        ]
    )


@pytest.mark.parametrize("seed", range(3))
def test_the_codec_leaves_out_what_ipvs_refuses(twin: ModuleType, seed: int) -> None:
    """`servers` reads addresses as the codec does (inet_pton, the planning's hot path) and
    leaves out what IPVS refuses as a real server: ipaddress's verdict, on random addresses
    and on the edges of each refused range."""
    addresses = _addresses(seed)
    servers = [(address, 80) for address in addresses]
    requests = twin.Requests(FAMILY, 1)
    _, left = requests.servers(5, 6, "10.0.0.1", 80, servers, 1)
    assert left == [(a, 80) for a in addresses if not _ipaddress_unicast(a)]
    assert left and len(requests) == len(addresses) - len(left)


# --- add_servers: a run of real servers, one record ---------------------------------------------


def _mixed_batch(channel: IpvsChannel, seed: int) -> tuple[Batch, list[Change], Batch]:
    """A batch of services, single real-server requests and runs of them (some left out),
    what each of its requests asked, and the same requests made one at a time."""
    rng = random.Random(seed)
    batch = channel.batch()
    singles = Batch(FAMILY, batch.first)
    changes: list[Change] = []
    target = Target("rr", 0, frozenset())
    for i in range(300):
        vs = VirtualServer(rng.choice(["TCP", "UDP", "SCTP"]), f"10.96.{i // 256}.{i % 256}", 80)
        roll = rng.random()
        if i % 60 == 30:  # runs that make no request: no record
            for nothing in ([], [("224.0.0.1", 80), ("ff02::1", 80), ("0.0.0.0", 80)]):
                assert batch.add_servers(vs, nothing, 1) == nothing
        elif roll < 0.2:
            for made in (batch, singles):
                made.add_service(vs, target)
            changes.append(Change(1, vs))
        elif roll < 0.4:
            server, weight = (f"10.1.0.{rng.randrange(256)}", rng.choice([13, 8080])), 1
            command = rng.choice([5, 6, 7])
            for made in (batch, singles):
                if command == 5:
                    made.add_server(vs, server, weight)
                elif command == 6:
                    made.change_server(vs, server, weight)
                else:
                    made.delete_server(vs, server)
            changes.append(Change(command, vs, server, 0 if command == 7 else weight))
        else:
            servers = [
                (rng.choice(["10.2.0.1", "10.2.0.2", "224.0.0.9", "fe80::1", "fd00::7"]), port)
                for port in rng.sample([13, 80, 443, 8080, 9090], rng.randrange(6))
            ]
            weight = rng.choice([0, 1, 7])
            kept = [s for s in servers if _ipaddress_unicast(s[0])]
            assert batch.add_servers(vs, iter(servers), weight) == [
                s for s in servers if s not in kept
            ]
            for server in kept:
                singles.add_server(vs, server, weight)
            changes += [Change(5, vs, server, weight) for server in kept]
    return batch, changes, singles


@pytest.mark.parametrize("seed", range(4))
def test_every_request_of_a_mixed_batch_maps_to_what_it_asked(seed: int) -> None:
    channel = _channel(FakeKernel(lambda m: 0))
    channel._next = 1 + seed * 1000
    batch, changes, singles = _mixed_batch(channel, seed)
    assert len(batch) == len(singles) == len(changes)
    sequences = range(batch.first, batch.first + len(batch))
    assert [batch.change(s) for s in sequences] == changes
    assert [singles.change(s) for s in sequences] == changes
    assert batch.buffers() == singles.buffers()
    assert batch.buffers(1 << 62) == singles.buffers(1 << 62)
    for outside in (batch.first - 1, batch.first + len(batch)):
        with pytest.raises(IndexError):
            batch.change(outside)


def test_a_mixed_batchs_refusals_name_their_requests() -> None:
    kernel_ = FakeKernel(lambda m: errno.EEXIST if _port_of_dest(m) == 13 else 0)
    channel = _channel(kernel_)
    batch, changes, _ = _mixed_batch(channel, 9)
    refused = channel.send(batch)
    expected = [c for c in changes if c.server and c.server[1] == 13]
    assert len(expected) > 10 and [r.change for r in refused] == expected
    [(_, sequences)] = batch.buffers(1 << 62)
    assert [r.sequence for r in refused] == [
        s for s, c in zip(sequences, changes, strict=True) if c in expected
    ]
    replies = {r.sequence: Answer(r.errno) for r in refused}
    replies.setdefault(sequences[-1], Answer(0))  # the barrier's acknowledgement
    assert batch.refusals(replies, sequences) == refused
    lost = batch.refusals({}, sequences)  # no barrier: every request's fate unknown
    assert [(r.change, r.errno) for r in lost] == [(c, 0) for c in changes]


def test_add_servers_refuses_what_add_server_refuses_and_leaves_the_batch_as_it_was() -> None:
    channel = _channel(FakeKernel(lambda m: 0))
    batch = channel.batch()
    batch.add_service(VS[0], Target("rr", 0, frozenset()))
    batch.add_servers(VS[0], [("10.1.0.1", 80), ("224.0.0.1", 80)], 1)

    def state() -> tuple[int, list[tuple[bytes, range]], list[Change]]:
        return len(batch), batch.buffers(), [batch.change(batch.first + i) for i in range(2)]

    before = state()
    assert before[2][1] == Change(5, VS[0], ("10.1.0.1", 80), 1)
    bad = [("10.1.0.2", 80), ("10.1.0.x", 80)]
    with pytest.raises(CodecError) as bulk:
        batch.add_servers(VS[0], bad, 1)
    with pytest.raises(CodecError) as single:
        channel.batch().add_server(VS[0], bad[1], 1)
    assert str(bulk.value) == str(single.value)
    with pytest.raises(CodecError, match="weight -1 is out of range"):
        batch.add_servers(VS[0], bad[:1], -1)
    assert state() == before
    assert batch.add_server(VS[1], ("10.1.0.3", 80), 1) == batch.first + 2
    assert batch.change(batch.first + 2) == Change(5, VS[1], ("10.1.0.3", 80), 1)
