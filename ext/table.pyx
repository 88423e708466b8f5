# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled service table: the same API and semantics as lace_proxy/table/_pytable.py.

What makes it fast: each slice is digested once on arrival into C arrays (endpoint
conditions, locality and topology-hint matches folded into one flag byte per endpoint),
so merging and categorizing a service port are C loops over bytes; Python objects are
made only for the backends and plans that come out.
"""

cimport cython
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.ref cimport PyObject

from lace_proxy.table.changeset import Changeset, plan_frontends

IMPLEMENTATION = "compiled"

cdef enum:
    F_READY = 1
    F_SERVING = 2
    F_TERMINATING = 4
    F_LOCAL = 8
    F_ZONE_HINTED = 16
    F_ZONE_MATCH = 32
    F_NODE_HINTED = 64
    F_NODE_MATCH = 128

ctypedef struct Cand:
    PyObject* ip  # borrowed: owned by a _Slice's ips list, alive for the build
    int port
    unsigned char flags


@cython.no_gc
cdef class Backend:
    """One endpoint a frontend may forward to, with the conditions it was chosen under.

    Untracked by the cyclic GC (it holds only a str and ints, so it cannot form a cycle):
    at 300k backends, GC passes over them would cost more than building them.
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


cdef inline Backend _backend(Cand* c):
    cdef Backend b = Backend.__new__(Backend)
    b.ip = <str>c.ip
    b.port = c.port
    b.local = (c.flags & F_LOCAL) != 0
    b.ready = (c.flags & F_READY) != 0
    b.serving = (c.flags & F_SERVING) != 0
    b.terminating = (c.flags & F_TERMINATING) != 0
    return b


@cython.no_gc
cdef class Plan:
    """Everything the dataplane needs for one service port in one IP family.

    See the pure twin's Plan for the meaning of each field.
    """

    cdef readonly str id, service, port_name, protocol, cluster_ip
    cdef readonly int family, port, node_port, affinity_timeout, health_check_node_port
    cdef readonly tuple external_ips, lb_ips, lb_source_ranges
    cdef readonly tuple cluster_backends, local_backends
    cdef readonly bint internal_local, external_local
    cdef readonly object internal_verdict, external_verdict

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
            and a.local_backends == b.local_backends)


cdef class _Slice:
    """A slice digested for this node: endpoint IPs plus one flag byte per endpoint."""

    cdef str name
    cdef object source
    cdef int family
    cdef list port_keys  # (name, protocol) of each usable port
    cdef list port_numbers
    cdef list ips
    cdef unsigned char* flags
    cdef Py_ssize_t n
    cdef bint unique

    def __dealloc__(self):
        PyMem_Free(self.flags)


cdef _Slice _digest(object sl, str node, object zone):
    cdef _Slice d = _Slice.__new__(_Slice)
    cdef str address_type = sl.address_type
    cdef unsigned char f
    cdef Py_ssize_t i
    cdef object hints
    d.name = sl.name
    d.source = sl
    d.family = 4 if address_type == "IPv4" else (6 if address_type == "IPv6" else 0)
    d.port_keys = []
    d.port_numbers = []
    for p in sl.ports:
        if p.port is not None:
            d.port_keys.append((p.name, p.protocol))
            d.port_numbers.append(p.port)
    endpoints = sl.endpoints
    d.n = len(endpoints)
    d.ips = []
    d.flags = <unsigned char*>PyMem_Malloc(d.n if d.n > 0 else 1)
    if d.flags == NULL:
        raise MemoryError()
    i = 0
    for ep in endpoints:
        d.ips.append(ep.addresses[0])
        f = 0
        if ep.ready:
            f |= F_READY
        if ep.serving:
            f |= F_SERVING
        if ep.terminating:
            f |= F_TERMINATING
        if ep.node_name == node:
            f |= F_LOCAL
        hints = ep.hint_zones
        if hints:
            f |= F_ZONE_HINTED
            if zone is not None and zone in hints:
                f |= F_ZONE_MATCH
        hints = ep.hint_nodes
        if hints:
            f |= F_NODE_HINTED
            if node in hints:
                f |= F_NODE_MATCH
        d.flags[i] = f
        i += 1
    d.unique = len(set(d.ips)) == d.n
    return d


