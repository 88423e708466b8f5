"""The IPVS codec's twins, side by side, and against what the sync sent before them.

The compiled twin (`_ccodec`, ext/ipvscodec.pyx) is held to the pure one (`_pycodec`): the
same request bytes for the same seeded random virtual and real servers (IPv4 and IPv6, TCP,
UDP and SCTP, persistence, schedulers, weights), the same buffers at every size limit, the
same values from the same dump answers, the same errors. The pure twin is held to meaning:
its requests carry what pyroute2's messages carried (decoded by pyroute2 itself), and a dump
made as the kernel makes it reads back as the values it was made of. The comparisons with
the compiled twin are skipped where it is not built.
"""

from __future__ import annotations

import errno
import ipaddress
import random
import socket
import struct
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from pyroute2 import IPVSDest, IPVSService
from pyroute2.netlink.generic import ipvs as genl_ipvs

from lace_proxy.dataplane.ipvs import _pycodec

from .codeckit import codec_fixtures, random_address

NLMSG = struct.Struct("=IHHII")
FAMILY = 0x1F  # an IPVS family id, as the kernel numbers it at boot
PROTOCOLS = (6, 17, 132)
SCHEDULERS = ("rr", "wrr", "lc", "wlc", "sh", "mh", "sed", "nq", "fo", "ovf", "dh", "lblc")
SERVICE_COMMANDS = (1, 2, 3)  # IPVS_CMD_NEW/SET/DEL_SERVICE
SERVER_COMMANDS = (5, 6, 7)  # IPVS_CMD_NEW/SET/DEL_DEST


compiled, twin = codec_fixtures("lace_proxy.dataplane.ipvs._ccodec", _pycodec)


# --- Random virtual and real servers -----------------------------------------------------------


def _port(rng: random.Random) -> int:
    return rng.choice([0, 1, 53, 80, 443, 65535, rng.randrange(65536)])


def _call(rng: random.Random) -> tuple[str, tuple[Any, ...]]:
    """One request: ("service", args) or ("server", args), as the sync makes them."""
    version = rng.choice([4, 6])
    key = (rng.choice(PROTOCOLS), random_address(rng, version), _port(rng))
    if rng.random() < 0.3:
        timeout = rng.choice([0, 0, 1, 10800, 86400, 0xFFFFFFFF])
        return "service", (rng.choice(SERVICE_COMMANDS), *key, rng.choice(SCHEDULERS), timeout)
    weight = rng.choice([0, 1, 1, 2, 100, 0x7FFFFFFF])
    server = random_address(rng, version)
    return "server", (rng.choice(SERVER_COMMANDS), *key, server, _port(rng), weight)


def _encode(module: ModuleType, calls: list[tuple[str, tuple[Any, ...]]], first: int) -> Any:
    requests = module.Requests(FAMILY, first)
    numbers = [getattr(requests, kind)(*args) for kind, args in calls]
    return requests, numbers


def _messages(data: bytes) -> list[bytes]:
    out = []
    while data:
        length = NLMSG.unpack_from(data)[0]
        out.append(data[:length])
        data = data[length:]
    return out


@pytest.mark.parametrize("seed", range(12))
def test_the_twins_encode_the_same_requests(compiled: ModuleType, seed: int) -> None:
    rng = random.Random(seed)
    calls = [_call(rng) for _ in range(rng.choice([1, 7, 400, 3000]))]
    first = rng.choice([1, 2, 0xFFFFFFFF - len(calls), rng.randrange(1 << 30)])
    pure, pure_numbers = _encode(_pycodec, calls, first)
    fast, fast_numbers = _encode(compiled, calls, first)
    assert pure_numbers == fast_numbers == list(range(first, first + len(calls)))
    assert len(pure) == len(fast) == len(calls)
    for limit in (1, 100, 200, 4096, 65536, 1 << 40):
        assert pure.chunks(limit) == fast.chunks(limit), limit


