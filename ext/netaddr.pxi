# Addresses in C for both codecs (`include`d by ext/nftcodec.pyx and ext/ipvscodec.pyx): text
# read by `inet_pton`, and written back as `ipaddress` writes it, so that each compiled twin
# reads and writes the same text as its pure twin does through `ipaddress`.

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport uint32_t
from libc.string cimport memcpy

import ipaddress

cdef extern from "<arpa/inet.h>" nogil:
    int inet_pton(int af, const char* src, void* dst)

cdef extern from "<sys/socket.h>" nogil:
    enum:
        C_AF_INET "AF_INET"
        C_AF_INET6 "AF_INET6"

cdef const char* HEX = "0123456789abcdef"


cdef int _pton(int family, const char* s, Py_ssize_t n, unsigned char* out) noexcept nogil:
    """The address s[:n] of `family` as its bytes at out (16 bytes of room): their number, or
    0 where `inet_pton` does not read it (the caller's Python path then reads it, or raises)."""
    cdef char text[48]
    cdef Py_ssize_t i
    if n > 45:
        return 0
    for i in range(n):
        if s[i] == 0:  # inet_pton would stop there; ipaddress reads it as a bad address
            return 0
        text[i] = s[i]
    text[n] = 0
    if inet_pton(family, text, out) != 1:
        return 0
    return 4 if family == C_AF_INET else 16


cdef Py_ssize_t _write_u32(char* p, uint32_t value) noexcept nogil:
    """str(value) at p: its length."""
    cdef char digits[10]
    cdef Py_ssize_t n = 0, i
    while True:
        digits[n] = <char>(c'0' + value % 10)
        n += 1
        value //= 10
        if value == 0:
            break
    for i in range(n):
        p[i] = digits[n - 1 - i]
    return n


cdef Py_ssize_t _write_hextet(char* p, uint32_t value) noexcept nogil:
    """'%x' % value, for a value below 0x10000."""
    cdef Py_ssize_t n = 0, shift
    cdef bint started = False
    for shift in range(12, -4, -4):
        if started or (value >> shift) & 0xF or shift == 0:
            p[n] = HEX[(value >> shift) & 0xF]
            n += 1
            started = True
    return n


cdef Py_ssize_t _write_ipv6(char* p, const unsigned char* raw) noexcept nogil:
    """str(IPv6Address(raw)) as Python 3.11 writes it (_write_address leaves IPv4-mapped ones
    to Python): the first longest run of two or more zero hextets compressed."""
    cdef uint32_t hextets[8]
    cdef int i, best_start = -1, best_length = 0, start = -1, length = 0, end
    cdef Py_ssize_t n = 0
    for i in range(8):
        hextets[i] = (<uint32_t>raw[2 * i] << 8) | raw[2 * i + 1]
        if hextets[i] == 0:
            length += 1
            if start == -1:
                start = i
            if length > best_length:
                best_length = length
                best_start = start
        else:
            length = 0
            start = -1
    if best_length < 2:
        for i in range(8):
            if i:
                p[n] = c':'
                n += 1
            n += _write_hextet(p + n, hextets[i])
        return n
    end = best_start + best_length
    for i in range(best_start):
        n += _write_hextet(p + n, hextets[i])
        p[n] = c':'
        n += 1
    if best_start == 0:
        p[n] = c':'
        n += 1
    p[n] = c':'
    n += 1
    for i in range(end, 8):
        n += _write_hextet(p + n, hextets[i])
        if i < 7:
            p[n] = c':'
            n += 1
    return n


cdef inline bint _mapped(const unsigned char* raw) noexcept nogil:
    cdef int i
    for i in range(10):
        if raw[i]:
            return False
    return raw[10] == 0xFF and raw[11] == 0xFF


cdef Py_ssize_t _write_address(char* p, int family, const unsigned char* raw) except -1:
    """str(ip_address(raw)) at p (at most 45 characters; raw: 4 bytes for C_AF_INET, else 16):
    its length. IPv4-mapped IPv6 addresses are written by `ipaddress`: their text depends on
    the Python version."""
    cdef Py_ssize_t n = 0, i
    cdef bytes text
    if family == C_AF_INET:
        for i in range(4):
            if i:
                p[n] = c'.'
                n += 1
            n += _write_u32(p + n, raw[i])
        return n
    if _mapped(raw):
        text = str(ipaddress.ip_address(PyBytes_FromStringAndSize(<char*>raw, 16))).encode()
        n = len(text)
        memcpy(p, PyBytes_AS_STRING(text), n)
        return n
    return _write_ipv6(p, raw)