cdef inline bint _better(unsigned char cand, unsigned char prev):
    """Dedupe: a non-terminating duplicate beats a terminating one, then local beats remote."""
    if (cand & F_TERMINATING) != (prev & F_TERMINATING):
        return (prev & F_TERMINATING) != 0
    return (cand & F_LOCAL) != 0 and (prev & F_LOCAL) == 0


cdef class _Cands:
    """The merged endpoints of one service port and family (a C array of Cand)."""

    cdef Cand* items
    cdef Py_ssize_t n

    def __dealloc__(self):
        PyMem_Free(self.items)


cdef _Cands _merge(list sources, Py_ssize_t total):
    """Merge (slice, port number) sources, deduplicating by ip:port as the pure twin does."""
    cdef _Cands out = _Cands.__new__(_Cands)
    cdef _Slice s
    cdef Py_ssize_t i, j
    cdef int port
    cdef dict seen
    cdef object ident, prev
    out.items = <Cand*>PyMem_Malloc(sizeof(Cand) * (total if total > 0 else 1))
    if out.items == NULL:
        raise MemoryError()
    out.n = 0
    if len(sources) == 1 and (<_Slice>sources[0][0]).unique:
        s = <_Slice>sources[0][0]
        port = sources[0][1]
        for i in range(s.n):
            out.items[i].ip = <PyObject*>s.ips[i]
            out.items[i].port = port
            out.items[i].flags = s.flags[i]
        out.n = s.n
        return out
    seen = {}
    for src in sources:
        s = <_Slice>src[0]
        port = src[1]
        for i in range(s.n):
            ident = (s.ips[i], port)
            prev = seen.get(ident)
            if prev is None:
                seen[ident] = out.n
                out.items[out.n].ip = <PyObject*>s.ips[i]
                out.items[out.n].port = port
                out.items[out.n].flags = s.flags[i]
                out.n += 1
            else:
                j = <Py_ssize_t>prev
                if _better(s.flags[i], out.items[j].flags):
                    out.items[j].ip = <PyObject*>s.ips[i]
                    out.items[j].flags = s.flags[i]
    return out


cdef int _topology_mode(_Cands c):
    """0: no topology, 1: zone hints, 2: node hints (as kube-proxy's topologyModeFromHints)."""
    cdef bint all_node = True, all_zone = True, for_node = False, for_zone = False
    cdef bint seen = False
    cdef unsigned char f
    cdef Py_ssize_t i
    for i in range(c.n):
        f = c.items[i].flags
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


cdef inline bint _available(unsigned char f, int mode):
    if mode == 1:
        return (f & F_ZONE_MATCH) != 0
    if mode == 2:
        return (f & F_NODE_MATCH) != 0
    return True


cdef tuple _select(_Cands c, unsigned char need, unsigned char mask, int mode):
    """Backends whose flags include all of `need` (and `mask` bits equal to need)."""
    cdef list out = []
    cdef Py_ssize_t i
    cdef unsigned char f
    for i in range(c.n):
        f = c.items[i].flags
        if (f & mask) == need and _available(f, mode):
            out.append(_backend(&c.items[i]))
    return tuple(out)


cdef inline int _family(str address):
    return 6 if ":" in address else 4


