# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled nf_tables element codec: the same API, bytes and text as _pycodec.py.

tests/unit/test_nftcodec.py holds the twins equal: the same batch bytes for the same
elements, the same text for the same dump, the same errors.

What makes it fast:

- a batch is one growing C buffer: each element is read straight from its str's ASCII
  bytes (fields split on " . " in place, addresses by `inet_pton`, numbers and verdicts by
  hand) and written as its NFTA_LIST_ELEM; only a message's headers are packed in Python
  (one message per about a thousand elements);
- where an element lies is two C arrays (its offset in the message, its index in the
  elements given), resolved into the element only by `element_at`;
- a dump's elements are read in place from the received bytes and written straight into
  one new str each (IPv4 and IPv6 formatted by hand as `ipaddress` writes them).

Anything off the common path is the pure twin's (`_pycodec`, imported, not copied): an
element whose text is not plain ASCII or not in the plain form (a prefix, a range, a number
written otherwise than in decimal or 0x-hex, a malformed field: its code then raises the same
error) is encoded by its `_element_attrs`; a dump of an interval set (or of a layout not
plain, or given other than as bytes) is read by a pure `DumpParser` the compiled one holds,
and so is a message or an element not laid out as the kernel lays it out (the elements of
both parsers go to one list, in order); IPv4-mapped IPv6 addresses are written by
`ipaddress` (their text depends on the Python version). `CodecError` and `dump_request` are
the pure twin's own, so that either twin's errors are caught alike.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.tuple cimport PyTuple_GET_SIZE
from cpython.unicode cimport PyUnicode_1BYTE_DATA, PyUnicode_GET_LENGTH, PyUnicode_New
from libc.stdint cimport int32_t, int64_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

import os
import socket
import struct

cdef extern from "<arpa/inet.h>" nogil:
    uint32_t htonl(uint32_t host)
    uint32_t ntohl(uint32_t net)

cdef extern from "Python.h":
    bint PyUnicode_IS_COMPACT_ASCII(object o)

# The pure twin: its constants, its error, the request, and its code for the slow path.
from lace_proxy.dataplane.nftables._pycodec import (
    ADDR4,
    ADDR6,
    ELEMENTS_LIMIT,
    MARK,
    NFNL_MSG_BATCH_BEGIN,
    NFNL_MSG_BATCH_END,
    NFNL_SUBSYS_NFTABLES,
    NFPROTO_INET,
    NFT_MSG_DELSETELEM,
    NFT_MSG_GETSETELEM,
    NFT_MSG_NEWSETELEM,
    NFT_SET_ELEM_INTERVAL_END,
    NFTA_SET_ELEM_KEY_END,
    NLA_F_NESTED,
    NLA_TYPE_MASK,
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_DUMP,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NLMSG_ERROR,
    PORT,
    PROTO,
    VERDICT,
    CodecError,
    DumpParser as _PureDumpParser,
    _element_attrs,
    _NFGEN,
    _NLA,
    _NLMSG,
    _nested,
    _string,
    dump_request,
)

IMPLEMENTATION = "compiled"

cdef enum:
    C_ADDR4 = 0
    C_ADDR6 = 1
    C_PROTO = 2
    C_PORT = 3
    C_MARK = 4
    C_VERDICT = 5
    MAX_FIELDS = 8
    ITEM_MAX = 2048  # a fast-path NFTA_LIST_ELEM's bytes at most (else the Python path)
    TEXT_MAX = 2048  # a fast-path element's text at most
    CHAIN_MAX = 1024

cdef Py_ssize_t C_ELEMENTS_LIMIT = 0xFFFF - 1024

cdef int[6] C_SIZES = [4, 16, 1, 2, 4, 4]


# --- C helpers -----------------------------------------------------------------------------

include "netaddr.pxi"  # addresses read and written in C: shared with the IPVS codec


cdef inline void _put_nla(unsigned char* p, Py_ssize_t length, int kind) noexcept nogil:
    cdef uint16_t header[2]
    header[0] = <uint16_t>length
    header[1] = <uint16_t>kind
    memcpy(p, header, 4)


