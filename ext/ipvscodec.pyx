# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled IPVS codec: the same API, bytes and values as lace_proxy/dataplane/ipvs/_pycodec.py.

tests/unit/test_ipvscodec.py holds the twins equal: the same requests for the same virtual
and real servers, the same values for the same dump, the same errors.

What makes it fast: requests are written straight into one growing C buffer (addresses by
`inet_pton`, numbers checked and packed in C, a scheduler's attribute encoded once and kept),
and cut into `send` buffers by memcpy; a dump's attributes are found and read in place in the
received bytes, addresses written as text in C (as `ipaddress` writes them).

Anything off the common path takes the pure twin's code (`_pycodec`, imported, not copied):
an address that `inet_pton` does not read (its `_packed` then reads it, or raises the same
error), a number that is not a plain int in range (its `_check` raises); IPv4-mapped IPv6
addresses in a dump are written by `ipaddress` (their text depends on the Python version).
The constants and `CodecError` are the pure twin's own, so that either twin's errors are
caught alike. The address code in C is shared with the nf_tables codec (ext/netaddr.pxi).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeASCII
from libc.stdint cimport int32_t, int64_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

import os

cdef extern from "Python.h":
    bint PyUnicode_IS_COMPACT_ASCII(object o)
    const char* PyUnicode_AsUTF8AndSize(object o, Py_ssize_t* size) except NULL

# The pure twin: its constants, its error, and its code for the slow path.
from lace_proxy.dataplane.ipvs._pycodec import (
    AF_INET,
    AF_INET6,
    GENL_VERSION,
    IP_VS_CONN_F_MASQ,
    IP_VS_SVC_F_PERSISTENT,
    IPVS_CMD_DEL_DEST,
    IPVS_CMD_DEL_SERVICE,
    IPVS_CMD_GET_DEST,
    IPVS_CMD_GET_SERVICE,
    IPVS_CMD_NEW_DEST,
    IPVS_CMD_NEW_SERVICE,
    IPVS_CMD_SET_DEST,
    IPVS_CMD_SET_SERVICE,
    NLM_F_ACK,
    NLM_F_DUMP,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NLMSG_ERROR,
    NLMSG_MIN_TYPE,
    CodecError,
    _check,
    _NLA,
    _packed,
    _pair,
    _SERVER_COMMANDS,
    _SERVICE_COMMANDS,
)

IMPLEMENTATION = "compiled"

cdef enum:
    CMD_SERVICE = 1
    CMD_DEST = 2
    SVC_AF = 1
    SVC_PROTOCOL = 2
    SVC_ADDR = 3
    SVC_PORT = 4
    SVC_FWMARK = 5
    SVC_SCHED = 6
    SVC_FLAGS = 7
    SVC_TIMEOUT = 8
    SVC_NETMASK = 9
    DEST_ADDR = 1
    DEST_PORT = 2
    DEST_FWD = 3
    DEST_WEIGHT = 4
    DEST_UTHRESH = 5
    DEST_LTHRESH = 6
    DEST_ACTIVE = 7
    DEST_INACTIVE = 8
    DEST_FAMILY = 11
    SLOTS = 16  # attribute types read from a dump's nest: 0..15
    KEY_MAX = 64  # a virtual service's key attributes at most (IPv6: 48)


# --- C helpers -----------------------------------------------------------------------------

include "netaddr.pxi"  # addresses read and written in C: shared with the nf_tables codec


cdef inline Py_ssize_t _align4(Py_ssize_t n) noexcept nogil:
    return (n + 3) & ~(<Py_ssize_t>3)


cdef inline Py_ssize_t _put_attr(
    unsigned char* p, int kind, const void* payload, Py_ssize_t length
) noexcept nogil:
    """An attribute at p, padded: its length with the padding."""
    cdef uint16_t header[2]
    cdef Py_ssize_t total = _align4(4 + length)
    header[0] = <uint16_t>(4 + length)
    header[1] = <uint16_t>kind
    memcpy(p, header, 4)
    memcpy(p + 4, payload, length)
    memset(p + 4 + length, 0, total - 4 - length)
    return total


cdef inline Py_ssize_t _put_u16(unsigned char* p, int kind, uint16_t value) noexcept nogil:
    return _put_attr(p, kind, &value, 2)


cdef inline Py_ssize_t _put_be16(unsigned char* p, int kind, uint16_t value) noexcept nogil:
    cdef unsigned char raw[2]
    raw[0] = <unsigned char>(value >> 8)
    raw[1] = <unsigned char>(value & 0xFF)
    return _put_attr(p, kind, raw, 2)


cdef inline Py_ssize_t _put_u32(unsigned char* p, int kind, uint32_t value) noexcept nogil:
    return _put_attr(p, kind, &value, 4)


cdef inline void _put_header(unsigned char* p, Py_ssize_t length, int kind) noexcept nogil:
    cdef uint16_t header[2]
    header[0] = <uint16_t>length
    header[1] = <uint16_t>kind
    memcpy(p, header, 4)


cdef uint64_t _number(object value, uint64_t limit, str name) except? 0xFFFFFFFFFFFFFFFF:
    """A plain int within [0, limit]; anything else raises as the pure twin's `_check`."""
    cdef int overflow = 0
    cdef long long number
    if type(value) is int:
        number = PyLong_AsLongLongAndOverflow(value, &overflow)
        if not overflow and number >= 0 and <uint64_t>number <= limit:
            return <uint64_t>number
    _check(name, value, limit)  # raises
    return 0


cdef int _address(object address, unsigned char* raw) except -1:
    """An address's bytes at raw (16 bytes of room): its family."""
    cdef Py_ssize_t n
    cdef const char* s
    if type(address) is str and PyUnicode_IS_COMPACT_ASCII(address):
        s = PyUnicode_AsUTF8AndSize(address, &n)
        if _pton(C_AF_INET, s, n, raw):
            return C_AF_INET
        if _pton(C_AF_INET6, s, n, raw):
            return C_AF_INET6
    family, packed = _packed(address)
    memcpy(raw, PyBytes_AS_STRING(packed), PyBytes_GET_SIZE(packed))
    return family


cdef Py_ssize_t _key(
    unsigned char* p, object protocol, object address, object port, int* family
) except -1:
    """A virtual service's identifying attributes at p (KEY_MAX bytes of room): their
    length; its family in `family`."""
    cdef unsigned char raw[16]
    cdef Py_ssize_t at = 0
    cdef uint16_t proto, number
    family[0] = _address(address, raw)
    proto = <uint16_t>_number(protocol, 0xFFFF, "protocol")
    number = <uint16_t>_number(port, 0xFFFF, "port")
    at += _put_u16(p + at, SVC_AF, <uint16_t>family[0])
    at += _put_u16(p + at, SVC_PROTOCOL, proto)
    at += _put_attr(p + at, SVC_ADDR, raw, 4 if family[0] == C_AF_INET else 16)
    at += _put_be16(p + at, SVC_PORT, number)
    return at


cdef inline bint _unicast(const unsigned char* raw, int family) noexcept nogil:
    """The pure twin's `_unicast`: whether IPVS takes the address at raw as a real server."""
    cdef int i
    if family == C_AF_INET:
        return not (224 <= raw[0] <= 239 or (raw[0] | raw[1] | raw[2] | raw[3]) == 0)
    if raw[0] == 0xFF or (raw[0] == 0xFE and (raw[1] & 0xC0) == 0x80):
        return False
    for i in range(16):
        if raw[i]:
            return True
    return False


cdef inline uint16_t _u16(const unsigned char* p) noexcept nogil:
    cdef uint16_t value
    memcpy(&value, p, 2)
    return value


cdef inline uint32_t _u32(const unsigned char* p) noexcept nogil:
    cdef uint32_t value
    memcpy(&value, p, 4)
    return value


# --- Requests ------------------------------------------------------------------------------


cdef class Requests:
    """IPVS commands encoded one after another, numbered from `sequence` on."""

    cdef uint16_t _family
    cdef uint64_t _next
    cdef unsigned char* _buf  # every request, one after the other
    cdef Py_ssize_t _length
    cdef Py_ssize_t _capacity
    cdef Py_ssize_t* _starts  # where each request starts in _buf
    cdef Py_ssize_t _count
    cdef Py_ssize_t _starts_capacity
    cdef dict _schedulers  # scheduler name -> its IPVS_SVC_ATTR_SCHED_NAME attribute

    def __cinit__(self):
        self._buf = NULL
        self._starts = NULL

    def __init__(self, family, sequence):
        self._family = <uint16_t>_number(family, 0xFFFF, "family")
        self._next = _number(sequence, 0xFFFFFFFF, "sequence")
        self._length = self._count = 0
        self._schedulers = {}

    def __dealloc__(self):
        PyMem_Free(self._buf)
        PyMem_Free(self._starts)

    cdef unsigned char* _open(self, Py_ssize_t most) except NULL:
        """Room for a request of `most` bytes at the end; it is numbered there and then."""
        cdef Py_ssize_t capacity
        cdef void* grown
        if self._next > 0xFFFFFFFF:
            raise CodecError("sequence numbers exhausted")
        if self._length + most > self._capacity:
            capacity = max(2 * self._capacity, self._length + most, 4096)
            grown = PyMem_Realloc(self._buf, capacity)
            if grown == NULL:
                raise MemoryError()
            self._buf = <unsigned char*>grown
            self._capacity = capacity
        if self._count == self._starts_capacity:
            capacity = max(2 * self._starts_capacity, 256)
            grown = PyMem_Realloc(self._starts, capacity * sizeof(Py_ssize_t))
            if grown == NULL:
                raise MemoryError()
            self._starts = <Py_ssize_t*>grown
            self._starts_capacity = capacity
        return self._buf + self._length

    cdef uint64_t _close(self, unsigned char* p, Py_ssize_t length, int command) noexcept:
        """The request at p done (`length` bytes): its headers written, its number given."""
        cdef uint32_t header[4]
        cdef uint64_t sequence = self._next
        header[0] = <uint32_t>length
        header[1] = <uint32_t>self._family | (<uint32_t>1 << 16)  # type, NLM_F_REQUEST
        header[2] = <uint32_t>sequence
        header[3] = 0
        memcpy(p, header, 16)
        p[16] = <unsigned char>command
        p[17] = 1  # GENL_VERSION
        p[18] = p[19] = 0
        self._starts[self._count] = self._length
        self._count += 1
        self._length += length
        self._next += 1
        return sequence

    def service(self, command, protocol, address, port, scheduler, timeout):
        """A virtual service added, changed or deleted (its key alone); persistent when
        `timeout` is not 0. Returns the request's sequence number."""
        cdef unsigned char key[KEY_MAX]
        cdef int family
        cdef Py_ssize_t key_length, at, most
        cdef uint32_t flags[2]
        cdef uint32_t seconds = 0
        cdef bytes sched = None
        cdef unsigned char* p
        if command not in _SERVICE_COMMANDS:
            raise CodecError(f"{command!r} is not a virtual-service command")
        key_length = _key(key, protocol, address, port, &family)
        most = 24 + key_length
        if command != IPVS_CMD_DEL_SERVICE:
            sched = self._schedulers.get(scheduler) if type(scheduler) is str else None
            if sched is None:
                if type(scheduler) is not str or "\0" in scheduler or not scheduler.isascii():
                    raise CodecError(f"{scheduler!r} is not a scheduler name")
                name = scheduler.encode("ascii") + b"\0"
                sched = _NLA.pack(4 + len(name), SVC_SCHED) + name + b"\0" * (-len(name) % 4)
                self._schedulers[scheduler] = sched
            seconds = <uint32_t>_number(timeout, 0xFFFFFFFF, "timeout")
            most += PyBytes_GET_SIZE(sched) + 12 + 8 + 8
        p = self._open(most)
        memcpy(p + 24, key, key_length)
        at = 24 + key_length
        if sched is not None:
            memcpy(p + at, PyBytes_AS_STRING(sched), PyBytes_GET_SIZE(sched))
            at += PyBytes_GET_SIZE(sched)
            flags[0] = IP_VS_SVC_F_PERSISTENT if seconds else 0
            flags[1] = 0xFFFFFFFF
            at += _put_attr(p + at, SVC_FLAGS, flags, 8)
            at += _put_u32(p + at, SVC_TIMEOUT, seconds)
            at += _put_u32(p + at, SVC_NETMASK, 0xFFFFFFFF if family == C_AF_INET else 128)
        _put_header(p + 20, at - 20, CMD_SERVICE)
        return self._close(p, at, command)

    def server(self, command, protocol, address, port, server, server_port, weight):
        """A real server of a virtual service added, changed (NAT, `weight`) or deleted.
        Returns the request's sequence number."""
        cdef unsigned char key[KEY_MAX]
        cdef unsigned char raw[16]
        cdef int family, server_family
        cdef Py_ssize_t key_length
        cdef uint16_t number
        cdef uint32_t weight_value = 0
        if command not in _SERVER_COMMANDS:
            raise CodecError(f"{command!r} is not a real-server command")
        key_length = _key(key, protocol, address, port, &family)
        server_family = _address(server, raw)
        number = <uint16_t>_number(server_port, 0xFFFF, "port")
        if command != IPVS_CMD_DEL_DEST:
            weight_value = <uint32_t>_number(weight, 0x7FFFFFFF, "weight")
        return self._dest(command, key, key_length, raw, server_family, number, weight_value)

    def servers(self, command, protocol, address, port, servers, weight):
        """`server` for each (address, port) of `servers`, the same requests numbered in turn,
        except those IPVS refuses as real servers (not `_unicast`): those are returned, in
        order, with the first request's sequence number (the next one's, if none is made).
        The command, key and weight are checked once, before any server; every server's
        address and port are checked, left out or not; on any error nothing is encoded."""
        cdef unsigned char key[KEY_MAX]
        cdef unsigned char raw[16]
        cdef int family, server_family
        cdef Py_ssize_t key_length, length = self._length, count = self._count
        cdef uint64_t first = self._next
        cdef uint16_t number
        cdef uint32_t weight_value = 0
        cdef list left = []
        if command not in _SERVER_COMMANDS:
            raise CodecError(f"{command!r} is not a real-server command")
        key_length = _key(key, protocol, address, port, &family)
        if command != IPVS_CMD_DEL_DEST:
            weight_value = <uint32_t>_number(weight, 0x7FFFFFFF, "weight")
        try:
            for item in servers:
                if type(item) is tuple and PyTuple_GET_SIZE(item) == 2:
                    server = <object>PyTuple_GET_ITEM(item, 0)
                    server_port = <object>PyTuple_GET_ITEM(item, 1)
                else:
                    server, server_port = _pair(item)
                server_family = _address(server, raw)
                number = <uint16_t>_number(server_port, 0xFFFF, "port")
                if _unicast(raw, server_family):
                    self._dest(command, key, key_length, raw, server_family, number, weight_value)
                else:
                    left.append(item)
        except BaseException:
            self._length, self._count, self._next = length, count, first
            raise
        return first, left

    cdef uint64_t _dest(
        self, int command, const unsigned char* key, Py_ssize_t key_length,
        const unsigned char* raw, int server_family, uint16_t number, uint32_t weight_value
    ) except? 0xFFFFFFFFFFFFFFFF:
        """A real-server request from its checked parts: its sequence number."""
        cdef Py_ssize_t at, dest
        cdef unsigned char* p = self._open(24 + key_length + 4 + 20 + 8 + 32 + 8)
        memcpy(p + 24, key, key_length)
        _put_header(p + 20, 4 + key_length, CMD_SERVICE)
        dest = 24 + key_length
        at = dest + 4
        at += _put_attr(p + at, DEST_ADDR, raw, 4 if server_family == C_AF_INET else 16)
        at += _put_be16(p + at, DEST_PORT, number)
        if command != IPVS_CMD_DEL_DEST:
            at += _put_u32(p + at, DEST_FWD, 0)
            at += _put_u32(p + at, DEST_WEIGHT, weight_value)
            at += _put_u32(p + at, DEST_UTHRESH, 0)
            at += _put_u32(p + at, DEST_LTHRESH, 0)
        at += _put_u16(p + at, DEST_FAMILY, <uint16_t>server_family)
        _put_header(p + dest, at - dest, CMD_DEST)
        return self._close(p, at, command)

    def __len__(self):
        return self._count

    def chunks(self, limit):
        """The requests in order, joined into buffers of at most `limit` bytes (a request
        longer than that alone), each with the sequence number of its last request, the one
        that asks for an acknowledgement: once it is read, every answer to the buffer is."""
        cdef Py_ssize_t most = <Py_ssize_t>_number(limit, 1 << 62, "limit")
        cdef Py_ssize_t index, first = 0, start, end, last
        cdef uint64_t number = self._next - <uint64_t>self._count
        cdef list out = []
        index = 0
        while index < self._count:
            first = index
            start = self._starts[index]
            index += 1
            while index < self._count and self._end(index) - start <= most:
                index += 1
            out.append(self._chunk(start, self._end(index - 1), self._starts[index - 1]))
            out.append(number + <uint64_t>(index - 1))
        return [(out[i], out[i + 1]) for i in range(0, len(out), 2)]

    cdef inline Py_ssize_t _end(self, Py_ssize_t index) noexcept:
        return self._starts[index + 1] if index + 1 < self._count else self._length

    cdef bytes _chunk(self, Py_ssize_t start, Py_ssize_t end, Py_ssize_t last):
        cdef bytes out = PyBytes_FromStringAndSize(<char*>self._buf + start, end - start)
        cdef char* p = PyBytes_AS_STRING(out)
        cdef uint16_t flags
        memcpy(&flags, p + (last - start) + 6, 2)
        flags |= 0x4  # NLM_F_ACK
        memcpy(p + (last - start) + 6, &flags, 2)
        return out


cdef bytes _dump(object family, object sequence, int command, const unsigned char* body,
                 Py_ssize_t length):
    cdef uint16_t kind = <uint16_t>_number(family, 0xFFFF, "family")
    cdef uint32_t number = <uint32_t>_number(sequence, 0xFFFFFFFF, "sequence")
    cdef uint32_t header[4]
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 20 + length)
    cdef unsigned char* p = <unsigned char*>PyBytes_AS_STRING(out)
    header[0] = <uint32_t>(20 + length)
    header[1] = <uint32_t>kind | (<uint32_t>0x301 << 16)  # NLM_F_REQUEST | NLM_F_DUMP
    header[2] = number
    header[3] = 0
    memcpy(p, header, 16)
    p[16] = <unsigned char>command
    p[17] = 1
    p[18] = p[19] = 0
    if length:
        memcpy(p + 20, body, length)
    return out