@pytest.mark.parametrize("limit", [1, 150, 1000, 65536])
def test_buffers_hold_whole_requests_under_the_limit_each_acknowledged_at_its_end(
    twin: ModuleType, limit: int
) -> None:
    rng = random.Random(limit)
    calls = [_call(rng) for _ in range(500)]
    requests, _ = _encode(twin, calls, 7)
    everything = []
    expected_first = 7
    for data, last in requests.chunks(limit):
        messages = _messages(data)
        assert len(data) <= limit or len(messages) == 1
        sequences = [NLMSG.unpack_from(m)[3] for m in messages]
        assert sequences == list(range(expected_first, last + 1))
        flags = [NLMSG.unpack_from(m)[2] for m in messages]
        assert flags == [1] * (len(messages) - 1) + [1 | 4]  # NLM_F_REQUEST, ACK at the end
        everything += messages
        expected_first = last + 1
    assert expected_first == 7 + len(calls)
    assert len(everything) == len(calls)
    assert all(NLMSG.unpack_from(m)[1] == FAMILY for m in everything)


def _decoded(message: bytes) -> tuple[int, dict[str, dict[str, Any]]]:
    """A request as pyroute2 decodes it: the command, and each nest's attributes."""
    msg = genl_ipvs.ipvsmsg(message)
    msg.decode()
    return msg["cmd"], {name: dict(value["attrs"]) for name, value in msg["attrs"]}


def _pyroute2_request(kind: str, args: tuple[Any, ...]) -> bytes:
    """The request the sync built with pyroute2 before the codec (kernel.py's service(),
    key() and dest() of then: NAT forwarding, a full flags mask)."""
    msg = genl_ipvs.ipvsmsg()
    msg["cmd"], msg["version"] = args[0], 1
    protocol, address, port = args[1:4]
    if kind == "service":
        scheduler, timeout = args[4:]
        fields: dict[str, Any] = {
            "addr": address,
            "port": port,
            "protocol": protocol,
            "sched_name": scheduler,
            "flags": {"flags": 1 if timeout else 0, "mask": 0xFFFFFFFF},
            "timeout": timeout,
        }
        if ":" in address:
            fields["netmask"] = "128.0.0.0"
        msg["attrs"] = [("IPVS_CMD_ATTR_SERVICE", IPVSService(**fields).dump_nla())]
    else:
        server, server_port, weight = args[4:]
        key = IPVSService(addr=address, port=port, protocol=protocol).dump_key()
        dest = IPVSDest(addr=server, port=server_port, fwd_method=0, weight=weight)
        msg["attrs"] = [("IPVS_CMD_ATTR_SERVICE", key), ("IPVS_CMD_ATTR_DEST", dest.dump_nla())]
    msg["header"]["type"] = FAMILY
    msg.encode()
    return bytes(msg.data)


#: What pyroute2 sent that the codec leaves out: its defaults for tunnel forwarding (unused
#: with NAT), and for a deletion the fields the kernel ignores then.
TUNNEL = {"IPVS_DEST_ATTR_TUN_TYPE", "IPVS_DEST_ATTR_TUN_PORT", "IPVS_DEST_ATTR_TUN_FLAGS"}
FULL_SERVICE = {
    "IPVS_SVC_ATTR_SCHED_NAME",
    "IPVS_SVC_ATTR_FLAGS",
    "IPVS_SVC_ATTR_TIMEOUT",
    "IPVS_SVC_ATTR_NETMASK",
}
FULL_DEST = {
    "IPVS_DEST_ATTR_FWD_METHOD",
    "IPVS_DEST_ATTR_WEIGHT",
    "IPVS_DEST_ATTR_U_THRESH",
    "IPVS_DEST_ATTR_L_THRESH",
}


@pytest.mark.parametrize("seed", range(4))
def test_requests_carry_what_pyroute2s_carried(seed: int) -> None:
    rng = random.Random(seed)
    calls = [_call(rng) for _ in range(300)]
    requests, _ = _encode(_pycodec, calls, 1)
    [(data, _)] = requests.chunks(1 << 40)
    for (kind, args), ours in zip(calls, _messages(data), strict=True):
        command, attrs = _decoded(ours)
        theirs_command, theirs = _decoded(_pyroute2_request(kind, args))
        assert command == theirs_command == args[0]
        if "IPVS_CMD_ATTR_DEST" in theirs:
            dest = theirs["IPVS_CMD_ATTR_DEST"]
            for name in TUNNEL | (FULL_DEST if command == 7 else set()):
                dest.pop(name, None)
        elif command == 3:
            for name in FULL_SERVICE:
                theirs["IPVS_CMD_ATTR_SERVICE"].pop(name, None)
        assert attrs == theirs, (kind, args)