cdef inline Py_ssize_t _align4(Py_ssize_t n) noexcept nogil:
    return (n + 3) & ~(<Py_ssize_t>3)


cdef bint _layout_codes(object fields, int* out, int* count):
    """The fields as C codes, if each is a plain int field code (not VERDICT)."""
    cdef Py_ssize_t n, i
    cdef object code
    fields = tuple(fields)
    n = PyTuple_GET_SIZE(fields)
    if n < 1 or n > MAX_FIELDS:
        return False
    for i in range(n):
        code = fields[i]
        if type(code) is not int or not 0 <= code <= C_MARK:
            return False
        out[i] = code
    count[0] = <int>n
    return True


cdef Py_ssize_t _find(const char* s, Py_ssize_t start, Py_ssize_t end, char c) noexcept nogil:
    """The first " c " in s[start:end], or -1."""
    cdef Py_ssize_t i = start
    while i + 3 <= end:
        if s[i + 1] == c and s[i] == c' ' and s[i + 2] == c' ':
            return i
        i += 1
    return -1


cdef int _number(const char* s, Py_ssize_t n, uint64_t limit, uint64_t* out) noexcept nogil:
    """Decimal (as int(token, 0) reads it: no leading zero) or 0x-hex, within limit; 0 for
    anything else (the Python path then reads it, or raises)."""
    cdef uint64_t value = 0
    cdef Py_ssize_t i
    cdef char c
    if n < 1:
        return 0
    if n > 2 and s[0] == c'0' and (s[1] == c'x' or s[1] == c'X'):
        if n > 10:
            return 0
        for i in range(2, n):
            c = s[i]
            if c'0' <= c <= c'9':
                value = value * 16 + <uint64_t>(c - c'0')
            elif c'a' <= c <= c'f':
                value = value * 16 + <uint64_t>(c - c'a' + 10)
            elif c'A' <= c <= c'F':
                value = value * 16 + <uint64_t>(c - c'A' + 10)
            else:
                return 0
    else:
        if n > 10 or (n > 1 and s[0] == c'0'):
            return 0
        for i in range(n):
            c = s[i]
            if not c'0' <= c <= c'9':
                return 0
            value = value * 10 + <uint64_t>(c - c'0')
    if value > limit:
        return 0
    out[0] = value
    return 1


cdef int _encode_field(int code, const char* s, Py_ssize_t n, unsigned char* out) noexcept nogil:
    """One field's bytes at out (its size), or 0 for the Python path."""
    cdef uint64_t value
    cdef uint32_t host
    if code == C_ADDR4 or code == C_ADDR6:
        return _pton(C_AF_INET if code == C_ADDR4 else C_AF_INET6, s, n, out)
    if code == C_PROTO:
        if n == 3 and s[0] == c't' and s[1] == c'c' and s[2] == c'p':
            out[0] = 6
            return 1
        if n == 3 and s[0] == c'u' and s[1] == c'd' and s[2] == c'p':
            out[0] = 17
            return 1
        if n == 4 and s[0] == c's' and s[1] == c'c' and s[2] == c't' and s[3] == c'p':
            out[0] = 132
            return 1
        if not _number(s, n, 0xFF, &value):
            return 0
        out[0] = <unsigned char>value
        return 1
    if code == C_PORT:
        if not _number(s, n, 0xFFFF, &value):
            return 0
        out[0] = <unsigned char>(value >> 8)
        out[1] = <unsigned char>(value & 0xFF)
        return 2
    if code == C_MARK:
        if not _number(s, n, 0xFFFFFFFF, &value):
            return 0
        host = <uint32_t>value
        memcpy(out, &host, 4)
        return 4
    return 0


