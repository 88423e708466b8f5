"""ClientIP session affinity's ids: which remembered choices are still valid.

An IPv4 service port with ClientIP affinity shares the `alb`/`aext`/`anp` chains with every
other such port (render.py): the chains mark a connection with the port's id, and the
packet path remembers (client, id) -> endpoint in the map `affinity-v4`. The id is what
keeps one port's remembered endpoints from another's, and what forgets them when an
endpoint leaves. A restarted process adopts the ids its predecessor programmed (read back
by kernel.affinity_ids, see IdAdoption), so that clients keep their endpoints.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lace_proxy.table import Plan


class AffinityIds:
    """Unique 32-bit ids (conntrack marks) for service ports with ClientIP affinity.

    A client's remembered endpoint is keyed by (client, id), so two live service ports must
    never share an id. When an endpoint leaves a service port, the port gets a fresh id:
    every remembered choice of the old id is orphaned (and idles out), so no client is sent
    to an endpoint that is gone (clients of the remaining endpoints choose again).
    """

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._owners: dict[int, str] = {}
        self._backends: dict[str, frozenset[tuple[str, int]]] = {}
        self._serial = 0

    def assign(self, plan_id: str, backends: frozenset[tuple[str, int]]) -> None:
        """Give the plan an id for these endpoints; one it has stays while they only grow.

        A replaced id is never given back, and the seed of its successor holds it: a process
        starts its serial at 0 again, so without it a restarted proxy replacing an adopted
        id would draw the ids of its predecessor's sequence anew (the very same one, if the
        plan was its first), and clients would be sent to endpoints that are gone.
        """
        replaced = self._ids.get(plan_id)
        if replaced is not None:
            if self._backends[plan_id] <= backends:  # only additions: choices stay valid
                self._backends[plan_id] = backends
                return
            self.release(plan_id)
        self._serial += 1
        seed = f"{plan_id}#{self._serial}" + ("" if replaced is None else f"#{replaced:x}")
        value = int.from_bytes(hashlib.blake2b(seed.encode(), digest_size=4).digest(), "big")
        while value in self._owners or value in (0, replaced):
            value = (value + 1) & 0xFFFFFFFF  # never 0: that is "no affinity"
        self._ids[plan_id] = value
        self._owners[value] = plan_id
        self._backends[plan_id] = backends

    def adopt(self, plan_id: str, value: int) -> bool:
        """Take over the id a previous process gave the plan, as if its endpoints had only
        grown until `revise` is told those it stood for; whether it was taken (not if the
        plan has one, or another plan has this one)."""
        if plan_id in self._ids or value in self._owners or not 0 < value <= 0xFFFFFFFF:
            return False
        self._ids[plan_id] = value
        self._owners[value] = plan_id
        self._backends[plan_id] = frozenset()
        return True

    def revise(
        self, plan_id: str, held: frozenset[tuple[str, int]], backends: frozenset[tuple[str, int]]
    ) -> bool:
        """An adopted id's endpoints as its predecessor held them are known at last: the id
        goes (replaced, as in assign) if one of them is not among `backends`. Returns
        whether it went."""
        if plan_id not in self._ids:
            return False
        self._backends[plan_id] = held
        value = self._ids[plan_id]
        self.assign(plan_id, backends)
        return self._ids[plan_id] != value

    def release(self, plan_id: str) -> None:
        """Forget the plan's id; its clients' remembered choices are orphaned."""
        value = self._ids.pop(plan_id, None)
        if value is not None:
            del self._owners[value]
            del self._backends[plan_id]

    def get(self, plan_id: str) -> str:
        """The plan's id as the renderer writes a mark."""
        return f"{self._ids[plan_id]:#010x}"

    def keep_only(self, plan_ids: set[str]) -> None:
        """Forget the ids of every plan but these (a full sync's)."""
        for plan_id in set(self._ids) - plan_ids:
            self.release(plan_id)


class IdAdoption:
    """A restarted process's first full sync takes over its predecessor's affinity ids.

    Whether an id may stay depends on the endpoints it stood for (assign), which are in the
    kernel's endpoint maps: the largest of the table, read and compared one at a time by the
    sync. So the ids are adopted first as if their endpoints had only grown (`adopt`), the
    endpoints they stood for are gathered as the sync reads those maps (`seen`), and an id
    one of whose endpoints is gone is replaced before the maps that hold ids are compared
    (`revise`).
    """

    #: The endpoint maps whose elements the ids stand for (not the local ones: a subset).
    MAPS = ("endpoints", "nodeport-endpoints")

    def __init__(self, ids: AffinityIds, plans: list[Plan], programmed: dict[str, int]) -> None:
        self._ids = ids
        self._plans = {p.id: p for p in plans if needs_id(p)}
        by_id: dict[int, list[str]] = {}
        for frontend, value in programmed.items():
            by_id.setdefault(value, []).append(frontend)
        # Each frontend of an adopted id -> the plan that adopted it.
        self._frontends: dict[str, str] = {}
        self._held: dict[str, set[tuple[str, int]]] = {}
        for plan in self._plans.values():
            key = f"{plan.cluster_ip} . {plan.protocol.lower()} . {plan.port}"
            found = programmed.get(key)
            if found is not None and ids.adopt(plan.id, found):
                self._frontends.update((f, plan.id) for f in by_id[found])
                self._held[plan.id] = set()

    def __bool__(self) -> bool:
        return bool(self._frontends)

    def seen(self, elements: set[str]) -> None:
        """Elements of one of the kernel's endpoint maps (MAPS): `FRONTEND : IP . PORT`."""
        frontends = self._frontends
        for element in elements:
            frontend, _, endpoint = element.partition(" : ")
            plan_id = frontends.get(frontend)
            if plan_id is not None:
                ip, _, port = endpoint.partition(" . ")
                if port.isdigit():
                    self._held[plan_id].add((ip, int(port)))

    def plans(self) -> list[Plan]:
        """The plans that adopted an id."""
        return [self._plans[plan_id] for plan_id in self._held]

    def revise(self, plan: Plan) -> bool:
        """Replace the plan's adopted id if one of the endpoints it stood for is gone;
        whether it was (the plan's elements rendered with the adopted one are stale)."""
        held = frozenset(self._held[plan.id])
        return self._ids.revise(plan.id, held, backend_set(plan))


def backend_set(plan: Plan) -> frozenset[tuple[str, int]]:
    """The endpoints a plan's id stands for (those its clients may have remembered)."""
    return frozenset((b.ip, b.port) for b in (*plan.cluster_backends, *plan.local_backends))


def needs_id(plan: Plan) -> bool:
    """Whether the plan's affinity is data (an id in the shared maps): IPv4, and not under
    externalTrafficPolicy Local, which keep kube-proxy's per-endpoint chains instead."""
    return bool(plan.affinity_timeout) and plan.family == 4 and not plan.external_local