def services_request(family, sequence):
    """The dump request of every virtual service (IPVS_CMD_GET_SERVICE)."""
    return _dump(family, sequence, IPVS_CMD_GET_SERVICE, NULL, 0)


def servers_request(family, sequence, protocol, address, port):
    """The dump request of one virtual service's real servers (IPVS_CMD_GET_DEST)."""
    cdef unsigned char body[4 + KEY_MAX]
    cdef int af
    cdef Py_ssize_t length = _key(body + 4, protocol, address, port, &af)
    _put_header(body, 4 + length, CMD_SERVICE)
    return _dump(family, sequence, IPVS_CMD_GET_DEST, body, 4 + length)


# --- Dumps ---------------------------------------------------------------------------------


cdef object _address_text(const unsigned char* buf, Py_ssize_t start, Py_ssize_t end, int family):
    """An address attribute's text (the pure twin's `_address`)."""
    cdef char text[48]
    cdef Py_ssize_t n
    if family != C_AF_INET and family != C_AF_INET6:
        raise CodecError(f"address family {family} is neither IPv4 nor IPv6")
    if end - start < (4 if family == C_AF_INET else 16):
        raise CodecError("an address attribute is too short")
    n = _write_address(text, family, buf + start)
    return PyUnicode_DecodeASCII(text, n, NULL)