BAD = [
    ("service", (4, 6, "10.0.0.1", 80, "rr", 0), "4 is not a virtual-service command"),
    ("service", (5, 6, "10.0.0.1", 80, "rr", 0), "5 is not a virtual-service command"),
    ("server", (1, 6, "10.0.0.1", 80, "10.1.0.1", 8080, 1), "1 is not a real-server command"),
    ("service", (1, 6, "10.0.0.256", 80, "rr", 0), "does not appear to be an IPv4 or IPv6"),
    ("service", (1, 6, "", 80, "rr", 0), "does not appear to be an IPv4 or IPv6"),
    ("service", (1, 6, "10.0.0.1\0", 80, "rr", 0), "does not appear to be an IPv4 or IPv6"),
    ("service", (1, 65536, "10.0.0.1", 80, "rr", 0), "protocol 65536 is out of range"),
    ("service", (1, True, "10.0.0.1", 80, "rr", 0), "protocol True is out of range"),
    ("service", (1, 6, "10.0.0.1", -1, "rr", 0), "port -1 is out of range"),
    ("service", (1, 6, "fd00::1", 1 << 70, "rr", 0), "is out of range"),
    ("service", (1, 6, "10.0.0.1", 80, "r\0r", 0), "is not a scheduler name"),
    ("service", (1, 6, "10.0.0.1", 80, "rr\u00e9", 0), "is not a scheduler name"),
    ("service", (2, 6, "10.0.0.1", 80, None, 0), "None is not a scheduler name"),
    ("service", (1, 6, "10.0.0.1", 80, "rr", 1 << 32), "timeout 4294967296 is out of range"),
    ("service", (1, 6, "10.0.0.1", 80, "rr", 1.0), "timeout 1.0 is out of range"),
    ("server", (5, 6, "10.0.0.1", 80, "10.1.0.1", 70000, 1), "port 70000 is out of range"),
    ("server", (5, 6, "10.0.0.1", 80, "10.1.0.x", 80, 1), "does not appear to be an IPv4"),
    ("server", (6, 6, "10.0.0.1", 80, "10.1.0.1", 80, -1), "weight -1 is out of range"),
    ("server", (5, 6, "10.0.0.1", 80, "10.1.0.1", 80, 1 << 31), "is out of range"),
]


@pytest.mark.parametrize(("kind", "args", "message"), BAD)
def test_the_twins_refuse_the_same_input_the_same_way(
    compiled: ModuleType, kind: str, args: tuple[Any, ...], message: str
) -> None:
    errors = []
    for module in (_pycodec, compiled):
        requests = module.Requests(FAMILY, 1)
        with pytest.raises(module.CodecError, match=None) as raised:
            getattr(requests, kind)(*args)
        errors.append(str(raised.value))
        assert len(requests) == 0  # nothing half-written
        assert requests.chunks(100) == []
    assert errors[0] == errors[1]
    assert message in errors[0]


# --- Real servers in bulk (`servers`) ------------------------------------------------------------

#: Addresses IPVS refuses as real servers, and their neighbours it takes.
REFUSED = ["0.0.0.0", "224.0.0.0", "224.0.0.1", "239.255.255.255", "::", "ff00::", "ff02::1"]
REFUSED += ["fe80::", "fe80::1", "febf:ffff::1", "fe80::1%eth0"]
TAKEN = ["0.0.0.1", "223.255.255.255", "240.0.0.0", "255.255.255.255", "::1", "fec0::1"]
TAKEN += ["fe7f::1", "feff::1", "::ffff:224.0.0.1", "::ffff:0.0.0.0", "fd00::1%eth0"]
REFUSED_NETWORKS = [
    ipaddress.ip_network(n)
    for n in ("224.0.0.0/4", "0.0.0.0/32", "ff00::/8", "::/128", "fe80::/10")
]


