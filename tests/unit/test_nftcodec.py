"""The nf_tables element codec's twins, side by side.

The pure twin (`_pycodec`) has been checked against the kernel for every layout; the
compiled twin (`_ccodec`, ext/nftcodec.pyx) is held to it here: the same batch bytes for the
same elements, the same text for the same dump, the same errors, over seeded random elements
of every container's layout. The round trips (elements -> batch -> dump -> elements) run for
each twin on its own; the comparisons are skipped where the compiled twin is not built.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import random
import struct
from collections import Counter
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from lace_proxy.dataplane.nftables import _pycodec, codec, shared
from lace_proxy.dataplane.nftables._pycodec import (
    ADDR4,
    ADDR6,
    MARK,
    PORT,
    PROTO,
    VERDICT,
)
from testkit.nftdump import batch_messages, dump_answers

from .codeckit import codec_fixtures, random_address

CONTAINERS = [
    *sorted(codec._BY_NAME),
    "reach-abcdefgh-v4",
    "reach-abcdefgh-v6",
    "reach-nodeports-abcdefgh-v4",
    "reach-nodeports-abcdefgh-v6",
    *(f"{m}-{n}-v{f}" for m in shared.COUNTED.values() for n in (0, 16) for f in (4, 6)),
    *(f"{m}-count-3-v{f}" for m in shared.COUNTED.values() for f in (4, 6)),
    "affinity-timeout-10800-v4",
]
NLMSG = struct.Struct("=IHHII")
NLA = struct.Struct("=HH")
HEAD = NLMSG.size + 4  # nlmsghdr + nfgenmsg


def _layout(container: str) -> codec.Layout:
    found = codec.layout(container)
    assert found is not None, container
    return found


compiled, twin = codec_fixtures("lace_proxy.dataplane.nftables._ccodec", _pycodec)


# --- Random elements, in the text the parser writes back --------------------------------------


def _token(rng: random.Random, code: int) -> str:
    if code in (ADDR4, ADDR6):
        return random_address(rng, 4 if code == ADDR4 else 6)
    if code == PROTO:
        number = rng.choice([6, 17, 132, rng.randrange(256)])
        return {6: "tcp", 17: "udp", 132: "sctp"}.get(number, str(number))
    if code == PORT:
        return str(rng.choice([0, 65535, rng.randrange(65536)]))
    if code == MARK:
        return f"{rng.getrandbits(32):#010x}"
    raise AssertionError(code)


def _verdict(rng: random.Random) -> str:
    roll = rng.randrange(6)
    if roll < 2:
        return f"{('goto', 'jump')[roll]} chain-{rng.getrandbits(24):x}"
    return ("drop", "accept", "continue", "return")[roll - 2]


def _span(rng: random.Random, code: int, low: int, high: int) -> str:
    """An address, a prefix or a range within [low, high] (an address family's integers)."""
    cls: Any = ipaddress.IPv4Address if code == ADDR4 else ipaddress.IPv6Address
    kind = rng.randrange(3)
    if kind == 0 or low == high:
        return str(cls(rng.randint(low, high)))
    if kind == 1:  # the largest aligned block in the span, or a smaller one
        size = high - low + 1
        bits = rng.randint(0, size.bit_length() - 1)
        start = -(-low // (1 << bits)) * (1 << bits)
        while start + (1 << bits) - 1 > high:
            bits -= 1
            start = -(-low // (1 << bits)) * (1 << bits)
        width = 32 if code == ADDR4 else 128
        return f"{cls(start)}/{width - bits}"
    first = rng.randint(low, high)
    return f"{cls(first)}-{cls(rng.randint(first, high))}"


def elements(container: str, count: int, seed: int) -> list[str]:
    """`count` random elements of a container, in the text a dump of them reads back as."""
    rng = random.Random(f"{seed}-{container}")
    layout = _layout(container)
    one_field_interval = layout.interval and len(layout.key) == 1
    width = 32 if ADDR4 in layout.key else 128
    slot = (1 << width) // count  # a one-field interval set's elements must not overlap
    out = []
    for index in range(count):
        if one_field_interval:
            low, high = index * slot, (index + 1) * slot - 1
            if index == count - 1:
                high = (1 << width) - 1  # the last runs to the last address
            tokens = [_span(rng, layout.key[0], low, high)]
        else:
            tokens = [_token(rng, code) for code in layout.key]
            if layout.interval:  # a concatenation: its last field a network
                tokens[-1] = _span(rng, layout.key[-1], 0, (1 << width) - 1)
        text = " . ".join(tokens)
        if layout.data == (VERDICT,):
            text += f" : {_verdict(rng)}"
        elif layout.data:
            text += " : " + " . ".join(_token(rng, code) for code in layout.data)
        out.append(text)
    if one_field_interval:
        rng.shuffle(out)
    return out


def meaning(layout: codec.Layout, text: str) -> tuple[tuple[object, ...], str]:
    """An element as what it holds: each address field as its first and last address."""
    key_text, _, data_text = text.partition(" : ")
    fields: list[object] = []
    for code, token in zip(layout.key, key_text.split(" . "), strict=True):
        if code not in (ADDR4, ADDR6):
            fields.append(token)
            continue
        first, sep, last = token.partition("-")
        if sep:
            fields.append((int(ipaddress.ip_address(first)), int(ipaddress.ip_address(last))))
        elif "/" in token:
            net = ipaddress.ip_network(token)
            fields.append((int(net.network_address), int(net.broadcast_address)))
        else:
            fields.append((int(ipaddress.ip_address(token)),) * 2)
    return tuple(fields), data_text


def encode(module: ModuleType, container: str, items: list[str], delete: bool = False) -> Any:
    layout = _layout(container)
    batch = module.Batch("lace-proxy", 1000)
    batch.elements(delete, container, layout.key, layout.data, layout.interval, items)
    return batch


def parse(module: ModuleType, container: str, answers: list[bytes]) -> list[str]:
    layout = _layout(container)
    parser = module.DumpParser(layout.key, layout.data, layout.interval)
    for index, answer in enumerate(answers):
        assert parser.feed(answer) is (index == len(answers) - 1)
    assert parser.done is True
    return list(parser.result())


def _outcome(call: Callable[..., object], *args: object) -> tuple[str, object]:
    """What a call returned, or the type, errno and text of what it raised."""
    try:
        return "ok", call(*args)
    except Exception as error:  # the twins must agree on any error, whatever its type
        return type(error).__name__, (getattr(error, "errno", None), str(error))


def _encoded(module: ModuleType, container: str, items: list[str], delete: bool) -> object:
    """The outcome of encoding these elements into a batch of their own."""
    return _outcome(lambda: encode(module, container, items, delete).finish())


def _parsed(module: ModuleType, layout: codec.Layout, data: object) -> tuple[Any, Any]:
    """The outcomes of feeding one `recv` to a new parser, and of its result then."""
    parser = module.DumpParser(layout.key, layout.data, layout.interval)
    return _outcome(parser.feed, data), _outcome(parser.result)


# --- Encoding ----------------------------------------------------------------------------------


def test_every_container_has_a_layout() -> None:
    assert len(CONTAINERS) > 50
    layouts = {_layout(c) for c in CONTAINERS}
    assert any(lay.interval and len(lay.key) == 1 and lay.data for lay in layouts)
    assert any(lay.interval and len(lay.key) > 1 for lay in layouts)
    assert {code for lay in layouts for code in (*lay.key, *lay.data)} == set(range(6))


@pytest.mark.parametrize("delete", [False, True], ids=["add", "delete"])
@pytest.mark.parametrize("container", CONTAINERS)
def test_batches_are_equal(compiled: ModuleType, container: str, delete: bool) -> None:
    items = elements(container, 120, seed=1)
    pure, fast = (
        encode(_pycodec, container, items, delete),
        encode(compiled, container, items, delete),
    )
    assert fast.finish() == pure.finish()
    assert len(fast) == len(pure) == 1
    assert fast.last_request == pure.last_request == 1001


def test_batches_of_several_calls_are_equal(compiled: ModuleType) -> None:
    batches = [_pycodec.Batch("lace-proxy", 7), compiled.Batch("lace-proxy", 7)]
    for batch in batches:
        for number, container in enumerate(CONTAINERS):
            layout = _layout(container)
            batch.elements(
                number % 3 == 0,
                container,
                layout.key,
                layout.data,
                layout.interval,
                elements(container, 40, seed=2),
            )
    pure, fast = batches
    assert len(fast) == len(pure) == len(CONTAINERS)
    assert fast.finish() == pure.finish()
    assert fast.last_request == pure.last_request == 7 + len(CONTAINERS)


@pytest.mark.parametrize(
    ("container", "element"),
    [
        ("endpoints-0-v4", "10.96.0.1 . 6 . 0x50 : 10.128.0.5 . 0x1F90"),
        ("endpoints-0-v4", "10.96.0.1 . TCP . 80 : 10.128.0.5 . 8080"),
        ("endpoints-0-v4", "10.96.0.1 . tcp . +80 : 10.128.0.5 . 0o17"),
        ("endpoints-0-v4", "10.96.0.1 . tcp .  80 : 10.128.0.5 . 8080 "),
        ("endpoints-0-v4", "10.96.0.1 . tcp . 80 : 10.128.0.5 . 8080 : extra"),
        ("endpoints-0-v6", "FD00::1 . udp . 53 : ::FFFF:10.0.0.1 . 53"),
        ("endpoints-0-v6", "fd00:0:0:0:0:0:0:1 . udp . 53 : fe80::1%eth0 . 53"),
        ("cluster-ips-v4", "10.0.0.0/8"),
        ("cluster-ips-v4", "10.0.0.9-10.0.0.1"),
        ("cluster-ips-v6", "1:2:3:4:5:6:7::"),
        ("cluster-ips-v6", "::1.2.3.4"),
        ("cluster-ips-v4", "10.0.0.1 : ignored by a set"),
        ("service-ips-v4", "10.0.0.1 . tcp . 80 : drop "),
        ("service-ips-v4", "10.0.0.1 . tcp . 80 : goto a chain with spaces"),
        ("service-ips-v4", "10.0.0.1 . tcp . 80 : jump " + "c" * 300),
        ("affinity-ids-v4", "10.0.0.1 . tcp . 80 : 0XABCDEF01"),
        ("affinity-ids-v4", "10.0.0.1 . tcp . 80 : 0x00000000000001"),
        ("affinity-timeout-10800-v4", "4294967295"),
        ("service-nodeports-v4", "tcp . 80 : jump arec-v4"),
        ("service-ports-v4", "10.0.0.1 . tcp . 80 \N{NO-BREAK SPACE}"),
        ("service-ports-v4", "10.0.0.1 . tcp . \N{ARABIC-INDIC DIGIT EIGHT}0"),
        ("service-ports-v4", "10.0.0.1 . tcp . 80 . "),
    ],
)
def test_text_off_the_common_form_is_read_alike(
    compiled: ModuleType, container: str, element: str
) -> None:
    """Text the renderer does not write, valid or not: the compiled twin's own reading stands
    aside and the outcome is the pure twin's."""
    for delete in (False, True):
        pure = _encoded(_pycodec, container, [element], delete)
        assert _encoded(compiled, container, [element], delete) == pure


def _mutate(rng: random.Random, text: str) -> str:
    alphabet = "0123456789abcdefxX.:/- \t%g\0"
    chars = list(text)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(chars) + 1)
        roll = rng.randrange(3)
        if roll == 0:
            chars.insert(at, rng.choice(alphabet))
        elif chars and at < len(chars):
            if roll == 1:
                del chars[at]
            else:
                chars[at] = rng.choice(alphabet)
    return "".join(chars)


def test_mutated_elements_encode_or_fail_alike(compiled: ModuleType) -> None:
    rng = random.Random(3)
    outcomes: Counter[str] = Counter()
    for container in CONTAINERS:
        for text in elements(container, 40, seed=3):
            mutated = _mutate(rng, text)
            results = [_encoded(m, container, [mutated], False) for m in (_pycodec, compiled)]
            assert results[1] == results[0], (container, mutated)
            outcomes[results[0][0]] += 1
    # Both kinds of outcome were met, and every failure is the codec's own error.
    assert set(outcomes) == {"ok", "CodecError"}, outcomes
    assert min(outcomes.values()) > 200


BAD = [
    ("endpoints-0-v4", "10.96.0.1 . tcp : 10.128.0.5 . 8080", "has 2 fields, not 3"),
    ("endpoints-0-v4", "10.96.0.1 . tcp . 80 . 0 : 10.128.0.5 . 8080", "has 4 fields, not 3"),
    ("endpoints-0-v4", "10.96.0.1 . tcp . 80 : 10.128.0.5", "has 1 fields, not 2"),
    ("endpoints-0-v4", "10.96.0.1 . tcp . 80", "has no data"),
    ("endpoints-0-v4", "10.96.0.300 . tcp . 80 : 10.128.0.5 . 8080", "does not appear"),
    ("endpoints-0-v4", "fd00::1 . tcp . 80 : 10.128.0.5 . 8080", "is not an IPv4 address"),
    ("endpoints-0-v6", "10.0.0.1 . tcp . 80 : fd00::5 . 8080", "is not an IPv6 address"),
    ("endpoints-0-v6", "fd00::1::2 . tcp . 80 : fd00::5 . 8080", "does not appear"),
    ("endpoints-0-v4", "10.96.0.1 . tcp . 65536 : 10.128.0.5 . 8080", "out of range"),
    ("endpoints-0-v4", "10.96.0.1 . tcp . -1 : 10.128.0.5 . 8080", "out of range"),
    ("endpoints-0-v4", "10.96.0.1 . tcpx . 80 : 10.128.0.5 . 8080", "is not a number"),
    ("endpoints-0-v4", "10.96.0.1 . 256 . 80 : 10.128.0.5 . 8080", "out of range"),
    ("endpoints-0-v4", "10.96.0.1 . tcp . 080 : 10.128.0.5 . 8080", "is not a number"),
    ("endpoints-0-v4", "10.96.0.1 . tcp . 80 : 10.128.0.5 . http", "is not a number"),
    ("service-ips-v4", "10.0.0.1 . tcp . 80 : goto", "is not a verdict"),
    ("service-ips-v4", "10.0.0.1 . tcp . 80 : goto ", "is not a verdict"),
    ("service-ips-v4", "10.0.0.1 . tcp . 80 : drop it", "is not a verdict"),
    ("service-ips-v4", "10.0.0.1 . tcp . 80 : reject", "is not a verdict"),
    ("service-ips-v4", "10.0.0.1 . tcp . 80", "has no data"),
    ("affinity-ids-v4", "10.0.0.1 . tcp . 80 : 0x1ffffffff", "out of range"),
    ("affinity-ids-v4", "10.0.0.1 . tcp . 80 : 0x", "is not a number"),
    ("cluster-cidrs-v4", "10.0.0.0/33", "does not appear"),
    ("cluster-cidrs-v4", "10.0.0.1-fd00::1", "is not an IPv4 address"),
    ("cluster-cidrs-v6", "fd00::/64-", "does not appear"),
    ("firewall-allow-v4", "10.0.0.1 . tcp . 80 . 10.0.0.0/40", "does not appear"),
    ("source-networks-v4", "10.0.0.0/8 : jump", "is not a verdict"),
    ("cluster-ips-v4", "", "does not appear"),
    ("cluster-ips-v4", "10.0.0.1\0", "does not appear"),
    ("cluster-ips-v6", "fd00::1\0junk", "does not appear"),
    # Both bad: the data's error is the one raised.
    ("endpoints-0-v4", "10.96.0.300 . tcp . 80 : 10.128.0.5 . http", "'http' is not a number"),
]


@pytest.mark.parametrize(("container", "element", "message"), BAD)
def test_bad_elements_raise_the_codec_error(
    twin: ModuleType, container: str, element: str, message: str
) -> None:
    layout = _layout(container)
    batch = twin.Batch("t", 1)
    with pytest.raises(twin.CodecError, match=message):
        batch.elements(False, container, layout.key, layout.data, layout.interval, [element])
    assert issubclass(twin.CodecError, ValueError)


@pytest.mark.parametrize(("container", "element", "message"), BAD)
def test_bad_elements_fail_alike(
    compiled: ModuleType, container: str, element: str, message: str
) -> None:
    for delete in (False, True):
        pure = _encoded(_pycodec, container, [element], delete)
        assert _encoded(compiled, container, [element], delete) == pure


@pytest.mark.parametrize(
    ("key", "data", "element", "message"),
    [
        ((ADDR4, VERDICT), (), "10.0.0.1 . drop", "unknown field code 5"),
        ((ADDR4,), (PORT, VERDICT), "10.0.0.1 : 80 . drop", "unknown field code 5"),
        ((9,), (), "1", "unknown field code 9"),
        ((), (), "10.0.0.1", "has 1 fields, not 0"),
    ],
)
def test_unknown_field_codes_fail_alike(
    compiled: ModuleType, key: tuple[int, ...], data: tuple[int, ...], element: str, message: str
) -> None:
    results = []
    for module in (_pycodec, compiled):
        batch = module.Batch("t", 1)
        with pytest.raises(module.CodecError, match=message) as raised:
            batch.elements(False, "s", key, data, False, [element])
        results.append(str(raised.value))
    assert results[1] == results[0]


def test_a_bad_element_drops_the_message_being_filled(compiled: ModuleType) -> None:
    """Messages already full stay in the batch; the one being filled goes with the error."""
    good = elements("endpoints-0-v4", 6000, seed=4)
    bad = [*good, "10.96.0.1 . tcp . 80 : nowhere . 1", *good]
    states = []
    for module in (_pycodec, compiled):
        batch = module.Batch("t", 1)
        with pytest.raises(module.CodecError):
            encode_into(batch, "endpoints-0-v4", bad)
        full = len(batch)
        encode_into(batch, "endpoints-0-v4", good[:5])
        states.append((full, len(batch), batch.finish(), batch.last_request))
    assert states[0][0] >= 2
    assert states[0][1] == states[0][0] + 1
    assert states[1] == states[0]


def encode_into(batch: Any, container: str, items: list[str]) -> None:
    layout = _layout(container)
    batch.elements(False, container, layout.key, layout.data, layout.interval, items)


def test_an_empty_batch_is_nothing(twin: ModuleType) -> None:
    batch = twin.Batch("t", 5)
    encode_into(batch, "endpoints-0-v4", [])
    assert len(batch) == 0
    assert batch.finish() == b""
    assert batch.last_request == 0
    assert batch.element_at(6, 40) is None
    assert batch.elements_of(6) == []


# --- Splitting and finding an element -------------------------------------------------------


def _list_elems(message: bytes) -> tuple[int, list[int]]:
    """A NEWSETELEM message's ELEMENTS attribute length, and its NFTA_LIST_ELEMs' offsets."""
    at = HEAD
    while at + 4 <= len(message):
        length, kind = NLA.unpack_from(message, at)
        if kind & 0x3FFF == 3:
            offsets = []
            item = at + 4
            while item < at + length:
                offsets.append(item)
                item += (NLA.unpack_from(message, item)[0] + 3) & ~3
            assert item == at + length
            return length, offsets
        at += (length + 3) & ~3
    raise AssertionError("no element list")


@pytest.mark.parametrize(
    ("container", "count", "per_element"),
    [("endpoints-0-v6", 6000, 1), ("service-ips-v4", 8000, 1), ("cluster-cidrs-v4", 7000, 2)],
)
def test_long_element_lists_are_split(
    twin: ModuleType, container: str, count: int, per_element: int
) -> None:
    items = elements(container, count, seed=5)
    batch = encode(twin, container, items)
    messages = batch_messages(batch.finish())
    assert len(messages) == len(batch) >= 3
    assert batch.last_request == 1000 + len(messages)
    owners: list[str] = []  # each NFTA_LIST_ELEM's element, in order
    layout = _layout(container)
    for item in items:
        owners.append(item)
        # a one-field interval: a start, and an end unless it runs to the last address
        if (
            per_element == 2
            and meaning(layout, item)[0][0] != (0, 0)
            and meaning(layout, item)[0][0][1] != (1 << 32) - 1
        ):
            owners.append(item)
    index = 0
    for number, message in enumerate(messages):
        sequence = NLMSG.unpack_from(message)[3]
        assert sequence == 1001 + number
        flags = NLMSG.unpack_from(message)[2]
        assert flags & 0x4 == (
            0x4 if number == len(messages) - 1 else 0
        )  # the last asks for an ack
        length, offsets = _list_elems(message)
        assert length < 65536
        assert length <= _pycodec.ELEMENTS_LIMIT + 4
        assert len(message) == NLMSG.unpack_from(message)[0]
        first = offsets[0]
        assert batch.element_at(sequence, first - 1) is None
        for offset in offsets:
            assert batch.element_at(sequence, offset) == owners[index]
            assert batch.element_at(sequence, offset + 7) == owners[index]
            index += 1
        assert batch.element_at(sequence, 1 << 40) == owners[index - 1]
        assert batch.elements_of(sequence) == list(
            dict.fromkeys(owners[index - len(offsets) : index])
        )
    assert index == len(owners)
    assert batch.element_at(1000, 100) is None  # the batch's begin holds no element
    assert batch.elements_of(1000 + len(messages) + 1) == []


def test_finding_elements_agrees(compiled: ModuleType) -> None:
    items = elements("cluster-cidrs-v6", 5000, seed=6)
    pure, fast = (
        encode(_pycodec, "cluster-cidrs-v6", items),
        encode(compiled, "cluster-cidrs-v6", items),
    )
    rng = random.Random(6)
    for _ in range(2000):
        sequence = rng.randint(999, 1002 + len(pure))
        offset = rng.choice([rng.randint(-5, 70000), rng.random() * 70000, 1 << 70])
        assert fast.element_at(sequence, offset) == pure.element_at(sequence, offset)
    for sequence in range(999, 1002 + len(pure)):
        assert fast.elements_of(sequence) == pure.elements_of(sequence)


def test_element_at_names_the_elements_given_not_later_changes(twin: ModuleType) -> None:
    items = ["10.0.0.1", "10.0.0.2"]
    batch = encode(twin, "cluster-ips-v4", items)
    items[1] = "changed"
    _, offsets = _list_elems(batch_messages(batch.finish())[0])
    assert batch.element_at(1001, offsets[1]) == "10.0.0.2"


# --- Parsing -----------------------------------------------------------------------------------


@pytest.mark.parametrize("container", CONTAINERS)
def test_dumps_read_back_the_elements(twin: ModuleType, container: str) -> None:
    layout = _layout(container)
    items = elements(container, 150, seed=7)
    answers = dump_answers(encode(_pycodec, container, items).finish(), chunk=1024, per_message=7)
    assert len(answers) >= 3
    parsed = parse(twin, container, answers)
    if layout.interval:
        assert Counter(meaning(layout, p) for p in parsed) == Counter(
            meaning(layout, i) for i in items
        )
    else:
        assert parsed == items


@pytest.mark.parametrize("container", CONTAINERS)
def test_dumps_are_read_alike(compiled: ModuleType, container: str) -> None:
    items = elements(container, 300, seed=8)
    answers = dump_answers(encode(compiled, container, items).finish(), per_message=50)
    assert parse(compiled, container, answers) == parse(_pycodec, container, answers)


def _dump(container: str, elements: list[bytes]) -> bytes:
    """One dump answer holding these NFTA_LIST_ELEM payloads, then NLMSG_DONE."""
    body = _pycodec._string(1, "t") + _pycodec._string(2, container)
    body += _pycodec._nested(3, b"".join(_pycodec._nested(1, e) for e in elements))
    message = NLMSG.pack(HEAD + len(body), (10 << 8) | 12, 2, 1, 0) + b"\1\0\0\0" + body
    return message + NLMSG.pack(20, 3, 2, 1, 0) + b"\0" * 4


def _key(raw: bytes, kind: int = 1) -> bytes:
    return _pycodec._nested(kind, _pycodec._attr(1, raw))


def _verdict_data(code: int, chain: bytes | None = None) -> bytes:
    body = _pycodec._attr(1, struct.pack(">i", code))
    if chain is not None:
        body += _pycodec._attr(2, chain)
    return _pycodec._nested(2, _pycodec._nested(2, body))


ODD_ELEMENTS = [
    ("service-ips-v4", _key(bytes(12)) + _verdict_data(7)),
    ("service-ips-v4", _key(bytes(12)) + _verdict_data(-(2**31))),
    ("service-ips-v4", _key(bytes(12)) + _verdict_data(-3)),
    ("service-ips-v4", _key(bytes(12)) + _verdict_data(-4, b"svc\0\0\0")),
    ("service-ips-v4", _key(bytes(12)) + _verdict_data(-4, b"caf\xc3\xa9\0")),
    ("service-ips-v4", _key(bytes(12)) + _verdict_data(-4, b"\xff\0")),
    ("service-ips-v4", _key(bytes(12)) + _pycodec._nested(2, _pycodec._nested(2, b""))),
    ("service-ips-v4", _key(bytes(12)) + _pycodec._nested(2, b"")),
    ("service-ips-v4", _key(bytes(12))),
    ("service-ips-v4", _key(bytes(12)) + _pycodec._flags(0) + _key(bytes(12), 99)),
    ("endpoints-0-v4", _key(bytes(12))),
    ("endpoints-0-v4", _key(bytes(11)) + _pycodec._nested(2, _pycodec._attr(1, bytes(8)))),
    ("endpoints-0-v4", _key(bytes(12)) + _pycodec._nested(2, _pycodec._attr(1, bytes(6)))),
    (
        "endpoints-0-v4",
        _key(bytes(12) + b"extra") + _pycodec._nested(2, _pycodec._attr(1, bytes(9))),
    ),
    ("endpoints-0-v4", _pycodec._nested(2, _pycodec._attr(1, bytes(8)))),
    ("endpoints-0-v4", _pycodec._nested(1, b"") + _pycodec._nested(2, _pycodec._attr(1, bytes(8)))),
    (
        "endpoints-0-v6",
        _key(bytes(10) + b"\xff\xff" + bytes(12))
        + _pycodec._nested(2, _pycodec._attr(1, bytes(20))),
    ),
    ("cluster-ips-v6", _key(bytes(10) + b"\xff\xff\x7f\0\0\1")),
    ("cluster-ips-v6", _key(bytes(12) + b"\x7f\0\0\1")),
    ("cluster-ips-v4", _key(b"\1\2\3")),
    ("cluster-ips-v4", _pycodec._flags(1)[:6] + b"\0\0" + _key(b"\1\2\3\4")),
    ("affinity-timeout-10800-v4", _key(b"\xff\xff\xff\xff")),
    ("service-nodeports-v4", _key(b"\x06\0\0\0\0\x50\0\0") + _verdict_data(-3, b"arec")),
    ("cluster-cidrs-v4", _key(b"\0\0\0\0") + _pycodec._flags(1)),
    ("cluster-cidrs-v4", _key(b"\x0a\0\0\0")),
    ("source-networks-v4", _key(b"\x0a\0\0\0") + _verdict_data(1)),
]


@pytest.mark.parametrize(("container", "element"), ODD_ELEMENTS)
def test_odd_dump_elements_are_read_alike(
    compiled: ModuleType, container: str, element: bytes
) -> None:
    """Elements the kernel would not write so: the outcome is the pure twin's."""
    layout = _layout(container)
    answer = _dump(container, [element])
    assert _parsed(compiled, layout, answer) == _parsed(_pycodec, layout, answer)


def test_mutated_dumps_are_read_alike(compiled: ModuleType) -> None:
    rng = random.Random(9)
    outcomes: Counter[str] = Counter()
    for container in CONTAINERS:
        layout = _layout(container)
        answer = b"".join(
            dump_answers(encode(_pycodec, container, elements(container, 6, seed=9)).finish())
        )
        for _ in range(25):
            raw = bytearray(answer)
            for _ in range(rng.randint(1, 4)):
                at = rng.randrange(HEAD, len(raw) - 20)
                raw[at] = rng.choice([0, 1, 2, 3, 4, 8, 0x80, 0xFF, rng.randrange(256)])
            data = bytes(raw)
            pure = _parsed(_pycodec, layout, data)
            assert _parsed(compiled, layout, data) == pure, (container, data.hex())
            outcomes[pure[0][0]] += 1
    assert outcomes["ok"] > 100
    assert len(outcomes) > 2  # and some failed, in more than one way


@pytest.mark.parametrize("code", [errno.ENOENT, errno.EPERM])
def test_a_refused_dump_raises_its_errno(twin: ModuleType, code: int) -> None:
    answer = NLMSG.pack(36, 2, 0, 1, 0) + struct.pack("=i", -code) + NLMSG.pack(16, 13, 0, 1, 0)
    parser = twin.DumpParser((ADDR4,), (), False)
    with pytest.raises(OSError) as raised:
        parser.feed(answer)
    assert raised.value.errno == code
    assert str(raised.value) == f"[Errno {code}] set element dump refused: {os.strerror(code)}"


def test_an_acknowledgement_is_not_an_error(twin: ModuleType) -> None:
    answer = NLMSG.pack(36, 2, 0, 1, 0) + bytes(20) + NLMSG.pack(20, 3, 2, 1, 0) + bytes(4)
    parser = twin.DumpParser((ADDR4,), (), False)
    assert parser.feed(answer) is True
    assert parser.result() == []


def test_a_truncated_message_is_a_codec_error(twin: ModuleType) -> None:
    parser = twin.DumpParser((ADDR4,), (), False)
    with pytest.raises(twin.CodecError, match="truncated"):
        parser.feed(NLMSG.pack(12, 0x0A0C, 2, 1, 0))


def test_an_element_without_a_key_is_a_codec_error(twin: ModuleType) -> None:
    parser = twin.DumpParser((ADDR4,), (), False)
    with pytest.raises(twin.CodecError, match="without a key"):
        parser.feed(_dump("cluster-ips-v4", [_pycodec._flags(0)]))


# --- The module's surface ----------------------------------------------------------------------


def test_the_twins_share_their_surface(compiled: ModuleType) -> None:
    names = [
        "ADDR4", "ADDR6", "PROTO", "PORT", "MARK", "VERDICT",
        "Batch", "CodecError", "DumpParser", "dump_request",
    ]  # fmt: skip
    for name in names[:6]:
        assert getattr(compiled, name) == getattr(_pycodec, name), name
    for name in names[6:]:
        assert callable(getattr(compiled, name)), name
    assert compiled.IMPLEMENTATION == "compiled"
    assert _pycodec.IMPLEMENTATION == "pure"
    assert issubclass(compiled.CodecError, ValueError)
    for table, container, sequence in [
        ("lace-proxy", "endpoints-0-v4", 9),
        ("t", "x" * 300, 2**32 - 1),
    ]:
        assert compiled.dump_request(table, container, sequence) == _pycodec.dump_request(
            table, container, sequence
        )
    for module in (_pycodec, compiled):
        with pytest.raises(struct.error):
            module.dump_request("t", "s", 2**32)


def test_the_twins_raise_one_codec_error(compiled: ModuleType) -> None:
    """One class: a caller catching `codec.CodecError` catches what either twin raises."""
    assert compiled.CodecError is _pycodec.CodecError
    assert codec.CodecError is _pycodec.CodecError
    with pytest.raises(_pycodec.CodecError):
        compiled.Batch("t", 1).elements(False, "s", (ADDR4,), (), False, ["10.0.0.1/33"])
    with pytest.raises(_pycodec.CodecError):
        compiled.DumpParser((ADDR4,), (), False).feed(NLMSG.pack(12, 0x0A0C, 2, 1, 0))


def test_codec_picks_a_twin() -> None:
    assert codec.IMPLEMENTATION in ("pure", "compiled")
    assert codec.Batch.__module__.endswith(
        "_pycodec" if codec.IMPLEMENTATION == "pure" else "_ccodec"
    )


@pytest.mark.parametrize(
    ("key", "data", "items"),
    [
        (None, (), []),
        (None, (), ["10.0.0.1"]),
        ((ADDR4,), {VERDICT}, ["10.0.0.1 : drop"]),
        ((ADDR4,), {VERDICT}, []),
        ((ADDR4,), (VERDICT,), 5),
        ((ADDR4,), (VERDICT,), [b"10.0.0.1 : drop"]),
        ([ADDR4, True], [float(VERDICT)], ["10.0.0.1 . 1 : drop"]),
    ],
)
def test_arguments_that_are_no_layout_fail_alike(
    compiled: ModuleType, key: Any, data: Any, items: Any
) -> None:
    results = []
    for module in (_pycodec, compiled):
        batch = module.Batch("t", 1)
        results.append((_outcome(batch.elements, False, "s", key, data, False, items), len(batch)))
    assert results[1] == results[0]