cdef int _slots(
    const unsigned char* buf, Py_ssize_t start, Py_ssize_t end, Py_ssize_t* first,
    Py_ssize_t* last, int count
) except -1:
    """Where each attribute of a type below `count` lies in buf[start:end], the last of a
    type (first -1: none); as the pure twin's `_attrs`, an attribute running past the end
    raises."""
    cdef Py_ssize_t length
    cdef int kind, i
    for i in range(count):
        first[i] = -1
    while start + 4 <= end:
        length = _u16(buf + start)
        if length < 4:
            break
        if start + length > end:
            raise CodecError("an attribute runs past its message")
        kind = _u16(buf + start + 2) & 0x3FFF
        if kind < count:
            first[kind] = start + 4
            last[kind] = start + length
        start += _align4(length)
    return 0


cdef uint64_t _read(const unsigned char* buf, Py_ssize_t* first, Py_ssize_t* last, int kind,
                    int size, bint big) except? 0xFFFFFFFFFFFFFFFF:
    """A number attribute's value (0 if missing): u16, be16 (`big`) or u32."""
    if first[kind] < 0:
        return 0
    if last[kind] - first[kind] < size:
        raise CodecError("a number attribute is too short")
    if size == 4:
        return _u32(buf + first[kind])
    if big:
        return (<uint64_t>buf[first[kind]] << 8) | buf[first[kind] + 1]
    return _u16(buf + first[kind])