def _refused(address: str) -> bool:
    """IPVS's rule, by network membership (not the codec's byte tests, nor `ipaddress`'s
    properties, whose verdict on IPv4-mapped addresses differs between Python versions)."""
    ip = ipaddress.ip_address(address.split("%")[0])
    return any(ip in network for network in REFUSED_NETWORKS)


def _bulk_call(rng: random.Random) -> tuple[str, tuple[Any, ...]]:
    """A service, a real server, or a run of real servers ("servers": 0 to 20 of them, some
    IPVS refuses, now and then as lists or from a generator)."""
    if rng.random() < 0.5:
        return _call(rng)
    version = rng.choice([4, 6])
    key = (rng.choice(PROTOCOLS), random_address(rng, version), _port(rng))
    servers: list[Any] = []
    for _ in range(rng.choice([0, 1, 2, 5, 20])):
        roll = rng.random()
        if roll < 0.15:
            address = rng.choice(REFUSED)
        elif roll < 0.25:
            address = rng.choice(TAKEN)
        else:
            address = random_address(rng, version if rng.random() < 0.9 else 10 - version)
        server = (address, _port(rng))
        servers.append(list(server) if rng.random() < 0.1 else server)
    weight = rng.choice([0, 1, 2, 100, 0x7FFFFFFF])
    return "servers", (rng.choice(SERVER_COMMANDS), *key, servers, weight)


def _bulk(requests: Any, kind: str, args: tuple[Any, ...], generator: bool) -> Any:
    if kind != "servers":
        return getattr(requests, kind)(*args)
    *head, servers, weight = args
    return requests.servers(*head, (s for s in servers) if generator else servers, weight)


@pytest.mark.parametrize("seed", range(10))
def test_servers_encodes_what_successive_server_calls_encode_leaving_out_what_ipvs_refuses(
    twin: ModuleType, seed: int
) -> None:
    rng = random.Random(seed)
    calls = [_bulk_call(rng) for _ in range(rng.choice([1, 10, 300]))]
    first = rng.choice([1, rng.randrange(1 << 30)])
    bulk, single = twin.Requests(FAMILY, first), twin.Requests(FAMILY, first)
    left_out = 0
    for kind, args in calls:
        made = _bulk(bulk, kind, args, rng.random() < 0.2)
        if kind != "servers":
            assert made == getattr(single, kind)(*args)
            continue
        *head, servers, weight = args
        expected_first = len(single) + first
        numbers = [
            single.server(*head, *server, weight) for server in servers if not _refused(server[0])
        ]
        left = [server for server in servers if _refused(server[0])]
        assert made == (expected_first, left)
        assert all(a is b for a, b in zip(made[1], left, strict=True))  # the very items
        assert numbers == list(range(expected_first, expected_first + len(numbers)))
        left_out += len(left)
    assert len(bulk) == len(single)
    for limit in (1, 200, 4096, 1 << 40):
        assert bulk.chunks(limit) == single.chunks(limit), limit
    if len(calls) > 100:
        assert left_out and len(bulk) > len(calls)  # the seeds make bulk calls and leave out


@pytest.mark.parametrize("seed", range(6))
def test_the_twins_encode_the_same_bulk_requests(compiled: ModuleType, seed: int) -> None:
    rng = random.Random(50 + seed)
    calls = [_bulk_call(rng) for _ in range(rng.choice([5, 500, 2000]))]
    first = rng.choice([1, 0xFFFFFFFF - 30 * len(calls), rng.randrange(1 << 30)])
    made = []
    for module in (_pycodec, compiled):
        requests = module.Requests(FAMILY, first)
        numbers = [_bulk(requests, kind, args, False) for kind, args in calls]
        made.append((numbers, len(requests), [requests.chunks(n) for n in (1, 300, 1 << 40)]))
    assert made[0] == made[1]


