# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled service table: the same API and semantics as lace_proxy/table/_pytable.py.

What makes it fast:

- each slice is digested once on arrival into C arrays (endpoint IPs, one flag byte per
  endpoint folding conditions, locality and topology-hint matches, the usable ports), so
  merging and categorizing a service port are C loops;
- a Backend is made once per (slice, port, endpoint) and cached in the slice's digest, so a
  rebuild of a service whose slices did not change reuses them, and the cluster and local
  sets of one plan share them;
- the cyclic GC is kept out of the way: Backend, Plan and the digests cannot form cycles and
  are not tracked, and a build allocates few tracked containers (about one backend tuple
  per plan; a service's single slice or single plan is held as itself, not in a dict), so a
  30k-service build triggers no full collection;
- the model's frozen slots dataclasses are read through their slot offsets (looked up once
  from the class's member descriptors), not attribute lookups; any other type, or an unset
  slot, takes the ordinary getattr path with the same result.
"""

cimport cython
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.unicode cimport PyUnicode_DATA, PyUnicode_GET_LENGTH, PyUnicode_KIND
from libc.string cimport memcmp, memset

from types import MemberDescriptorType

from lace_proxy.model.endpointslice import Endpoint, EndpointPort, EndpointSlice
from lace_proxy.model.service import Service, ServicePort
from lace_proxy.table.changeset import Changeset, plan_frontends
from lace_proxy.table.claims import describe_conflicts, format_key

import logging

log = logging.getLogger("lace_proxy.table")

IMPLEMENTATION = "compiled"

cdef extern from "Python.h":
    ctypedef struct PyMemberDef:
        int type
        Py_ssize_t offset
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member

cdef enum:
    F_READY = 1
    F_SERVING = 2
    F_TERMINATING = 4
    F_LOCAL = 8
    F_ZONE_HINTED = 16
    F_ZONE_MATCH = 32
    F_NODE_HINTED = 64
    F_NODE_MATCH = 128
    SLOT_OBJECT = 16  # structmember.h's T_OBJECT_EX: what __slots__ members are
    SMALL_SLICE = 32  # up to this many endpoints, uniqueness is checked pairwise


# --- fast field access for the model's slots dataclasses ----------------------------------------

cdef extern from *:
    """
    /* The object in a __slots__ member of `o` at `offset` (borrowed; NULL when unset). */
    #define lace_slot(o, offset) (*(PyObject **)((char *)(o) + (offset)))
    """
    PyObject* lace_slot(PyObject* o, Py_ssize_t offset)


cdef Py_ssize_t _offset(type cls, str name) except -2:
    """The slot offset of `cls.name`, or -1 when it is not a plain __slots__ member."""
    descr = cls.__dict__.get(name)
    if type(descr) is not MemberDescriptorType:
        return -1
    cdef PyMemberDef* member = (<PyMemberDescrObject*>descr).d_member
    return member.offset if member.type == SLOT_OBJECT else -1


cdef inline object _field(object obj, bint exact, Py_ssize_t offset, str name):
    """obj.name; straight from the slot when `obj` is exactly the class the offset is for."""
    cdef PyObject* value
    if exact and offset >= 0:
        value = lace_slot(<PyObject*>obj, offset)
        if value != NULL:
            return <object>value
    return _getattr(obj, name)


cdef object _getattr(object obj, str name):
    """Other types, and an unset slot (which raises AttributeError as getattr does)."""
    return getattr(obj, name)


cdef type EndpointType = Endpoint, EndpointPortType = EndpointPort
cdef type EndpointSliceType = EndpointSlice, ServiceType = Service, ServicePortType = ServicePort
cdef Py_ssize_t EP_ADDRESSES = _offset(Endpoint, "addresses")
cdef Py_ssize_t EP_READY = _offset(Endpoint, "ready")
cdef Py_ssize_t EP_SERVING = _offset(Endpoint, "serving")
cdef Py_ssize_t EP_TERMINATING = _offset(Endpoint, "terminating")
cdef Py_ssize_t EP_NODE = _offset(Endpoint, "node_name")
cdef Py_ssize_t EP_HINT_ZONES = _offset(Endpoint, "hint_zones")
cdef Py_ssize_t EP_HINT_NODES = _offset(Endpoint, "hint_nodes")
cdef bint ENDPOINT_SLOTS = min(EP_ADDRESSES, EP_READY, EP_SERVING, EP_TERMINATING, EP_NODE,
                               EP_HINT_ZONES, EP_HINT_NODES) >= 0
cdef Py_ssize_t PORT_NAME = _offset(EndpointPort, "name")
cdef Py_ssize_t PORT_PROTOCOL = _offset(EndpointPort, "protocol")
cdef Py_ssize_t PORT_PORT = _offset(EndpointPort, "port")
cdef Py_ssize_t SL_NAMESPACE = _offset(EndpointSlice, "namespace")
cdef Py_ssize_t SL_NAME = _offset(EndpointSlice, "name")
cdef Py_ssize_t SL_SERVICE = _offset(EndpointSlice, "service_name")
cdef Py_ssize_t SL_ADDRESS_TYPE = _offset(EndpointSlice, "address_type")
cdef Py_ssize_t SL_ENDPOINTS = _offset(EndpointSlice, "endpoints")
cdef Py_ssize_t SL_PORTS = _offset(EndpointSlice, "ports")
cdef Py_ssize_t SVC_NAMESPACE = _offset(Service, "namespace")
cdef Py_ssize_t SVC_NAME = _offset(Service, "name")
cdef Py_ssize_t SVC_TYPE = _offset(Service, "type")
cdef Py_ssize_t SVC_CLUSTER_IPS = _offset(Service, "cluster_ips")
cdef Py_ssize_t SVC_PORTS = _offset(Service, "ports")
cdef Py_ssize_t SVC_EXTERNAL_IPS = _offset(Service, "external_ips")
cdef Py_ssize_t SVC_LB_IPS = _offset(Service, "lb_ingress_ips")
cdef Py_ssize_t SVC_LB_RANGES = _offset(Service, "lb_source_ranges")
cdef Py_ssize_t SVC_ETP = _offset(Service, "external_traffic_policy")
cdef Py_ssize_t SVC_ITP = _offset(Service, "internal_traffic_policy")
cdef Py_ssize_t SVC_AFFINITY = _offset(Service, "session_affinity")
cdef Py_ssize_t SVC_AFFINITY_TIMEOUT = _offset(Service, "affinity_timeout")
cdef Py_ssize_t SVC_HC_PORT = _offset(Service, "health_check_node_port")
cdef Py_ssize_t SVC_HEADLESS = _offset(Service, "headless")
cdef Py_ssize_t SVC_PROXY_NAME = _offset(Service, "proxy_name")
cdef Py_ssize_t SVC_SCHEDULER = _offset(Service, "ipvs_scheduler")
cdef Py_ssize_t SVC_BGP = _offset(Service, "bgp")
cdef Py_ssize_t SP_NAME = _offset(ServicePort, "name")
cdef Py_ssize_t SP_PROTOCOL = _offset(ServicePort, "protocol")
cdef Py_ssize_t SP_PORT = _offset(ServicePort, "port")
cdef Py_ssize_t SP_NODE_PORT = _offset(ServicePort, "node_port")


cdef inline str _join_key(object namespace, object name):
    """f"{namespace}/{name}" as the model's `key` properties make it."""
    if type(namespace) is str and type(name) is str:
        return f"{<str>namespace}/{<str>name}"
    return f"{namespace}/{name}"


cdef inline str _slice_key(object sl, bint exact):
    if exact:
        return _join_key(_field(sl, True, SL_NAMESPACE, "namespace"),
                         _field(sl, True, SL_NAME, "name"))
    return sl.key


cdef inline str _slice_service_key(object sl, bint exact):
    if exact:
        return _join_key(_field(sl, True, SL_NAMESPACE, "namespace"),
                         _field(sl, True, SL_SERVICE, "service_name"))
    return sl.service_key


# --- output types ---------------------------------------------------------------------------------

@cython.no_gc
cdef class Backend:
    """One endpoint a frontend may forward to, with the conditions it was chosen under.

    Untracked by the cyclic GC (it holds only a str and ints, so it cannot form a cycle):
    at 300k backends, GC passes over them would cost more than building them. Immutable,
    so one object is shared by every plan (and rebuild) that selects the same endpoint.
    """

    cdef readonly str ip
    cdef readonly int port
    cdef readonly bint local, ready, serving, terminating

    def __init__(self, str ip, int port, bint local, bint ready, bint serving,
                 bint terminating):
        self.ip = ip
        self.port = port
        self.local = local
        self.ready = ready
        self.serving = serving
        self.terminating = terminating

    def __richcmp__(self, other, int op):
        if op != 2 and op != 3:
            return NotImplemented
        if not isinstance(other, Backend):
            return NotImplemented
        cdef Backend o = <Backend>other
        cdef bint eq = (self.port == o.port and self.local == o.local
                        and self.ready == o.ready and self.serving == o.serving
                        and self.terminating == o.terminating and self.ip == o.ip)
        return eq if op == 2 else not eq

    def __hash__(self):
        return hash((self.ip, self.port, self.local, self.ready, self.serving,
                     self.terminating))

    def __repr__(self):
        return (f"Backend(ip={self.ip!r}, port={self.port}, local={self.local}, "
                f"ready={self.ready}, serving={self.serving}, "
                f"terminating={self.terminating})")


@cython.no_gc
cdef class Plan:
    """Everything the dataplane needs for one service port in one IP family.

    See the pure twin's Plan for the meaning of each field.
    """

    cdef readonly str id, service, port_name, protocol, cluster_ip
    cdef readonly int family, port, node_port, affinity_timeout, health_check_node_port
    cdef readonly tuple external_ips, lb_ips, lb_source_ranges
    cdef readonly tuple cluster_backends, local_backends, standby_backends
    cdef readonly bint internal_local, external_local
    cdef readonly object internal_verdict, external_verdict
    cdef readonly object access  # Access | None
    cdef readonly str scheduler  # "" for the configured default
    cdef readonly object bgp  # BgpAnnotations | None

    @property
    def internal_backends(self):
        return self.local_backends if self.internal_local else self.cluster_backends

    @property
    def external_backends(self):
        return self.local_backends if self.external_local else self.cluster_backends

    def frontends(self):
        """Each address . protocol . port this plan answers on, ClusterIP first."""
        return plan_frontends(self)

    def __richcmp__(self, other, int op):
        if op != 2 and op != 3:
            return NotImplemented
        if not isinstance(other, Plan):
            return NotImplemented
        cdef bint eq = _plan_eq(self, <Plan>other)
        return eq if op == 2 else not eq

    def __hash__(self):
        return hash((self.id, self.cluster_backends, self.local_backends))

    def __repr__(self):
        return f"Plan(id={self.id!r}, cluster_backends={len(self.cluster_backends)})"


cdef bint _plan_eq(Plan a, Plan b):
    return (a.family == b.family and a.port == b.port and a.node_port == b.node_port
            and a.affinity_timeout == b.affinity_timeout
            and a.health_check_node_port == b.health_check_node_port
            and a.internal_local == b.internal_local and a.external_local == b.external_local
            and a.id == b.id and a.service == b.service and a.port_name == b.port_name
            and a.protocol == b.protocol and a.cluster_ip == b.cluster_ip
            and a.internal_verdict == b.internal_verdict
            and a.external_verdict == b.external_verdict
            and a.external_ips == b.external_ips and a.lb_ips == b.lb_ips
            and a.lb_source_ranges == b.lb_source_ranges
            and a.cluster_backends == b.cluster_backends
            and a.local_backends == b.local_backends
            and a.standby_backends == b.standby_backends
            and a.scheduler == b.scheduler
            and a.bgp == b.bgp
            and (a.access is b.access or a.access == b.access))


# --- slice digests --------------------------------------------------------------------------------

@cython.no_gc
cdef class _Slice:
    """A slice digested for this node: C arrays of endpoint IPs, flags, ports and backends.

    Untracked by the GC: it owns only strings, Backends and the (immutable) model slice.
    """

    cdef object source  # the model EndpointSlice
    cdef str key, name, service_key
    cdef int family  # 4, 6, or 0 (FQDN: never proxied)
    cdef Py_ssize_t n  # endpoints
    cdef Py_ssize_t nports  # usable ports (port number set)
    cdef PyObject** ips  # n owned references
    cdef unsigned char* flags  # n
    cdef PyObject** port_names  # nports owned references
    cdef PyObject** port_protocols  # nports owned references
    cdef int* port_numbers  # nports
    cdef PyObject** backends  # nports * n owned references, NULL until first selected
    cdef bint unique  # no IP appears twice
    cdef void* block  # the one allocation all the arrays above live in

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.block == NULL:
            return
        for i in range(self.n):
            Py_XDECREF(self.ips[i])
        for i in range(self.nports):
            Py_XDECREF(self.port_names[i])
            Py_XDECREF(self.port_protocols[i])
        for i in range(self.nports * self.n):
            Py_XDECREF(self.backends[i])
        PyMem_Free(self.block)


cdef inline bint _truth(object value) except -1:
    if value is True:
        return True
    if value is False or value is None:
        return False
    return bool(value)


cdef void* _alloc(Py_ssize_t count, size_t size) except NULL:
    cdef void* p = PyMem_Malloc(size * (count if count > 0 else 1))
    if p == NULL:
        raise MemoryError()
    return p




cdef inline int _flag_of(PyObject* value, unsigned char flag) except -1:
    """`flag` if the condition is truthy (the model holds real bools: identity decides)."""
    if value == <PyObject*>True:
        return flag
    if value == <PyObject*>False or value == <PyObject*>None:
        return 0
    return flag if <bint>(<object>value) else 0


cdef inline int _hint_flags(object hints, object wanted, unsigned char hinted,
                            unsigned char match) except -1:
    if hints is None or not hints:
        return 0
    return hinted | (match if wanted is not None and wanted in hints else 0)


cdef bint _endpoint_fast(PyObject* ep, str node, object zone, PyObject** address,
                         unsigned char* flags) except -1:
    """Digest an exact model Endpoint straight from its slots; False if a slot is unset."""
    cdef PyObject* addresses = lace_slot(ep, EP_ADDRESSES)
    cdef PyObject* ready = lace_slot(ep, EP_READY)
    cdef PyObject* serving = lace_slot(ep, EP_SERVING)
    cdef PyObject* terminating = lace_slot(ep, EP_TERMINATING)
    cdef PyObject* node_name = lace_slot(ep, EP_NODE)
    cdef PyObject* zones = lace_slot(ep, EP_HINT_ZONES)
    cdef PyObject* nodes = lace_slot(ep, EP_HINT_NODES)
    cdef int f
    if (addresses == NULL or ready == NULL or serving == NULL or terminating == NULL
            or node_name == NULL or zones == NULL or nodes == NULL):
        return False
    first = (<object>addresses)[0]
    f = (_flag_of(ready, F_READY) | _flag_of(serving, F_SERVING)
         | _flag_of(terminating, F_TERMINATING))
    if node_name == <PyObject*>node or (
            node_name != <PyObject*>None and <object>node_name == node):
        f |= F_LOCAL
    if zones != <PyObject*>None:
        f |= _hint_flags(<object>zones, zone, F_ZONE_HINTED, F_ZONE_MATCH)
    if nodes != <PyObject*>None:
        f |= _hint_flags(<object>nodes, node, F_NODE_HINTED, F_NODE_MATCH)
    Py_INCREF(first)
    address[0] = <PyObject*>first
    flags[0] = <unsigned char>f
    return True


cdef int _endpoint_slow(object ep, str node, object zone, PyObject** address,
                        unsigned char* flags) except -1:
    """Digest any endpoint-like object through ordinary attribute access."""
    first = ep.addresses[0]
    cdef int f = 0
    if ep.ready:
        f |= F_READY
    if ep.serving:
        f |= F_SERVING
    if ep.terminating:
        f |= F_TERMINATING
    if ep.node_name == node:
        f |= F_LOCAL
    f |= _hint_flags(ep.hint_zones, zone, F_ZONE_HINTED, F_ZONE_MATCH)
    f |= _hint_flags(ep.hint_nodes, node, F_NODE_HINTED, F_NODE_MATCH)
    Py_INCREF(first)
    address[0] = <PyObject*>first
    flags[0] = <unsigned char>f
    return 0


cdef _Slice _digest(object sl, str key, str node, object zone):
    cdef _Slice d = _Slice.__new__(_Slice)
    cdef bint exact = type(sl) is EndpointSliceType
    cdef bint p_exact
    cdef Py_ssize_t i, count
    cdef unsigned char f = 0
    cdef PyObject* address_ref = NULL
    cdef object ep, p, number, address_type
    cdef tuple endpoints, ports
    d.source = sl
    d.key = key
    d.name = _field(sl, exact, SL_NAME, "name")
    address_type = _field(sl, exact, SL_ADDRESS_TYPE, "address_type")
    d.family = 4 if address_type == "IPv4" else (6 if address_type == "IPv6" else 0)

    ports = tuple(_field(sl, exact, SL_PORTS, "ports"))
    endpoints = tuple(_field(sl, exact, SL_ENDPOINTS, "endpoints"))
    cdef Py_ssize_t nports = len(ports)  # an upper bound on the usable ones
    count = len(endpoints)
    cdef Py_ssize_t pointers = 2 * nports + count + nports * count
    cdef size_t size = pointers * sizeof(PyObject*) + nports * sizeof(int) + count
    d.block = PyMem_Malloc(size if size > 0 else 1)
    if d.block == NULL:
        raise MemoryError()
    memset(d.block, 0, pointers * sizeof(PyObject*))  # what __dealloc__ may release
    d.port_names = <PyObject**>d.block
    d.port_protocols = d.port_names + nports
    d.ips = d.port_protocols + nports
    d.backends = d.ips + count
    d.port_numbers = <int*>(d.backends + nports * count)
    d.flags = <unsigned char*>(d.port_numbers + nports)
    d.n = count
    d.nports = 0
    for p in ports:
        p_exact = type(p) is EndpointPortType
        number = _field(p, p_exact, PORT_PORT, "port")
        if number is None:
            continue
        name = _field(p, p_exact, PORT_NAME, "name")
        protocol = _field(p, p_exact, PORT_PROTOCOL, "protocol")
        d.port_numbers[d.nports] = number
        Py_INCREF(name)
        Py_INCREF(protocol)
        d.port_names[d.nports] = <PyObject*>name
        d.port_protocols[d.nports] = <PyObject*>protocol
        d.nports += 1
    # Backends are indexed [port j * n + endpoint i] over the usable ports only.
    for i in range(count):
        ep = endpoints[i]
        if not (ENDPOINT_SLOTS and type(ep) is EndpointType
                and _endpoint_fast(<PyObject*>ep, node, zone, &address_ref, &f)):
            _endpoint_slow(ep, node, zone, &address_ref, &f)
        d.ips[i] = address_ref  # a new reference
        d.flags[i] = f
    d.unique = _all_distinct(d.ips, count)
    return d


cdef bint _all_distinct(PyObject** ips, Py_ssize_t n) except -1:
    """Whether no IP repeats. Small slices of plain strings compare lengths and bytes
    pairwise (no hashing, no set); anything else goes through a set."""
    cdef Py_ssize_t i, j, length
    cdef int kind
    if n < 2:
        return True
    if n <= SMALL_SLICE:
        for i in range(n):
            if type(<object>ips[i]) is not str:
                break
        else:
            for i in range(1, n):
                length = PyUnicode_GET_LENGTH(<object>ips[i])
                kind = PyUnicode_KIND(<object>ips[i])
                for j in range(i):
                    if (PyUnicode_GET_LENGTH(<object>ips[j]) == length
                            and PyUnicode_KIND(<object>ips[j]) == kind
                            and memcmp(PyUnicode_DATA(<object>ips[i]),
                                       PyUnicode_DATA(<object>ips[j]), length * kind) == 0):
                        return False
            return True
    return len({<object>ips[i] for i in range(n)}) == n


cdef inline bint _better(unsigned char cand, unsigned char prev):
    """Dedupe: a non-terminating duplicate beats a terminating one, then local beats remote."""
    if (cand & F_TERMINATING) != (prev & F_TERMINATING):
        return (prev & F_TERMINATING) != 0
    return (cand & F_LOCAL) != 0 and (prev & F_LOCAL) == 0


# --- merge and categorize -------------------------------------------------------------------------

ctypedef struct Cand:
    PyObject* ip  # borrowed from a _Slice, alive for the build
    PyObject** backend  # the _Slice's cache slot for this (port, endpoint)
    int port
    unsigned char flags


cdef Backend _backend(Cand* c):
    """The cached Backend of a candidate, made on first use."""
    cdef Backend b
    if c.backend[0] != NULL:
        return <Backend>c.backend[0]
    b = Backend.__new__(Backend)
    b.ip = <str>c.ip
    b.port = c.port
    b.local = (c.flags & F_LOCAL) != 0
    b.ready = (c.flags & F_READY) != 0
    b.serving = (c.flags & F_SERVING) != 0
    b.terminating = (c.flags & F_TERMINATING) != 0
    Py_INCREF(b)
    c.backend[0] = <PyObject*>b
    return b


cdef int _topology_mode(Cand* cands, Py_ssize_t n):
    """0: no topology, 1: zone hints, 2: node hints (as kube-proxy's topologyModeFromHints)."""
    cdef bint all_node = True, all_zone = True, for_node = False, for_zone = False
    cdef bint seen = False
    cdef unsigned char f
    cdef Py_ssize_t i
    for i in range(n):
        f = cands[i].flags
        if not (f & F_READY):
            continue
        seen = True
        if not (f & F_NODE_HINTED):
            all_node = False
        elif f & F_NODE_MATCH:
            for_node = True
        if not (f & F_ZONE_HINTED):
            all_zone = False
        elif f & F_ZONE_MATCH:
            for_zone = True
    if not seen:
        return 0
    if all_node and for_node:
        return 2
    if all_zone and for_zone:
        return 1
    return 0


cdef inline bint _chosen(unsigned char f, unsigned char need, int mode):
    """All of `need` set, and available under the topology mode."""
    if (f & need) != need:
        return False
    if mode == 1:
        return (f & F_ZONE_MATCH) != 0
    if mode == 2:
        return (f & F_NODE_MATCH) != 0
    return True


cdef inline bint _on_standby(unsigned char f, unsigned char cluster_need, int mode,
                             unsigned char local_need):
    """Serving, yet chosen by neither selection (`cluster_need` under `mode`, `local_need`;
    0: that selection was not made)."""
    if not (f & F_SERVING):
        return False
    if cluster_need and _chosen(f, cluster_need, mode):
        return False
    return not (local_need and _chosen(f, local_need, 0))


cdef tuple _standby(Cand* cands, Py_ssize_t n, unsigned char cluster_need, int mode,
                    unsigned char local_need):
    """The backends _on_standby, in candidate order; () (no allocation) when none is."""
    cdef Py_ssize_t i, k = 0, count = 0
    cdef tuple out
    cdef Backend b
    for i in range(n):
        if _on_standby(cands[i].flags, cluster_need, mode, local_need):
            count += 1
    if count == 0:
        return ()
    out = PyTuple_New(count)
    for i in range(n):
        if _on_standby(cands[i].flags, cluster_need, mode, local_need):
            b = _backend(&cands[i])
            Py_INCREF(b)
            PyTuple_SET_ITEM(out, k, b)
            k += 1
    return out


cdef tuple _select(Cand* cands, Py_ssize_t n, unsigned char need, int mode):
    """The backends whose flags include `need`, in candidate order: one tuple, no list."""
    cdef Py_ssize_t i, k = 0, count = 0
    cdef tuple out
    cdef Backend b
    for i in range(n):
        if _chosen(cands[i].flags, need, mode):
            count += 1
    if count == 0:
        return ()
    out = PyTuple_New(count)
    for i in range(n):
        if _chosen(cands[i].flags, need, mode):
            b = _backend(&cands[i])
            Py_INCREF(b)
            PyTuple_SET_ITEM(out, k, b)
            k += 1
    return out


cdef inline int _family(str address):
    return 6 if ":" in address else 4


cdef tuple _of_family(object addresses, int family):
    """The addresses (or CIDRs) of one family; the input tuple itself when all match."""
    cdef tuple items = tuple(addresses)
    cdef Py_ssize_t n = len(items), matching = 0
    for a in items:
        if _family(a) == family:
            matching += 1
    if matching == n:
        return items
    return tuple([a for a in items if _family(a) == family])


cdef bint _proxied(object svc) except -1:
    """Service.proxied, read from the slots (keep in step with the model's property;
    test_services_kube_proxy_skips_have_no_plans covers each case)."""
    return bool(_field(svc, True, SVC_CLUSTER_IPS, "cluster_ips")) and not (
        _truth(_field(svc, True, SVC_HEADLESS, "headless"))
        or _field(svc, True, SVC_TYPE, "type") == "ExternalName"
        or _field(svc, True, SVC_PROXY_NAME, "proxy_name") is not None)


cdef inline int _addr_family(str address):
    return 6 if ":" in address else 4


cdef set _service_keys(object svc):
    """Every frontend a service would answer on (claims.service_frontend_keys, compiled)."""
    cdef set keys = set()
    if not _proxied(svc):
        return keys
    cdef str svc_type = svc.type
    cdef bint external_capable = svc_type == "NodePort" or svc_type == "LoadBalancer"
    cdef int family
    cdef list addresses
    cdef str cluster_ip, a
    cdef tuple external = svc.external_ips, lb = svc.lb_ingress_ips, ports = svc.ports
    for cluster_ip in svc.cluster_ips:
        family = _addr_family(cluster_ip)
        if not external and (not lb or svc_type != "LoadBalancer"):
            for sp in ports:
                protocol = sp.protocol
                keys.add((family, cluster_ip, protocol, sp.port))
                if external_capable and sp.node_port:
                    keys.add((family, "", protocol, sp.node_port))
            continue
        addresses = [cluster_ip]
        for a in external:
            if _addr_family(a) == family:
                addresses.append(a)
        if svc_type == "LoadBalancer":
            for a in lb:
                if _addr_family(a) == family:
                    addresses.append(a)
        for sp in ports:
            protocol = sp.protocol
            for a in addresses:
                keys.add((family, a, protocol, sp.port))
            if external_capable and sp.node_port:
                keys.add((family, "", protocol, sp.node_port))
    return keys


cdef class _Claims:
    """First come, first served ownership of frontend keys (lace_proxy/table/claims.py).

    A key's claimants are the owning service key itself while it is uncontested (no list
    to allocate: the usual case), and a list, the owner first, once another service claims it.
    """

    cdef dict queues  # key -> service key | [service keys]
    cdef dict held  # service key -> set of keys
    cdef dict losers  # service key -> frozenset of keys it claims but does not own

    def __cinit__(self):
        self.queues = {}
        self.held = {}
        self.losers = {}

    cdef list update(self, str service, set keys):
        cdef set old = self.held.get(service)
        cdef list promoted = []
        cdef bint contested = False
        if old is None:
            old = set()
        elif old == keys:
            return promoted
        for key in old - keys:
            queue = self.queues[key]
            if type(queue) is str:
                del self.queues[key]
                continue
            owner = (<list>queue)[0] == service
            (<list>queue).remove(service)
            if len(<list>queue) == 1:
                self.queues[key] = (<list>queue)[0]
            if owner:
                promoted.append((<list>queue)[0])
        for key in (keys - old if old else keys):
            queue = self.queues.get(key)
            if queue is None:
                self.queues[key] = service
            elif type(queue) is str:
                self.queues[key] = [queue, service]
                contested = True
            else:
                (<list>queue).append(service)
                contested = True
        if keys:
            self.held[service] = keys
        elif service in self.held:
            del self.held[service]
        if contested or service in self.losers:
            self._settle(service)
        for name in promoted:
            self._settle(name)
        return promoted

    cdef void _settle(self, str service) except *:
        lost = frozenset([k for k in self.held.get(service, ()) if self._first(k) != service])
        if lost:
            self.losers[service] = lost
        else:
            self.losers.pop(service, None)

    cdef inline object _first(self, object key):
        queue = self.queues[key]
        return queue if type(queue) is str else (<list>queue)[0]

    cdef object owner(self, tuple key):
        return self._first(key) if key in self.queues else None


cdef Plan _plan_without(Plan p, frozenset lost):
    """A copy of the plan minus frontends another service owns (None: its ClusterIP is lost)."""
    if (p.family, p.cluster_ip, p.protocol, p.port) in lost:
        return None
    cdef Plan q = Plan.__new__(Plan)
    q.id = p.id
    q.service = p.service
    q.port_name = p.port_name
    q.protocol = p.protocol
    q.cluster_ip = p.cluster_ip
    q.family = p.family
    q.port = p.port
    q.node_port = 0 if (p.family, "", p.protocol, p.node_port) in lost else p.node_port
    q.affinity_timeout = p.affinity_timeout
    q.health_check_node_port = p.health_check_node_port
    q.external_ips = tuple([a for a in p.external_ips
                            if (p.family, a, p.protocol, p.port) not in lost])
    q.lb_ips = tuple([a for a in p.lb_ips if (p.family, a, p.protocol, p.port) not in lost])
    q.lb_source_ranges = p.lb_source_ranges
    q.cluster_backends = p.cluster_backends
    q.local_backends = p.local_backends
    q.standby_backends = p.standby_backends
    q.internal_local = p.internal_local
    q.external_local = p.external_local
    q.internal_verdict = p.internal_verdict
    q.external_verdict = p.external_verdict
    q.access = p.access
    q.scheduler = p.scheduler
    q.bgp = p.bgp
    return q


cdef object _plans_without(object plans, frozenset lost):
    """The same shape as _compute's result (None, one Plan, or a dict), minus `lost`."""
    if plans is None:
        return None
    if type(plans) is Plan:
        return _plan_without(<Plan>plans, lost)
    cdef dict out = {}
    for pid, plan in (<dict>plans).items():
        kept = _plan_without(<Plan>plan, lost)
        if kept is not None:
            out[pid] = kept
    if not out:
        return None
    if len(out) == 1:
        return next(iter(out.values()))
    return out


cdef Plan _find(object plans, str pid):
    """The plan with id `pid` in a service's plans (None, a Plan, or a dict by id)."""
    if plans is None:
        return None
    if type(plans) is Plan:
        return <Plan>plans if (<Plan>plans).id == pid else None
    return (<dict>plans).get(pid)


cdef inline bint _port_matches(_Slice s, Py_ssize_t j, object name, object protocol) except -1:
    """Whether slice port j is the service port (name, protocol); identity first."""
    cdef object n = <object>s.port_names[j], p = <object>s.port_protocols[j]
    return (n is name or n == name) and (p is protocol or p == protocol)


cdef inline void _set_cand(Cand* c, _Slice s, Py_ssize_t j, Py_ssize_t i):
    c.ip = s.ips[i]
    c.backend = &s.backends[j * s.n + i]
    c.port = s.port_numbers[j]
    c.flags = s.flags[i]


cdef class ServiceTable:
    """This node's service table: services and slices in, changesets of plans out.

    Updates only mark a service dirty; `build()` recomputes the dirty services (cost
    proportional to their size) and diffs them against what was last committed.
    `commit()` records a build as applied once the dataplane has programmed it; a build
    that is not committed is recomputed by the next one.

    Internally a service's slices and plans are held as the single object when there is
    one (most services have one slice and one port), and as a dict by name or plan id
    otherwise: that saves two container allocations per service, which keeps the cyclic
    GC from running full collections in the middle of a large build.
    """

    cdef str _node
    cdef object _zone
    cdef dict _services  # key -> Service
    cdef dict _slices  # slice key -> _Slice
    cdef dict _slices_by_service  # service key -> _Slice | {slice name: _Slice}
    cdef dict _applied  # service key -> Plan | {plan id: Plan} (committed)
    cdef dict _dirty  # service key -> generation of its last change
    cdef list _pending_keys, _pending_generations, _pending_plans  # the last build, in step
    cdef long long _generation
    cdef long long _built_generation  # _generation when the last build was made
    cdef Cand* _cands  # scratch for one service port's merged endpoints
    cdef Py_ssize_t _capacity
    cdef _Claims _claims
    cdef dict _access  # service key -> Access (the network model's say)

    implementation = IMPLEMENTATION

    def __init__(self, str node_name, zone=None):
        self._node = node_name
        self._zone = zone
        self._services = {}
        self._slices = {}
        self._slices_by_service = {}
        self._applied = {}
        self._dirty = {}
        self._pending_keys = []
        self._pending_generations = []
        self._pending_plans = []
        self._generation = 0
        self._claims = _Claims()
        self._access = {}

    def __dealloc__(self):
        PyMem_Free(self._cands)

    @property
    def node_name(self):
        return self._node

    @property
    def zone(self):
        return self._zone

    def set_node(self, str node_name, zone):
        """Topology and Local policies depend on the node: a change recomputes everything."""
        if node_name == self._node and zone == self._zone:
            return
        self._node = node_name
        self._zone = zone
        cdef _Slice old, new
        for key in list(self._slices):
            old = <_Slice>self._slices[key]
            new = _digest(old.source, old.key, self._node, self._zone)
            new.service_key = old.service_key
            self._slices[key] = new
            self._attach(new)
        for key in {*self._services, *self._slices_by_service, *self._applied}:
            self._mark(key)

    cdef inline void _mark(self, str key):
        self._generation += 1
        self._dirty[key] = self._generation

    def upsert_service(self, svc):
        cdef str key
        if type(svc) is ServiceType:
            key = _join_key(_field(svc, True, SVC_NAMESPACE, "namespace"),
                            _field(svc, True, SVC_NAME, "name"))
        else:
            key = svc.key
        self._services[key] = svc
        self._claim(key, _service_keys(svc))
        self._mark(key)

    def delete_service(self, str key):
        self._access.pop(key, None)
        if self._services.pop(key, None) is not None:
            self._claim(key, set())
            self._mark(key)

    def set_access(self, str key, access):
        """Who may reach a service (from the network model); None lifts every restriction."""
        if self._access.get(key) == access:
            return
        if access is None:
            del self._access[key]
        else:
            self._access[key] = access
        self._mark(key)

    cdef void _claim(self, str key, set keys) except *:
        was = self._claims.losers.get(key)
        for other in self._claims.update(key, keys):
            self._mark(other)  # it inherited a frontend
        lost = self._claims.losers.get(key)
        if lost and lost != was:
            owners = sorted({self._claims.owner(k) or "?" for k in lost})
            log.warning(
                "service %s: %s already served by %s; not serving it here until released",
                key, ", ".join(sorted(format_key(k) for k in lost)), ", ".join(owners))

    @property
    def conflicts(self):
        """Services not serving some frontends because another service claimed them first."""
        return describe_conflicts(self._claims.losers)

    def upsert_slice(self, sl):
        cdef bint exact = type(sl) is EndpointSliceType
        cdef str key = _slice_key(sl, exact)
        cdef str service_key = _slice_service_key(sl, exact)
        cdef _Slice old = self._slices.get(key)
        if old is not None and old.service_key != service_key:
            self.delete_slice(key)
        cdef _Slice d = _digest(sl, key, self._node, self._zone)
        d.service_key = service_key
        self._slices[key] = d
        self._attach(d)
        self._mark(service_key)

    cdef void _attach(self, _Slice d) except *:
        """Put (or replace) a digest in its service's slices."""
        entry = self._slices_by_service.get(d.service_key)
        if entry is None or (type(entry) is _Slice and (<_Slice>entry).name == d.name):
            self._slices_by_service[d.service_key] = d
        elif type(entry) is _Slice:
            self._slices_by_service[d.service_key] = {(<_Slice>entry).name: entry, d.name: d}
        else:
            (<dict>entry)[d.name] = d

    def delete_slice(self, str key):
        cdef _Slice d = self._slices.pop(key, None)
        if d is None:
            return
        entry = self._slices_by_service[d.service_key]
        if type(entry) is _Slice:
            del self._slices_by_service[d.service_key]
        else:
            del (<dict>entry)[d.name]
            if len(<dict>entry) == 1:
                self._slices_by_service[d.service_key] = next(iter((<dict>entry).values()))
        self._mark(d.service_key)

    def service(self, str key):
        return self._services.get(key)

    def service_keys(self):
        return list(self._services)

    def slices_of(self, str service_key):
        entry = self._slices_by_service.get(service_key)
        if entry is None:
            return []
        if type(entry) is _Slice:
            return [(<_Slice>entry).source]
        return [(<_Slice>d).source for d in (<dict>entry).values()]

    @property
    def pending(self):
        """Services changed since the last commit."""
        return len(self._dirty)

    def build(self):
        """Recompute the dirty services and diff them against the committed state."""
        cdef list added = [], removed = [], updated = []
        cdef list pending_keys = [], pending_generations = [], pending_plans = []
        cdef str key
        cdef Plan plan, prev
        cdef dict losers = self._claims.losers
        for key, generation in self._dirty.items():
            new = self._compute(key)
            if losers:
                lost = losers.get(key)
                if lost is not None:
                    new = _plans_without(new, <frozenset>lost)
            old = self._applied.get(key)
            if type(new) is Plan:
                plan = <Plan>new
                prev = _find(old, plan.id)
                if prev is None:
                    added.append(plan)
                elif not _plan_eq(prev, plan):
                    updated.append((prev, plan))
            elif new is not None:
                for plan in (<dict>new).values():
                    prev = _find(old, plan.id)
                    if prev is None:
                        added.append(plan)
                    elif not _plan_eq(prev, plan):
                        updated.append((prev, plan))
            if type(old) is Plan:
                if _find(new, (<Plan>old).id) is None:
                    removed.append(old)
            elif old is not None:
                for plan in (<dict>old).values():
                    if _find(new, plan.id) is None:
                        removed.append(plan)
            pending_keys.append(key)
            pending_generations.append(generation)
            pending_plans.append(new)
        self._pending_keys = pending_keys
        self._pending_generations = pending_generations
        self._pending_plans = pending_plans
        self._built_generation = self._generation
        return Changeset(tuple(added), tuple(removed), tuple(updated))

    def commit(self):
        """Record the last build as programmed; changes that arrived since stay dirty."""
        cdef Py_ssize_t i
        # Nothing marked since the build: it covered every dirty service at its latest change.
        cdef bint covers_all = (self._generation == self._built_generation
                                and len(self._pending_keys) == len(self._dirty))
        for i in range(len(self._pending_keys)):
            key = self._pending_keys[i]
            plans = self._pending_plans[i]
            if plans is not None:
                self._applied[key] = plans
            else:
                self._applied.pop(key, None)
            if not covers_all and self._dirty.get(key) == self._pending_generations[i]:
                del self._dirty[key]
        if covers_all:
            self._dirty.clear()
        self._pending_keys = []
        self._pending_generations = []
        self._pending_plans = []

    def plans(self):
        """The committed plans, service by service."""
        for plans in self._applied.values():
            if type(plans) is Plan:
                yield plans
            else:
                yield from (<dict>plans).values()

    cdef Cand* _scratch(self, Py_ssize_t n) except NULL:
        cdef Cand* grown
        if n > self._capacity or self._cands == NULL:
            grown = <Cand*>PyMem_Realloc(self._cands, sizeof(Cand) * (n if n > 16 else 16))
            if grown == NULL:
                raise MemoryError()
            self._cands = grown
            self._capacity = n if n > 16 else 16
        return self._cands

    cdef Py_ssize_t _merge(self, PyObject** slices, Py_ssize_t nslices, object port_name,
                           object protocol, int family) except -1:
        """Merge one service port's endpoints (slices in name order) into the scratch array,
        deduplicated by ip:port as the pure twin does; returns how many there are."""
        cdef _Slice s
        cdef Py_ssize_t i, j, k, x, n = 0, total = 0, sources = 0
        cdef Cand* cands
        cdef dict seen
        cdef object prev
        for x in range(nslices):
            s = <_Slice>slices[x]
            if s.family != family:
                continue
            for j in range(s.nports):
                if _port_matches(s, j, port_name, protocol):
                    total += s.n
                    sources += 1 if s.unique else 2
        if total == 0:
            return 0
        cands = self._scratch(total)
        seen = None if sources == 1 else {}  # one duplicate-free source: nothing to dedupe
        for x in range(nslices):
            s = <_Slice>slices[x]
            if s.family != family:
                continue
            for j in range(s.nports):
                if not _port_matches(s, j, port_name, protocol):
                    continue
                for i in range(s.n):
                    if seen is not None:
                        ident = (<object>s.ips[i], s.port_numbers[j])
                        prev = seen.get(ident)
                        if prev is not None:
                            k = <Py_ssize_t>prev
                            if _better(s.flags[i], cands[k].flags):
                                _set_cand(&cands[k], s, j, i)
                            continue
                        seen[ident] = n
                    _set_cand(&cands[n], s, j, i)
                    n += 1
        return n

    cdef object _compute(self, str key):
        """A service's plans: None, the one Plan, or a dict of them by id (in port order)."""
        svc = self._services.get(key)
        if svc is None:
            return None
        cdef bint exact = type(svc) is ServiceType
        if not (_proxied(svc) if exact else svc.proxied):
            return None
        entry = self._slices_by_service.get(key)
        cdef PyObject* single = NULL
        cdef PyObject** slices = &single
        cdef Py_ssize_t nslices = 0, x
        cdef list ordered = None  # keeps the sorted digests alive while `slices` points in
        if type(entry) is _Slice:
            single = <PyObject*>entry
            nslices = 1
        elif entry is not None:
            ordered = [(<dict>entry)[name] for name in sorted(<dict>entry)]
            nslices = len(ordered)
            slices = <PyObject**>_alloc(nslices, sizeof(PyObject*))
            for x in range(nslices):
                slices[x] = <PyObject*>ordered[x]
        try:
            return self._plans_of(key, svc, exact, slices, nslices)
        finally:
            if slices != &single:
                PyMem_Free(slices)

    cdef object _plans_of(self, str key, object svc, bint exact, PyObject** slices,
                          Py_ssize_t nslices):
        cdef object result = None  # None, then the first Plan, then a dict

        cdef str svc_type = _field(svc, exact, SVC_TYPE, "type")
        cdef bint external_capable = svc_type == "NodePort" or svc_type == "LoadBalancer"
        cdef bint internal_local = _field(svc, exact, SVC_ITP, "internal_traffic_policy") == "Local"
        cdef bint etp_local = _field(svc, exact, SVC_ETP, "external_traffic_policy") == "Local"
        cdef int affinity = (_field(svc, exact, SVC_AFFINITY_TIMEOUT, "affinity_timeout")
                             if _truth(_field(svc, exact, SVC_AFFINITY, "session_affinity"))
                             else 0)
        cdef int hc_port = _field(svc, exact, SVC_HC_PORT, "health_check_node_port")
        cdef object svc_external_ips = _field(svc, exact, SVC_EXTERNAL_IPS, "external_ips")
        cdef object svc_lb_ips = _field(svc, exact, SVC_LB_IPS, "lb_ingress_ips")
        cdef object svc_ranges = _field(svc, exact, SVC_LB_RANGES, "lb_source_ranges")
        cdef tuple ports = tuple(_field(svc, exact, SVC_PORTS, "ports"))
        cdef object access = self._access.get(key) if self._access else None
        cdef object scheduler = _field(svc, exact, SVC_SCHEDULER, "ipvs_scheduler")
        if scheduler is None:
            scheduler = ""
        cdef object bgp = _field(svc, exact, SVC_BGP, "bgp")
        cdef int family, node_port, mode
        cdef bint accessible, external_local, uses_cluster, uses_local, has_any, sp_exact
        cdef bint local_ready, local_terminating
        cdef unsigned char cluster_need, local_need
        cdef tuple external_ips, lb_ips, ranges, cluster, local
        cdef str cluster_ip, pid, port_name, protocol
        cdef Py_ssize_t i, n
        cdef Cand* cands
        cdef unsigned char f
        cdef Plan plan
        for cluster_ip in _field(svc, exact, SVC_CLUSTER_IPS, "cluster_ips"):
            family = _family(cluster_ip)
            external_ips = _of_family(svc_external_ips, family)
            lb_ips = _of_family(svc_lb_ips, family) if svc_type == "LoadBalancer" else ()
            ranges = _of_family(svc_ranges, family)
            for sp in ports:
                sp_exact = type(sp) is ServicePortType
                port_name = _field(sp, sp_exact, SP_NAME, "name")
                protocol = _field(sp, sp_exact, SP_PROTOCOL, "protocol")
                node_port = _field(sp, sp_exact, SP_NODE_PORT, "node_port") if external_capable else 0
                accessible = node_port != 0 or len(external_ips) > 0 or len(lb_ips) > 0
                external_local = accessible and etp_local and (
                    external_capable or len(external_ips) > 0)
                n = self._merge(slices, nslices, port_name, protocol, family)
                cands = self._cands
                uses_cluster = not internal_local or accessible
                uses_local = internal_local or external_local
                cluster = ()
                local = ()
                has_any = False
                mode = 0
                cluster_need = local_need = 0
                if uses_cluster:
                    mode = _topology_mode(cands, n)
                    cluster_need = F_READY
                    cluster = _select(cands, n, cluster_need, mode)
                    if len(cluster) == 0:
                        cluster_need = F_SERVING | F_TERMINATING
                        cluster = _select(cands, n, cluster_need, mode)
                    has_any = len(cluster) > 0
                if uses_local:
                    local_ready = False
                    local_terminating = False
                    for i in range(n):
                        f = cands[i].flags
                        if f & F_READY:
                            has_any = True
                            if f & F_LOCAL:
                                local_ready = True
                        elif (f & F_SERVING) and (f & F_TERMINATING):
                            has_any = True
                            if f & F_LOCAL:
                                local_terminating = True
                    if local_ready:
                        local_need = F_LOCAL | F_READY
                    elif local_terminating:
                        local_need = F_LOCAL | F_SERVING | F_TERMINATING
                    if local_need:
                        local = _select(cands, n, local_need, 0)
                plan = Plan.__new__(Plan)
                pid = f"{key}:{port_name}/{protocol}/{'v4' if family == 4 else 'v6'}"
                plan.id = pid
                plan.service = key
                plan.port_name = port_name
                plan.protocol = protocol
                plan.family = family
                plan.cluster_ip = cluster_ip
                plan.port = _field(sp, sp_exact, SP_PORT, "port")
                plan.node_port = node_port
                plan.external_ips = external_ips
                plan.lb_ips = lb_ips
                plan.lb_source_ranges = ranges
                plan.affinity_timeout = affinity
                plan.internal_local = internal_local
                plan.external_local = external_local
                plan.cluster_backends = cluster
                plan.local_backends = local
                plan.standby_backends = _standby(cands, n, cluster_need, mode, local_need)
                if not has_any:
                    plan.internal_verdict = "reject"
                    plan.external_verdict = "reject"
                else:
                    plan.internal_verdict = (
                        None if len(local if internal_local else cluster) > 0 else "drop")
                    plan.external_verdict = (
                        "drop" if external_local and len(local) == 0 else None)
                plan.health_check_node_port = hc_port if external_local else 0
                plan.access = access
                plan.scheduler = scheduler
                plan.bgp = bgp
                if result is None:
                    result = plan
                elif type(result) is Plan:
                    result = {(<Plan>result).id: result, pid: plan}
                else:
                    (<dict>result)[pid] = plan
        return result