cdef class _Dump:
    """One dump's answers, read message by message as they are received."""

    cdef list _out
    cdef public object done
    cdef int _command
    cdef int _nest

    def __cinit__(self, *args, **kwargs):
        self._out = []
        self.done = False

    def feed(self, data):
        """Parse one `recv`'s messages; True once the dump is complete. A dump the kernel
        refused raises OSError with its errno."""
        cdef const unsigned char* buf
        cdef Py_ssize_t n, offset = 0, end, start
        cdef Py_ssize_t first[SLOTS]
        cdef Py_ssize_t last[SLOTS]
        cdef uint32_t length
        cdef uint16_t kind
        cdef int32_t code
        cdef int64_t errno_value
        if type(data) is not bytes:
            data = bytes(data)
        buf = <const unsigned char*>PyBytes_AS_STRING(data)
        n = PyBytes_GET_SIZE(data)
        while offset + 16 <= n:
            length = _u32(buf + offset)
            kind = _u16(buf + offset + 4)
            if length < 16 or offset + <Py_ssize_t>length > n:
                raise CodecError("truncated netlink message")
            end = offset + <Py_ssize_t>length
            if kind == NLMSG_DONE:
                self.done = True
            elif kind == NLMSG_ERROR:
                if length < 20:
                    raise CodecError("truncated netlink message")
                memcpy(&code, buf + offset + 16, 4)
                errno_value = -<int64_t>code
                if errno_value:
                    raise OSError(errno_value, f"IPVS dump refused: {os.strerror(errno_value)}")
            elif kind >= NLMSG_MIN_TYPE and length >= 20 and buf[offset + 16] == self._command:
                start = offset + 20
                _slots(buf, start, end, first, last, 3)
                if first[self._nest] < 0:
                    raise CodecError("an answer without its nested attributes")
                start, end = first[self._nest], last[self._nest]
                _slots(buf, start, end, first, last, SLOTS)
                self._out.append(self._entry(data, buf, first, last))
            offset += _align4(length)
        return self.done

    cdef object _entry(self, bytes data, const unsigned char* buf, Py_ssize_t* first,
                       Py_ssize_t* last):
        raise NotImplementedError


