# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled twin of lace_proxy/model/_pyplain.py: endpoints as the EndpointSlice
controller writes them, the same answers (tests/unit/test_model.py holds the twins equal).

A 30k-service list holds 300k endpoints, and the pure twin spent most of its time in two
places this one does in C: the address's canonical text (read by `inet_pton`, written as
`ipaddress` writes it, and the given str itself when it already is that text) and the frozen
dataclass's `__init__` (here the slots are set directly, as its `__init__` sets them). The
deprecated IPv4-compatible addresses (::/96) are left to the pure `canonical_ip`.
"""

from libc.string cimport memchr, memcmp

from lace_proxy.model.endpointslice import Endpoint
from lace_proxy.model.fields import canonical_ip

include "netaddr.pxi"  # addresses read and written in C: shared with the codecs

cdef extern from "Python.h":
    int PyObject_GenericSetAttr(object o, object name, object value) except -1
    const char* PyUnicode_AsUTF8AndSize(object text, Py_ssize_t* size) except NULL

IMPLEMENTATION = "compiled"

cdef object _new = object.__new__


cdef inline bint _compatible(const unsigned char* raw) noexcept nogil:
    """In ::/96 (IPv4-compatible, `::` and `::1` included)."""
    cdef int i
    for i in range(12):
        if raw[i]:
            return False
    return True


cdef object _canonical(str text, int version):
    """The canonical text of `text` if it is an IP address of `version`, else None."""
    cdef Py_ssize_t n, m
    cdef const char* s
    cdef unsigned char raw[16]
    cdef char out[48]
    try:
        s = PyUnicode_AsUTF8AndSize(text, &n)
    except UnicodeError:  # a lone surrogate: no address
        return None
    if memchr(s, c':', n) == NULL:
        if version != 4 or _pton(C_AF_INET, s, n, raw) == 0:
            return None
        return text  # inet_pton takes only the canonical dotted quad
    if _pton(C_AF_INET6, s, n, raw) == 0:
        return None
    if _mapped(raw):
        if version != 4:
            return None
        m = _write_address(out, C_AF_INET, raw + 12)
    elif version != 6:
        return None
    elif _compatible(raw):
        return canonical_ip(text)[1]
    else:
        m = _write_ipv6(out, raw)
    if m == n and memcmp(out, s, n) == 0:
        return text
    return out[:m].decode("ascii")


def plain_endpoint(value, version):
    """The endpoint as the EndpointSlice controller writes it, else None (see _pyplain)."""
    cdef dict entry
    cdef list raw
    cdef Py_ssize_t i, count
    cdef int family
    if type(value) is not dict or version is None:
        return None
    entry = <dict>value
    if entry.get("hints") is not None:
        return None
    addresses = entry.get("addresses")
    if type(addresses) is not list:
        return None
    raw = <list>addresses
    count = len(raw)
    if count == 0:
        return None
    family = version
    canonical = [None] * count
    for i in range(count):
        text = raw[i]
        if type(text) is not str:
            return None
        address = _canonical(<str>text, family)
        if address is None:
            return None
        canonical[i] = address
    conditions = entry.get("conditions")
    if conditions is None:
        ready = serving = True
        terminating = False
    elif type(conditions) is not dict:
        return None
    else:
        ready = (<dict>conditions).get("ready", None)
        serving = (<dict>conditions).get("serving", None)
        terminating = (<dict>conditions).get("terminating", None)
        if ready is None:
            ready = True
        if serving is None:
            serving = True
        if terminating is None:
            terminating = False
        if type(ready) is not bool or type(serving) is not bool or type(terminating) is not bool:
            return None
    node = entry.get("nodeName")
    zone = entry.get("zone")
    if (node is not None and type(node) is not str) or (zone is not None and type(zone) is not str):
        return None
    endpoint = _new(Endpoint)
    PyObject_GenericSetAttr(endpoint, "addresses", tuple(canonical))
    PyObject_GenericSetAttr(endpoint, "ready", ready)
    PyObject_GenericSetAttr(endpoint, "serving", serving)
    PyObject_GenericSetAttr(endpoint, "terminating", terminating)
    PyObject_GenericSetAttr(endpoint, "node_name", node or None)
    PyObject_GenericSetAttr(endpoint, "zone", zone or None)
    PyObject_GenericSetAttr(endpoint, "hint_zones", None)
    PyObject_GenericSetAttr(endpoint, "hint_nodes", None)
    return endpoint