#: A run of real servers that `servers` refuses, and the message; the same as `server`'s for
#: the first bad server among them, and nothing encoded, not even the good ones before it.
BAD_SERVERS = [
    ((1, 6, "10.0.0.1", 80), [("10.1.0.1", 80)], 1, "1 is not a real-server command"),
    ((5, 6, "10.0.0.x", 80), [("10.1.0.1", 80)], 1, "does not appear to be an IPv4 or IPv6"),
    ((5, 1 << 16, "10.0.0.1", 80), [("10.1.0.1", 80)], 1, "protocol 65536 is out of range"),
    ((6, 6, "fd00::1", -1), [("fd00::2", 80)], 1, "port -1 is out of range"),
    ((5, 6, "10.0.0.1", 80), [("10.1.0.1", 80)], -1, "weight -1 is out of range"),
    ((6, 6, "10.0.0.1", 80), [("10.1.0.1", 80)], 1 << 31, "weight 2147483648 is out of range"),
    ((5, 6, "10.0.0.1", 80), [("10.1.0.1", 80), ("10.1.0.x", 80)], 1, "does not appear to be"),
    ((5, 6, "10.0.0.1", 80), [("10.1.0.1", 80), ("", 80)], 1, "does not appear to be"),
    ((5, 6, "10.0.0.1", 80), [("10.1.0.1", 80), ("10.1.0.2", 70000)], 1, "port 70000 is out"),
    ((5, 6, "10.0.0.1", 80), [("10.1.0.1", 80), ("10.1.0.2", 1.0)], 1, "port 1.0 is out"),
    ((7, 6, "10.0.0.1", 80), [("10.1.0.1", 80), ("224.0.0.1", -1)], 0, "port -1 is out of range"),
    ((5, 6, "10.0.0.1", 80), [("fe80::1", 80), ("10.1.0.1", True)], 1, "port True is out"),
]


@pytest.mark.parametrize(("key", "servers", "weight", "message"), BAD_SERVERS)
def test_servers_refuses_what_server_refuses_and_encodes_nothing(
    twin: ModuleType, key: tuple[Any, ...], servers: list[Any], weight: int, message: str
) -> None:
    requests = twin.Requests(FAMILY, 1)
    requests.service(1, 6, "10.0.0.1", 80, "rr", 0)
    before = requests.chunks(1 << 20)
    with pytest.raises(twin.CodecError) as raised:
        requests.servers(*key, servers, weight)
    assert message in str(raised.value)
    assert len(requests) == 1 and requests.chunks(1 << 20) == before
    assert requests.server(5, 6, "10.0.0.1", 80, "10.1.0.1", 80, 1) == 2  # numbering goes on
    with pytest.raises(twin.CodecError) as single:
        for server in servers:
            twin.Requests(FAMILY, 1).server(*key, *server, weight)
    assert str(single.value) == str(raised.value)


@pytest.mark.parametrize("item", [("10.1.0.1",), ("10.1.0.1", 80, 1), 5, "ab", None])
def test_the_twins_unpack_a_run_of_servers_alike(compiled: ModuleType, item: Any) -> None:
    """A real server that is not an (address, port) pair raises CPython's unpacking error
    in either twin; nothing is encoded."""
    errors = []
    for module in (_pycodec, compiled):
        requests = module.Requests(FAMILY, 1)
        with pytest.raises((TypeError, ValueError, module.CodecError)) as raised:
            requests.servers(5, 6, "10.0.0.1", 80, [("10.1.0.1", 80), item], 1)
        errors.append((type(raised.value), str(raised.value)))
        assert len(requests) == 0
    assert errors[0] == errors[1]


def test_servers_stops_where_sequence_numbers_run_out(twin: ModuleType) -> None:
    requests = twin.Requests(FAMILY, 0xFFFFFFFE)
    servers = [("10.1.0.1", 80), ("224.0.0.1", 80), ("10.1.0.2", 80), ("10.1.0.3", 80)]
    with pytest.raises(twin.CodecError, match="sequence numbers exhausted"):
        requests.servers(5, 6, "10.0.0.1", 80, servers, 1)
    assert len(requests) == 0
    assert requests.servers(5, 6, "10.0.0.1", 80, servers[:3], 1) == (0xFFFFFFFE, [servers[1]])
    assert requests.servers(5, 6, "10.0.0.1", 80, [], 1) == (1 << 32, [])
    assert len(requests) == 2