cdef class ServiceDump(_Dump):
    """Reads an IPVS_CMD_GET_SERVICE dump: (protocol, address, port, fwmark, scheduler,
    flags, persistence timeout) per virtual service; a fwmark service has address "" and
    protocol and port 0."""

    cdef dict _schedulers  # a scheduler attribute's bytes -> its name

    def __cinit__(self):
        self._command = IPVS_CMD_NEW_SERVICE
        self._nest = CMD_SERVICE
        self._schedulers = {}

    cdef object _entry(self, bytes data, const unsigned char* buf, Py_ssize_t* first,
                       Py_ssize_t* last):
        cdef int family
        cdef object address = "", scheduler = ""
        cdef Py_ssize_t end
        if first[SVC_AF] < 0:
            raise CodecError("a virtual service without its address family")
        family = <int>_read(buf, first, last, SVC_AF, 2, False)
        if first[SVC_ADDR] >= 0:
            address = _address_text(buf, first[SVC_ADDR], last[SVC_ADDR], family)
        if first[SVC_SCHED] >= 0:
            end = first[SVC_SCHED]
            while end < last[SVC_SCHED] and buf[end]:
                end += 1
            raw = PyBytes_FromStringAndSize(<char*>buf + first[SVC_SCHED], end - first[SVC_SCHED])
            scheduler = self._schedulers.get(raw)
            if scheduler is None:
                scheduler = self._schedulers[raw] = raw.decode("ascii", "replace")
        return (
            _read(buf, first, last, SVC_PROTOCOL, 2, False),
            address,
            _read(buf, first, last, SVC_PORT, 2, True),
            _read(buf, first, last, SVC_FWMARK, 4, False),
            scheduler,
            _read(buf, first, last, SVC_FLAGS, 4, False),
            _read(buf, first, last, SVC_TIMEOUT, 4, False),
        )

    def result(self):
        """The virtual services read, in the kernel's order."""
        return self._out