cdef Py_ssize_t _encode_value(
    const int* codes, int count, const char* s, Py_ssize_t start, Py_ssize_t end,
    unsigned char* out
) noexcept nogil:
    """A key's or data's value (as _value) at out: its length, or -1 for the Python path."""
    cdef Py_ssize_t at = 0, token = start, sep
    cdef int index, size
    for index in range(count):
        if index == count - 1:
            sep = end
            if _find(s, token, end, c'.') >= 0:
                return -1  # more fields than the layout's
        else:
            sep = _find(s, token, end, c'.')
            if sep < 0:
                return -1
        size = _encode_field(codes[index], s + token, sep - token, out + at)
        if size == 0:
            return -1
        if count > 1:
            while size & 3:
                out[at + size] = 0
                size += 1
        at += size
        token = sep + 3
    return at


cdef inline bint _is(const char* s, Py_ssize_t n, const char* word, Py_ssize_t length) noexcept nogil:
    cdef Py_ssize_t i
    if n != length:
        return False
    for i in range(n):
        if s[i] != word[i]:
            return False
    return True


cdef Py_ssize_t _encode_verdict(const char* s, Py_ssize_t n, unsigned char* out) noexcept nogil:
    """The NFTA_DATA_VERDICT attribute (as _verdict) at out: its length, or -1."""
    cdef Py_ssize_t space = -1, i, chain_length, body
    cdef int32_t code
    cdef uint32_t big
    cdef bint jump = False
    for i in range(n):
        if s[i] == c' ':
            space = i
            break
    cdef Py_ssize_t verb = n if space < 0 else space
    chain_length = 0 if space < 0 else n - space - 1
    if _is(s, verb, "jump", 4):
        code = -3
        jump = True
    elif _is(s, verb, "goto", 4):
        code = -4
        jump = True
    elif _is(s, verb, "drop", 4):
        code = 0
    elif _is(s, verb, "accept", 6):
        code = 1
    elif _is(s, verb, "continue", 8):
        code = -1
    elif _is(s, verb, "return", 6):
        code = -5
    else:
        return -1
    if jump != (chain_length > 0) or chain_length > CHAIN_MAX:
        return -1
    big = htonl(<uint32_t>code)
    _put_nla(out + 4, 8, 1)
    memcpy(out + 8, &big, 4)
    body = 8
    if jump:
        _put_nla(out + 4 + body, 4 + chain_length + 1, 2)
        memcpy(out + 4 + body + 4, s + space + 1, chain_length)
        i = 4 + body + 4 + chain_length
        body = _align4(body + 4 + chain_length + 1)
        while i < 4 + body:
            out[i] = 0
            i += 1
    _put_nla(out, 4 + body, 2 | 0x8000)
    return 4 + body


cdef Py_ssize_t _write_field(char* p, int code, const unsigned char* raw) except -2:
    """One field's text at p (at most 39 characters): its length."""
    cdef uint32_t value
    cdef Py_ssize_t i
    if code == C_ADDR4 or code == C_ADDR6:
        return _write_address(p, C_AF_INET if code == C_ADDR4 else C_AF_INET6, raw)
    if code == C_PROTO:
        if raw[0] == 6:
            memcpy(p, b"tcp", 3)
            return 3
        if raw[0] == 17:
            memcpy(p, b"udp", 3)
            return 3
        if raw[0] == 132:
            memcpy(p, b"sctp", 4)
            return 4
        return _write_u32(p, raw[0])
    if code == C_PORT:
        return _write_u32(p, (<uint32_t>raw[0] << 8) | raw[1])
    memcpy(&value, raw, 4)
    # MARK: "%#010x"
    p[0] = c'0'
    p[1] = c'x'
    for i in range(8):
        p[2 + i] = HEX[(value >> (28 - 4 * i)) & 0xF]
    return 10


cdef inline uint16_t _u16(const unsigned char* p) noexcept nogil:
    cdef uint16_t value
    memcpy(&value, p, 2)
    return value


cdef inline uint32_t _u32(const unsigned char* p) noexcept nogil:
    cdef uint32_t value
    memcpy(&value, p, 4)
    return value