def test_what_the_kernel_ignores_is_not_checked_and_a_scope_is_dropped(twin: ModuleType) -> None:
    requests = twin.Requests(FAMILY, 1)
    requests.service(3, 6, "10.0.0.1", 80, None, -5)  # a deletion names the service alone
    requests.server(7, 6, "10.0.0.1", 80, "10.1.0.1", 8080, -5)
    requests.server(5, 6, "fd00::1", 80, "fe80::1%eth0", 8080, 1)
    [(data, _)] = requests.chunks(1 << 20)
    _, attrs = _decoded(_messages(data)[2])
    assert attrs["IPVS_CMD_ATTR_DEST"]["IPVS_DEST_ATTR_ADDR"] == "fe80::1"


def test_the_twins_build_the_same_dump_requests(compiled: ModuleType) -> None:
    rng = random.Random(5)
    for _ in range(200):
        family, sequence = rng.randrange(0x10, 0xFFFF), rng.getrandbits(32)
        assert _pycodec.services_request(family, sequence) == compiled.services_request(
            family, sequence
        )
        version = rng.choice([4, 6])
        key = (rng.choice(PROTOCOLS), random_address(rng, version), _port(rng))
        made = _pycodec.servers_request(family, sequence, *key)
        assert made == compiled.servers_request(family, sequence, *key)
        cmd, attrs = _decoded(made)
        assert cmd == 8 and NLMSG.unpack_from(made)[2] == 0x301  # GET_DEST; REQUEST | DUMP
        service = attrs["IPVS_CMD_ATTR_SERVICE"]
        assert (service["IPVS_SVC_ATTR_PROTOCOL"], service["IPVS_SVC_ATTR_PORT"]) == (
            key[0],
            key[2],
        )


# --- Dumps, made as the kernel makes them ------------------------------------------------------


def _nla(kind: int, payload: bytes) -> bytes:
    return struct.pack("=HH", 4 + len(payload), kind) + payload + b"\0" * (-len(payload) % 4)


def _stats(rng: random.Random, wide: bool) -> bytes:
    fmt = "=Q" if wide else "=I"
    return b"".join(_nla(k, struct.pack(fmt, rng.getrandbits(32))) for k in range(1, 11))


def _message(command: int, nest_type: int, attrs: bytes, sequence: int = 9) -> bytes:
    body = struct.pack("=BBH", command, 1, 0) + _nla(nest_type | 0x8000, attrs)
    return NLMSG.pack(16 + len(body), FAMILY, 0x2, sequence, 0) + body


def _inet(address: str) -> bytes:
    return ipaddress.ip_address(address).packed.ljust(16, b"\0")  # union nf_inet_addr


def _service_answer(rng: random.Random) -> tuple[bytes, tuple[int, str, int, int, str, int, int]]:
    """One NEW_SERVICE message as ip_vs_genl_fill_service writes it, and its values."""
    version = rng.choice([4, 6])
    af = socket.AF_INET if version == 4 else socket.AF_INET6
    attrs = _nla(1, struct.pack("=H", af))
    if rng.random() < 0.1:  # a fwmark service
        fwmark = rng.randrange(1, 1 << 32)
        protocol, address, port = 0, "", 0
        attrs += _nla(5, struct.pack("=I", fwmark))
    else:
        fwmark, protocol, address, port = 0, rng.choice(PROTOCOLS), random_address(rng, version), 0
        port = _port(rng)
        attrs += _nla(2, struct.pack("=H", protocol)) + _nla(3, _inet(address))
        attrs += _nla(4, struct.pack(">H", port))
    scheduler = rng.choice(SCHEDULERS)
    flags = rng.choice([0x2, 0x3, 0x2 | 0x4, 0x1 | 0x2 | 0x8])  # HASHED, PERSISTENT, ...
    timeout = rng.choice([0, 10800, rng.getrandbits(32)])
    attrs += _nla(6, scheduler.encode() + b"\0")
    if rng.random() < 0.2:
        attrs += _nla(11, b"sip\0")  # a persistence engine
    attrs += _nla(7, struct.pack("=II", flags, 0xFFFFFFFF))
    attrs += _nla(8, struct.pack("=I", timeout))
    attrs += _nla(9, struct.pack("=I", 0xFFFFFFFF if version == 4 else 128))
    attrs += _nla(10 | 0x8000, _stats(rng, False)) + _nla(12 | 0x8000, _stats(rng, True))
    return _message(1, 1, attrs), (protocol, address, port, fwmark, scheduler, flags, timeout)