cdef class ServerDump(_Dump):
    """Reads an IPVS_CMD_GET_DEST dump: (address, port, forwarding method, weight, active
    connections, inactive connections) per real server. `version` (4 or 6) is the virtual
    service's: a kernel that does not name a real server's family gives it the service's."""

    cdef int _family

    def __init__(self, version):
        self._command = IPVS_CMD_NEW_DEST
        self._nest = CMD_DEST
        if version not in (4, 6):
            raise CodecError(f"IP version {version!r} is neither 4 nor 6")
        self._family = C_AF_INET if version == 4 else C_AF_INET6

    cdef object _entry(self, bytes data, const unsigned char* buf, Py_ssize_t* first,
                       Py_ssize_t* last):
        cdef int family = self._family
        if first[DEST_FAMILY] >= 0:
            family = <int>_read(buf, first, last, DEST_FAMILY, 2, False)
        if first[DEST_PORT] < 0:
            raise CodecError("a real server without its port")
        if first[DEST_ADDR] < 0:
            raise CodecError("an answer without an address")
        return (
            _address_text(buf, first[DEST_ADDR], last[DEST_ADDR], family),
            _read(buf, first, last, DEST_PORT, 2, True),
            _read(buf, first, last, DEST_FWD, 4, False),
            _read(buf, first, last, DEST_WEIGHT, 4, False),
            _read(buf, first, last, DEST_ACTIVE, 4, False),
            _read(buf, first, last, DEST_INACTIVE, 4, False),
        )

    def result(self):
        """The real servers read, in the kernel's order."""
        return self._out
