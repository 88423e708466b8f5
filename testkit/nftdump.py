"""Synthetic NFT_MSG_GETSETELEM dump answers, made from a codec batch's own messages.

A dump answers with NFT_MSG_NEWSETELEM messages laid out as the ones a batch sends (table,
set, then the element list; each element as added, without the flags nft adds itself), so a
batch's messages, marked NLM_F_MULTI, are a dump of the elements it adds. Used by the codec's
tests and its benchmark to feed `DumpParser` without a kernel.
"""

from __future__ import annotations

import struct

from lace_proxy.dataplane.netlink import chunks

NLMSG = struct.Struct("=IHHII")
NLA = struct.Struct("=HH")
NLMSG_DONE = 3
NLM_F_MULTI = 0x2
NLA_F_NESTED = 0x8000
NFNL_MSG_BATCH_BEGIN = 0x10
NFNL_MSG_BATCH_END = 0x11
NFTA_SET_ELEM_LIST_ELEMENTS = 3


def batch_messages(batch: bytes) -> list[bytes]:
    """The messages of a batch, its begin and end left out."""
    out = []
    offset = 0
    while offset + NLMSG.size <= len(batch):
        length, kind, _, _, _ = NLMSG.unpack_from(batch, offset)
        if kind not in (NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END):
            out.append(batch[offset : offset + length])
        offset += (length + 3) & ~3
    return out


def _regroup(message: bytes, per_message: int) -> list[bytes]:
    """A NEWSETELEM message as several, each with at most `per_message` elements."""
    length, kind, flags, sequence, port = NLMSG.unpack_from(message)
    at = NLMSG.size + 4
    while at + 4 <= length:
        size, attr = NLA.unpack_from(message, at)
        if attr & 0x3FFF == NFTA_SET_ELEM_LIST_ELEMENTS:
            break
        at += (size + 3) & ~3
    else:
        return [message]
    head = message[NLMSG.size : at]  # nfgenmsg, table, set
    items = []
    item = at + 4
    while item < at + size:
        item_size = NLA.unpack_from(message, item)[0]
        items.append(message[item : item + ((item_size + 3) & ~3)])
        item += (item_size + 3) & ~3
    out = []
    for first in range(0, len(items), per_message):
        body = b"".join(items[first : first + per_message])
        body = NLA.pack(4 + len(body), NFTA_SET_ELEM_LIST_ELEMENTS | NLA_F_NESTED) + body
        total = NLMSG.size + len(head) + len(body)
        out.append(NLMSG.pack(total, kind, flags, sequence, port) + head + body)
    return out


def dump_answers(
    batch: bytes, sequence: int = 1, chunk: int = 32768, per_message: int | None = None
) -> list[bytes]:
    """The `recv`s of a dump of the elements a batch adds: its messages as dump answers (the
    request's sequence, NLM_F_MULTI; regrouped to at most `per_message` elements each if
    given), as many whole messages per `recv` as fit in `chunk` bytes (at least one), then
    NLMSG_DONE in the last."""
    answers = []
    for message in batch_messages(batch):
        for part in _regroup(message, per_message) if per_message else [message]:
            length, kind, _, _, port = NLMSG.unpack_from(part)
            answers.append(NLMSG.pack(length, kind, NLM_F_MULTI, sequence, port) + part[16:])
    answers.append(NLMSG.pack(20, NLMSG_DONE, NLM_F_MULTI, sequence, 0) + b"\0" * 4)
    return chunks(answers, chunk)