def _server_answer(
    rng: random.Random, version: int
) -> tuple[bytes, tuple[str, int, int, int, int, int]]:
    """One NEW_DEST message as ip_vs_genl_fill_dest writes it (new kernels name the real
    server's family, old ones do not), and its values."""
    address, port = random_address(rng, version), _port(rng)
    forward = rng.choice([0, 0, 2, 3])
    weight, active, inactive = (rng.choice([0, 1, rng.getrandbits(31)]) for _ in "abc")
    attrs = _nla(1, _inet(address)) + _nla(2, struct.pack(">H", port))
    attrs += b"".join(
        _nla(k, struct.pack("=I", v))
        for k, v in ((3, forward), (4, weight), (5, 0), (6, 0), (7, active), (8, inactive), (9, 0))
    )
    attrs += _nla(10 | 0x8000, _stats(rng, False))
    if rng.random() < 0.7:
        af = socket.AF_INET if version == 4 else socket.AF_INET6
        attrs += _nla(11, struct.pack("=H", af)) + _nla(12 | 0x8000, _stats(rng, True))
        attrs += _nla(13, b"\0") + _nla(14, b"\0\0") + _nla(15, b"\0\0")
    return _message(5, 2, attrs), (address, port, forward, weight, active, inactive)


DONE = NLMSG.pack(20, 3, 0x2, 9, 0) + b"\0\0\0\0"


def _receives(rng: random.Random, messages: list[bytes]) -> list[bytes]:
    """The messages and the dump's end, as several `recv`s return them (whole messages)."""
    out: list[bytes] = []
    for message in [*messages, DONE]:
        if not out or rng.random() < 0.1:
            out.append(b"")
        out[-1] += message
    return out


def _parse(parser: Any, receives: list[bytes]) -> list[Any]:
    for index, data in enumerate(receives):
        assert parser.feed(data) == (index == len(receives) - 1)
    assert parser.done
    result: list[Any] = parser.result()
    return result


@pytest.mark.parametrize("seed", range(8))
def test_a_service_dump_reads_back_as_what_it_was_made_of(twin: ModuleType, seed: int) -> None:
    rng = random.Random(seed)
    made = [_service_answer(rng) for _ in range(rng.choice([0, 1, 50, 700]))]
    receives = _receives(rng, [m for m, _ in made])
    assert _parse(twin.ServiceDump(), receives) == [values for _, values in made]


@pytest.mark.parametrize("seed", range(8))
def test_a_server_dump_reads_back_as_what_it_was_made_of(twin: ModuleType, seed: int) -> None:
    rng = random.Random(seed)
    version = rng.choice([4, 6])
    made = [_server_answer(rng, version) for _ in range(rng.choice([0, 1, 10, 500]))]
    receives = _receives(rng, [m for m, _ in made])
    assert _parse(twin.ServerDump(version), receives) == [values for _, values in made]


@pytest.mark.parametrize("seed", range(6))
def test_the_twins_parse_the_same_values(compiled: ModuleType, seed: int) -> None:
    rng = random.Random(100 + seed)
    services = _receives(rng, [_service_answer(rng)[0] for _ in range(300)])
    assert _parse(_pycodec.ServiceDump(), services) == _parse(compiled.ServiceDump(), services)
    version = rng.choice([4, 6])
    servers = _receives(rng, [_server_answer(rng, version)[0] for _ in range(300)])
    pure = _parse(_pycodec.ServerDump(version), servers)
    assert pure == _parse(compiled.ServerDump(version), servers)