cdef int _inner(
    const unsigned char* buf, Py_ssize_t start, Py_ssize_t end, int kind,
    Py_ssize_t* first, Py_ssize_t* last
) noexcept nogil:
    """The last attribute of this type in buf[start:end] (as _attrs): 1 and where its
    payload lies, 0 if there is none, -1 for an attribute running past the end."""
    cdef Py_ssize_t length
    cdef int found = 0
    first[0] = -1
    while start + 4 <= end:
        length = _u16(buf + start)
        if length < 4:
            break
        if start + length > end:
            return -1
        if _u16(buf + start + 2) & 0x3FFF == kind:
            first[0] = start + 4
            last[0] = start + length
            found = 1
        start += _align4(length)
    return found


# --- Batch ---------------------------------------------------------------------------------


cdef class Batch:
    """One nfnetlink batch: set elements added and deleted, applied all or nothing."""

    cdef object _table
    cdef object _first
    cdef object _sequence
    cdef object _last_sequence
    # Every message, one after the other, at `_buf`: 20 bytes into `_array`, whose first and
    # last 20 are the batch's begin and end (finish writes them: the batch is sent as it is,
    # not copied, which at 30k services is 18 MiB less at a cold start's peak).
    cdef bytearray _array
    cdef unsigned char* _buf
    cdef Py_ssize_t _length
    cdef Py_ssize_t _capacity
    cdef Py_ssize_t _count  # messages
    cdef Py_ssize_t _last  # where the last message starts
    # Per NFTA_LIST_ELEM of every message: its offset in its message, and its element's index
    # in the elements of its `elements` call.
    cdef uint32_t* _offsets
    cdef uint32_t* _owners
    cdef Py_ssize_t _items
    cdef Py_ssize_t _items_capacity
    # sequence -> (the elements of its `elements` call, its first item, its end item)
    cdef dict _where
    # The `elements` call under way: the message being filled (where it starts, or -1), its
    # element list's length and first item; the call's elements, message kind, flags, head.
    cdef Py_ssize_t _open
    cdef Py_ssize_t _size
    cdef Py_ssize_t _open_first
    cdef tuple _given
    cdef int _kind
    cdef int _flags
    cdef bytes _head
    cdef Py_ssize_t _prefix
    cdef public object last_request

    def __cinit__(self):
        self._buf = NULL
        self._offsets = NULL
        self._owners = NULL
        self._open = -1

    def __init__(self, table, sequence):
        self._table = table
        self._first = sequence
        self._sequence = sequence + 1  # the batch's begin takes `sequence`
        self._where = {}
        self.last_request = 0

    def __dealloc__(self):
        PyMem_Free(self._offsets)
        PyMem_Free(self._owners)

    cdef int _reserve(self, Py_ssize_t more) except -1:
        cdef Py_ssize_t capacity
        if self._length + more <= self._capacity:
            return 0
        capacity = max(self._capacity * 2, self._length + more, 1 << 16)
        if self._array is None:
            self._array = bytearray(20 + capacity + 20)
        else:
            PyByteArray_Resize(self._array, 20 + capacity + 20)
        self._buf = <unsigned char*>PyByteArray_AS_STRING(self._array) + 20
        self._capacity = capacity
        return 0

    cdef int _reserve_item(self) except -1:
        cdef Py_ssize_t capacity
        cdef void* offsets
        cdef void* owners
        if self._items < self._items_capacity:
            return 0
        capacity = max(self._items_capacity * 2, 1024)
        offsets = PyMem_Realloc(self._offsets, capacity * sizeof(uint32_t))
        if offsets == NULL:
            raise MemoryError()
        self._offsets = <uint32_t*>offsets
        owners = PyMem_Realloc(self._owners, capacity * sizeof(uint32_t))
        if owners == NULL:
            raise MemoryError()
        self._owners = <uint32_t*>owners
        self._items_capacity = capacity
        return 0

    def elements(self, delete, container, key, data, interval, elements):
        """Add (or delete) these elements of map or set `container` (its layout given)."""
        cdef bytes head = _string(1, self._table) + _string(2, container)
        cdef tuple given = tuple(elements)
        cdef Py_ssize_t total = PyTuple_GET_SIZE(given)
        cdef int key_codes[MAX_FIELDS]
        cdef int data_codes[MAX_FIELDS]
        cdef int key_count = 0, data_count = 0
        cdef bint verdict = False, has_data = False, fast
        cdef unsigned char item[ITEM_MAX]
        cdef unsigned char value[256]
        cdef Py_ssize_t index, length, at, key_length, data_length, s_length, sep
        cdef const char* s
        cdef object element, payload
        cdef bytes packed
        if total > 0xFFFFFFFF:
            raise OverflowError("too many elements for one batch")
        self._kind = NFT_MSG_DELSETELEM if delete else NFT_MSG_NEWSETELEM
        self._flags = NLM_F_REQUEST | (0 if delete else NLM_F_CREATE)
        self._head = head
        self._prefix = 16 + 4 + len(head) + 4  # where the element list starts
        self._given = given
        self._open = -1
        try:
            fast = not interval and _layout_codes(key, key_codes, &key_count)
            if fast and data and not delete:
                has_data = True
                if data[0] == VERDICT:
                    verdict = type(data[0]) is int
                    fast = verdict
                else:
                    fast = _layout_codes(data, data_codes, &data_count)
        except Exception:  # a layout that is not one: the pure twin's code fails on it
            fast = False
        try:
            for index in range(total):
                element = given[index]
                length = -1
                if fast and type(element) is str and PyUnicode_IS_COMPACT_ASCII(element):
                    s = <const char*>PyUnicode_1BYTE_DATA(element)
                    s_length = PyUnicode_GET_LENGTH(element)
                    sep = _find(s, 0, s_length, c':')
                    if sep >= 0 or not has_data:
                        key_length = _encode_value(
                            key_codes, key_count, s, 0, s_length if sep < 0 else sep, value
                        )
                        if key_length >= 0:
                            # NFTA_LIST_ELEM { KEY { DATA_VALUE }, [DATA { ... }] }
                            _put_nla(item + 4, 4 + _align4(4 + key_length), 1 | 0x8000)
                            _put_nla(item + 8, 4 + key_length, 1)
                            memcpy(item + 12, value, key_length)
                            memset(item + 12 + key_length, 0, _align4(key_length) - key_length)
                            at = 12 + _align4(key_length)
                            length = at
                            if has_data and verdict:
                                data_length = _encode_verdict(
                                    s + sep + 3, s_length - sep - 3, item + at + 4
                                )
                                if data_length < 0:
                                    length = -1
                                else:
                                    _put_nla(item + at, 4 + data_length, 2 | 0x8000)
                                    length = at + 4 + data_length
                            elif has_data:
                                data_length = _encode_value(
                                    data_codes, data_count, s, sep + 3, s_length, value
                                )
                                if data_length < 0:
                                    length = -1
                                else:
                                    _put_nla(item + at, 4 + _align4(4 + data_length), 2 | 0x8000)
                                    _put_nla(item + at + 4, 4 + data_length, 1)
                                    memcpy(item + at + 8, value, data_length)
                                    memset(
                                        item + at + 8 + data_length,
                                        0,
                                        _align4(data_length) - data_length,
                                    )
                                    length = at + 8 + _align4(data_length)
                            if length > 0:
                                _put_nla(item, length, 1 | 0x8000)
                if length > 0:
                    self._add(item, length, index)
                    continue
                for payload in _element_attrs(key, data, interval, element, delete):
                    packed = _nested(1, payload)
                    self._add(
                        <const unsigned char*>PyBytes_AS_STRING(packed),
                        PyBytes_GET_SIZE(packed),
                        index,
                    )
            if self._open >= 0:
                self._close()
        except BaseException:
            if self._open >= 0:  # the message being filled is dropped, as the pure twin's is
                self._length = self._open
                self._items = self._open_first
                self._open = -1
            raise
        finally:
            self._given = None
            self._head = None

    cdef int _add(self, const unsigned char* item, Py_ssize_t length, Py_ssize_t owner) except -1:
        """Append one NFTA_LIST_ELEM, closing the message first if it would grow too long."""
        cdef Py_ssize_t start
        if self._open >= 0 and self._size + length > C_ELEMENTS_LIMIT:
            self._close()
        if self._open < 0:
            self._reserve(self._prefix)
            start = self._length
            memcpy(self._buf + start + 20, PyBytes_AS_STRING(self._head), self._prefix - 24)
            self._length += self._prefix
            self._open = start
            self._open_first = self._items
            self._size = 0
        self._reserve(length)
        self._reserve_item()
        self._offsets[self._items] = <uint32_t>(self._prefix + self._size)
        self._owners[self._items] = <uint32_t>owner
        self._items += 1
        memcpy(self._buf + self._length, item, length)
        self._length += length
        self._size += length
        return 0

    cdef int _close(self) except -1:
        """Write the headers of the message being filled (the pure twin's `_message`)."""
        cdef Py_ssize_t head_length = self._prefix - 24
        cdef bytes body = _NLA.pack(4 + self._size, 3 | NLA_F_NESTED)
        length = self._prefix + self._size
        sequence = self._sequence
        self._sequence += 1
        cdef bytes header = _NLMSG.pack(
            length, (NFNL_SUBSYS_NFTABLES << 8) | self._kind, self._flags, sequence, 0
        ) + _NFGEN.pack(NFPROTO_INET, 0, 0)
        memcpy(self._buf + self._open, PyBytes_AS_STRING(header), 20)
        memcpy(self._buf + self._open + 20 + head_length, PyBytes_AS_STRING(body), 4)
        self._where[sequence] = (self._given, self._open_first, self._items)
        self._count += 1
        self._last = self._open
        self._last_sequence = sequence
        self._open = -1
        return 0

    def __len__(self):
        """The number of messages (besides the batch's begin and end)."""
        return self._count

    def finish(self):
        """The batch, the last message asking for an acknowledgement (the barrier: once it
        is read, every answer of the batch has been); the last call on the batch."""
        cdef uint16_t message_flags
        cdef bytes begin, end
        cdef bytearray out
        cdef char* p
        if not self._count:
            return bytearray()
        self.last_request = self._last_sequence
        res = socket.htons(NFNL_SUBSYS_NFTABLES)
        begin = _NLMSG.pack(20, NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, self._first, 0)
        end = _NLMSG.pack(20, NFNL_MSG_BATCH_END, NLM_F_REQUEST, self._sequence, 0)
        begin += _NFGEN.pack(0, 0, res)
        end += _NFGEN.pack(0, 0, res)
        PyByteArray_Resize(self._array, 20 + self._length + 20)  # no element follows
        out = self._array
        self._capacity = self._length
        p = PyByteArray_AS_STRING(out)
        memcpy(p, PyBytes_AS_STRING(begin), 20)
        memcpy(p + 20 + self._length, PyBytes_AS_STRING(end), 20)
        memcpy(&message_flags, p + 20 + self._last + 6, 2)
        message_flags |= NLM_F_ACK
        memcpy(p + 20 + self._last + 6, &message_flags, 2)
        return out

    def element_at(self, sequence, offset):
        """The element at this offset of this message (an extended ack's), if any."""
        cdef Py_ssize_t low, high, middle, first, end
        cdef uint32_t where
        found = self._where.get(sequence)
        if found is None:
            return None
        given, first, end = found
        if type(offset) is not int:
            for middle in range(end - 1, first - 1, -1):
                if self._offsets[middle] <= offset:
                    return given[self._owners[middle]]
            return None
        if offset < 0:
            return None
        where = offset if offset <= 0xFFFFFFFF else 0xFFFFFFFF
        # The last item at or before `where` (offsets grow within a message).
        low, high = first, end
        while low < high:
            middle = (low + high) // 2
            if self._offsets[middle] <= where:
                low = middle + 1
            else:
                high = middle
        if low == first:
            return None
        return (<tuple>given)[self._owners[low - 1]]

    def elements_of(self, sequence):
        """The elements of one message (when the kernel does not say which it refused)."""
        cdef Py_ssize_t index, first, end
        found = self._where.get(sequence)
        if found is None:
            return []
        given, first, end = found
        return list(dict.fromkeys([given[self._owners[index]] for index in range(first, end)]))