cdef class ServiceTable:
    """This node's service table: services and slices in, changesets of plans out.

    Updates only mark a service dirty; `build()` recomputes the dirty services (cost
    proportional to their size) and diffs them against what was last committed.
    `commit()` records a build as applied once the dataplane has programmed it; a build
    that is not committed is recomputed by the next one.
    """

    cdef str _node
    cdef object _zone
    cdef dict _services, _slices, _digests, _slices_by_service, _applied, _dirty, _pending
    cdef long long _generation

    implementation = IMPLEMENTATION

    def __init__(self, str node_name, zone=None):
        self._node = node_name
        self._zone = zone
        self._services = {}
        self._slices = {}
        self._digests = {}
        self._slices_by_service = {}
        self._applied = {}
        self._dirty = {}
        self._pending = {}
        self._generation = 0

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
        for key, sl in self._slices.items():
            self._digests[key] = _digest(sl, self._node, self._zone)
        for key in {*self._services, *self._slices_by_service, *self._applied}:
            self._mark(key)

    cdef inline void _mark(self, str key):
        self._generation += 1
        self._dirty[key] = self._generation

    def upsert_service(self, svc):
        cdef str key = svc.key
        self._services[key] = svc
        self._mark(key)

    def delete_service(self, str key):
        if self._services.pop(key, None) is not None:
            self._mark(key)

    def upsert_slice(self, sl):
        cdef str key = sl.key
        cdef str service_key = sl.service_key
        old = self._slices.get(key)
        if old is not None and old.service_key != service_key:
            self.delete_slice(key)
        self._slices[key] = sl
        self._digests[key] = _digest(sl, self._node, self._zone)
        by_name = self._slices_by_service.get(service_key)
        if by_name is None:
            by_name = self._slices_by_service[service_key] = {}
        by_name[sl.name] = key
        self._mark(service_key)

    def delete_slice(self, str key):
        sl = self._slices.pop(key, None)
        if sl is None:
            return
        del self._digests[key]
        cdef str service_key = sl.service_key
        cdef dict by_name = self._slices_by_service[service_key]
        del by_name[sl.name]
        if not by_name:
            del self._slices_by_service[service_key]
        self._mark(service_key)

    def service(self, str key):
        return self._services.get(key)

    def slices_of(self, str service_key):
        return [self._slices[k] for k in self._slices_by_service.get(service_key, {}).values()]

    @property
    def pending(self):
        """Services changed since the last commit."""
        return len(self._dirty)

    def build(self):
        """Recompute the dirty services and diff them against the committed state."""
        cdef list added = [], removed = [], updated = []
        cdef dict pending = {}
        cdef dict new, old
        cdef str key
        empty = {}
        for key, generation in self._dirty.items():
            new = self._compute(key)
            old = self._applied.get(key, empty)
            for pid, plan in new.items():
                prev = old.get(pid)
                if prev is None:
                    added.append(plan)
                elif not _plan_eq(<Plan>prev, <Plan>plan):
                    updated.append((prev, plan))
            for pid, plan in old.items():
                if pid not in new:
                    removed.append(plan)
            pending[key] = (generation, new)
        self._pending = pending
        return Changeset(tuple(added), tuple(removed), tuple(updated))

    def commit(self):
        """Record the last build as programmed; changes that arrived since stay dirty."""
        for key, entry in self._pending.items():
            generation, plans = entry
            if plans:
                self._applied[key] = plans
            else:
                self._applied.pop(key, None)
            if self._dirty.get(key) == generation:
                del self._dirty[key]
        self._pending = {}

    def plans(self):
        """The committed plans, service by service."""
        for plans in self._applied.values():
            yield from plans.values()

    cdef dict _compute(self, str key):
        cdef dict plans = {}
        svc = self._services.get(key)
        if svc is None or not svc.proxied:
            return plans
        cdef dict by_name = self._slices_by_service.get(key, {})
        cdef dict groups = {}  # (port name, protocol, family) -> [[(digest, port)], total]
        cdef _Slice d
        cdef Py_ssize_t i
        cdef list group
        for name in sorted(by_name):
            d = <_Slice>self._digests[by_name[name]]
            if d.family == 0:
                continue
            for i in range(len(d.port_keys)):
                pk = d.port_keys[i]
                gk = (pk[0], pk[1], d.family)
                group = groups.get(gk)
                if group is None:
                    group = groups[gk] = [[], 0]
                (<list>group[0]).append((d, d.port_numbers[i]))
                group[1] = <Py_ssize_t>group[1] + d.n

        cdef str svc_type = svc.type
        cdef bint external_capable = svc_type == "NodePort" or svc_type == "LoadBalancer"
        cdef bint internal_local = svc.internal_traffic_policy == "Local"
        cdef bint etp_local = svc.external_traffic_policy == "Local"
        cdef int affinity = svc.affinity_timeout if svc.session_affinity else 0
        cdef int hc_port = svc.health_check_node_port
        cdef int family, node_port, mode
        cdef bint accessible, external_local, uses_cluster, uses_local, has_any
        cdef bint local_ready, local_terminating
        cdef tuple external_ips, lb_ips, ranges, cluster, local, ports = svc.ports
        cdef str cluster_ip, pid
        cdef _Cands cands
        cdef _Cands no_cands = _Cands.__new__(_Cands)
        cdef unsigned char f
        cdef Plan plan
        for cluster_ip in svc.cluster_ips:
            family = _family(cluster_ip)
            external_ips = tuple([a for a in svc.external_ips if _family(a) == family])
            if svc_type == "LoadBalancer":
                lb_ips = tuple([a for a in svc.lb_ingress_ips if _family(a) == family])
            else:
                lb_ips = ()
            ranges = tuple([r for r in svc.lb_source_ranges if _family(r) == family])
            for sp in ports:
                node_port = sp.node_port if external_capable else 0
                accessible = node_port != 0 or len(external_ips) > 0 or len(lb_ips) > 0
                external_local = accessible and etp_local and (
                    external_capable or len(external_ips) > 0)
                group = groups.get((sp.name, sp.protocol, family))
                cands = no_cands if group is None else _merge(group[0], group[1])
                uses_cluster = not internal_local or accessible
                uses_local = internal_local or external_local
                cluster = ()
                local = ()
                has_any = False
                if uses_cluster:
                    mode = _topology_mode(cands)
                    cluster = _select(cands, F_READY, F_READY, mode)
                    if len(cluster) == 0:
                        cluster = _select(cands, F_SERVING | F_TERMINATING,
                                          F_SERVING | F_TERMINATING, mode)
                    has_any = len(cluster) > 0
                if uses_local:
                    local_ready = False
                    local_terminating = False
                    for i in range(cands.n):
                        f = cands.items[i].flags
                        if f & F_READY:
                            has_any = True
                            if f & F_LOCAL:
                                local_ready = True
                        elif (f & F_SERVING) and (f & F_TERMINATING):
                            has_any = True
                            if f & F_LOCAL:
                                local_terminating = True
                    if local_ready:
                        local = _select(cands, F_LOCAL | F_READY, F_LOCAL | F_READY, 0)
                    elif local_terminating:
                        local = _select(cands, F_LOCAL | F_SERVING | F_TERMINATING,
                                        F_LOCAL | F_SERVING | F_TERMINATING, 0)
                plan = Plan.__new__(Plan)
                pid = f"{key}:{sp.name}/{sp.protocol}/v{family}"
                plan.id = pid
                plan.service = key
                plan.port_name = sp.name
                plan.protocol = sp.protocol
                plan.family = family
                plan.cluster_ip = cluster_ip
                plan.port = sp.port
                plan.node_port = node_port
                plan.external_ips = external_ips
                plan.lb_ips = lb_ips
                plan.lb_source_ranges = ranges
                plan.affinity_timeout = affinity
                plan.internal_local = internal_local
                plan.external_local = external_local
                plan.cluster_backends = cluster
                plan.local_backends = local
                if not has_any:
                    plan.internal_verdict = "reject"
                    plan.external_verdict = "reject"
                else:
                    plan.internal_verdict = (
                        None if len(local if internal_local else cluster) > 0 else "drop")
                    plan.external_verdict = (
                        "drop" if external_local and len(local) == 0 else None)
                plan.health_check_node_port = hc_port if external_local else 0
                plans[pid] = plan
        return plans