def _corrupt(rng: random.Random) -> bytes:
    """A dump answer with one thing wrong (or, now and then, nothing)."""
    made = _service_answer(rng) if rng.random() < 0.5 else _server_answer(rng, 4)
    message = bytearray(made[0])
    roll = rng.randrange(6)
    if roll == 0:  # a message length past the data, or below a header
        struct.pack_into("=I", message, 0, rng.choice([len(message) + 4, 8]))
    elif roll == 1:  # some attribute's length changed
        at = rng.randrange(24, len(message) - 4) & ~3
        struct.pack_into("=H", message, at, rng.randrange(0, 64))
    elif roll == 2:  # a byte anywhere after the header
        message[rng.randrange(16, len(message))] = rng.getrandbits(8)
    elif roll == 3:  # cut short (the header's length kept consistent)
        message = message[: rng.randrange(20, len(message))]
        struct.pack_into("=I", message, 0, len(message))
    elif roll == 4:  # an error answer
        code = -rng.choice([1, 2, 22, 0])
        return NLMSG.pack(36, 2, 0, 9, 0) + struct.pack("=i", code) + bytes(16)
    return bytes(message)


def _outcome(parser: Any, data: bytes) -> Any:
    try:
        parser.feed(data)
        return ("parsed", parser.result(), parser.done)
    except Exception as exc:  # the twins must fail alike: type, errno and message
        return (type(exc).__name__, getattr(exc, "errno", None), str(exc))


def test_the_twins_fail_alike_on_malformed_answers(compiled: ModuleType) -> None:
    rng = random.Random(7)
    seen = set()
    for _ in range(3000):
        data = _corrupt(rng)
        for make in (lambda m: m.ServiceDump(), lambda m: m.ServerDump(4)):
            pure, fast = _outcome(make(_pycodec), data), _outcome(make(compiled), data)
            assert pure == fast, data.hex()
            seen.add(pure[0])
    assert {"parsed", "CodecError", "OSError"} <= seen


def test_a_refused_dump_raises_its_errno(twin: ModuleType) -> None:
    refused = NLMSG.pack(36, 2, 0, 9, 0) + struct.pack("=i", -errno.EPERM) + bytes(16)
    with pytest.raises(OSError) as raised:
        twin.ServiceDump().feed(refused)
    assert raised.value.errno == errno.EPERM


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda m: m.Requests(-1, 1), "family -1 is out of range"),
        (lambda m: m.Requests(FAMILY, 1 << 32), "sequence 4294967296 is out of range"),
        (lambda m: m.Requests(FAMILY, 1).chunks(-1), "limit -1 is out of range"),
        (lambda m: m.ServerDump(5), "IP version 5 is neither 4 nor 6"),
        (lambda m: m.servers_request(FAMILY, 1, 6, "x", 80), "does not appear to be an IPv4"),
        (lambda m: m.services_request(1 << 16, 1), "family 65536 is out of range"),
    ],
)
def test_the_twins_check_their_arguments_alike(
    compiled: ModuleType, make: Callable[[ModuleType], Any], message: str
) -> None:
    errors = []
    for module in (_pycodec, compiled):
        with pytest.raises(module.CodecError) as raised:
            make(module)
        errors.append(str(raised.value))
    assert errors[0] == errors[1] and message in errors[0]


def test_sequence_numbers_run_out_at_32_bits(twin: ModuleType) -> None:
    requests = twin.Requests(FAMILY, 0xFFFFFFFF)
    assert requests.service(1, 6, "10.0.0.1", 80, "rr", 0) == 0xFFFFFFFF
    with pytest.raises(twin.CodecError, match="sequence numbers exhausted"):
        requests.service(1, 6, "10.0.0.2", 80, "rr", 0)
    assert len(requests) == 1


def test_the_twins_raise_one_codec_error(compiled: ModuleType) -> None:
    """One class, the pure twin's, raised from C and from the pure code the compiled twin
    calls alike: a caller catching `codec.CodecError` catches what either twin raises."""
    assert compiled.CodecError is _pycodec.CodecError
    with pytest.raises(_pycodec.CodecError, match="is not a virtual-service command"):
        compiled.Requests(FAMILY, 1).service(5, 6, "10.0.0.1", 80, "rr", 0)
    with pytest.raises(_pycodec.CodecError, match="port -1 is out of range"):
        compiled.Requests(FAMILY, 1).service(1, 6, "10.0.0.1", -1, "rr", 0)