# --- DumpParser ----------------------------------------------------------------------------


cdef class DumpParser:
    """Reads a GETSETELEM dump's answers into elements in the renderer's text."""

    cdef object _pure  # the pure twin's parser: the slow path, sharing `_out`
    cdef tuple _key
    cdef tuple _data
    cdef list _out
    cdef public object done
    cdef bint _fast  # not an interval set, every field a plain one: elements read in C
    cdef bint _verdict
    cdef int _key_codes[MAX_FIELDS]
    cdef int _data_codes[MAX_FIELDS]
    cdef int _key_count
    cdef int _data_count
    cdef char _text[TEXT_MAX]

    def __init__(self, key, data, interval):
        self._pure = _PureDumpParser(key, data, interval)
        self._key = self._pure._key
        self._data = self._pure._data
        # One list of elements: those read here and those the pure parser reads, in order.
        self._out = self._pure._out
        self.done = False
        self._fast = not interval and _layout_codes(self._key, self._key_codes, &self._key_count)
        self._verdict = False
        self._data_count = 0
        if self._fast and self._data:
            if self._data[0] == VERDICT:
                self._verdict = type(self._data[0]) is int
                self._fast = self._verdict
            else:
                self._fast = _layout_codes(self._data, self._data_codes, &self._data_count)

    def feed(self, data):
        """Parse one `recv`'s messages; True once the dump is complete. A dump the kernel
        refused raises OSError with its errno."""
        cdef const unsigned char* buf
        cdef Py_ssize_t n, offset = 0, end
        cdef uint32_t length
        cdef uint16_t kind
        if not self._fast or type(data) is not bytes:
            return self._feed_pure(data)
        buf = <const unsigned char*>PyBytes_AS_STRING(data)
        n = PyBytes_GET_SIZE(data)
        while offset + 16 <= n:
            length = _u32(buf + offset)
            kind = _u16(buf + offset + 4)
            if length < 16:
                raise CodecError("truncated netlink message")
            end = offset + <Py_ssize_t>length
            if kind == NLMSG_DONE:
                self.done = True
            elif kind == NLMSG_ERROR:
                code = -struct.unpack_from("=i", data, offset + 16)[0]
                if code:
                    raise OSError(code, f"set element dump refused: {os.strerror(code)}")
            elif kind & 0xFF == NFT_MSG_NEWSETELEM:
                if end <= n:
                    self._message_c(data, buf, offset + 20, end)
                else:
                    self._pure._message(data, offset + 20, end)
            offset += (<Py_ssize_t>length + 3) & ~(<Py_ssize_t>3)
        return self.done

    cdef int _message_c(
        self, bytes data, const unsigned char* buf, Py_ssize_t start, Py_ssize_t end
    ) except -1:
        """One message's elements (the pure twin's `_message`), read in place."""
        cdef Py_ssize_t at = start, first = -1, last = -1, length
        cdef int done
        while at + 4 <= end:
            length = _u16(buf + at)
            if length < 4:
                break
            if _u16(buf + at + 2) & NLA_TYPE_MASK == 3:
                first = at + 4
                last = at + length
            at += _align4(length)
        if first < 0:
            return 0
        if last > end:  # not as the kernel writes it: the pure twin's reading
            self._pure._message(data, start, end)
            return 0
        while first + 4 <= last:
            length = _u16(buf + first)
            if length < 4:
                break
            done = 0
            if first + length <= last:
                done = self._element_c(buf, first + 4, first + length)
            if not done:
                self._pure._element(data, first + 4, first + length)
            first += _align4(length)
        return 0

    cdef int _element_c(self, const unsigned char* buf, Py_ssize_t start, Py_ssize_t end) except -1:
        """One element read in place into its text: 1, or 0 for one not as the kernel writes
        it (the pure twin's code reads it then, or raises)."""
        cdef Py_ssize_t at = start, length, kind
        cdef Py_ssize_t key_start = -1, key_end = 0, data_start = -1, data_end = 0
        cdef Py_ssize_t value_start = -1, value_end = 0, n = 0, chain_start = -1, chain_end = 0, i
        cdef int32_t code
        cdef object text
        while at + 4 <= end:
            length = _u16(buf + at)
            if length < 4:
                break
            if at + length > end:
                return 0
            kind = _u16(buf + at + 2) & NLA_TYPE_MASK
            if kind == 1:
                key_start, key_end = at + 4, at + length
            elif kind == 2:
                data_start, data_end = at + 4, at + length
            elif kind == 3 and length < 8:
                return 0
            at += _align4(length)
        if key_start < 0 or _inner(buf, key_start, key_end, 1, &value_start, &value_end) != 1:
            return 0
        n = self._fields(buf + value_start, value_end - value_start, self._key_codes, self._key_count, 0)
        if n < 0:
            return 0
        if self._data:
            self._text[n] = c' '
            self._text[n + 1] = c':'
            self._text[n + 2] = c' '
            n += 3
            if data_start >= 0 and not self._verdict:
                if _inner(buf, data_start, data_end, 1, &value_start, &value_end) != 1:
                    return 0
                n = self._fields(
                    buf + value_start,
                    value_end - value_start,
                    self._data_codes,
                    self._data_count,
                    n,
                )
                if n < 0:
                    return 0
            elif data_start >= 0:
                if _inner(buf, data_start, data_end, 2, &value_start, &value_end) < 0:
                    return 0
                if value_start >= 0:
                    # NFTA_DATA_VERDICT { CODE, [CHAIN] }
                    if _inner(buf, value_start, value_end, 1, &at, &length) != 1:
                        return 0
                    if length - at < 4:
                        return 0
                    code = <int32_t>ntohl(_u32(buf + at))
                    if code == -3 or code == -4:
                        if _inner(buf, value_start, value_end, 2, &chain_start, &chain_end) != 1:
                            return 0
                        while chain_end > chain_start and buf[chain_end - 1] == 0:
                            chain_end -= 1
                        if chain_end - chain_start > CHAIN_MAX:
                            return 0
                        for i in range(chain_start, chain_end):
                            if buf[i] >= 0x80:
                                return 0
                        memcpy(self._text + n, b"jump " if code == -3 else b"goto ", 5)
                        n += 5
                        memcpy(self._text + n, buf + chain_start, chain_end - chain_start)
                        n += chain_end - chain_start
                    elif code == 0:
                        memcpy(self._text + n, b"drop", 4)
                        n += 4
                    elif code == 1:
                        memcpy(self._text + n, b"accept", 6)
                        n += 6
                    elif code == -1:
                        memcpy(self._text + n, b"continue", 8)
                        n += 8
                    elif code == -5:
                        memcpy(self._text + n, b"return", 6)
                        n += 6
                    else:
                        if code < 0:
                            self._text[n] = c'-'
                            n += 1
                            n += _write_u32(self._text + n, <uint32_t>(-(<int64_t>code)))
                        else:
                            n += _write_u32(self._text + n, <uint32_t>code)
        text = PyUnicode_New(n, 127)
        memcpy(PyUnicode_1BYTE_DATA(text), self._text, n)
        self._out.append(text)
        return 1

    cdef Py_ssize_t _fields(
        self, const unsigned char* raw, Py_ssize_t size, const int* codes, int count, Py_ssize_t n
    ) except -2:
        """The fields of a key's or data's value, " . " between them, written at _text[n:]:
        the text's new length, or -1 for a value too short."""
        cdef Py_ssize_t at = 0
        cdef int index, width
        for index in range(count):
            width = C_SIZES[codes[index]]
            if at + width > size:
                return -1
            if index:
                self._text[n] = c' '
                self._text[n + 1] = c'.'
                self._text[n + 2] = c' '
                n += 3
            n += _write_field(self._text + n, codes[index], raw + at)
            at += _align4(width)
        return n

    cdef object _feed_pure(self, object data):
        """The pure twin's reading of a whole `recv` (interval sets, a layout not plain, data
        not bytes): its elements appended to the same list."""
        self._pure.done = self.done
        try:
            return self._pure.feed(data)
        finally:
            self.done = self._pure.done

    def result(self):
        """The elements parsed (a one-field interval set's start and end paired)."""
        return self._pure.result()
