"""Who owns each frontend when services collide: the first claimant keeps it.

Two services can claim the same address . protocol . port (an ExternalIP or a load
balancer IP given to both, a NodePort reused in a manifest folder). A kernel map holds one
value per key, so exactly one service may have it. The one that claimed it first keeps it —
a new, conflicting service never takes traffic away from one already served — and the
others wait in line: when the owner lets go, the next one takes over.

A service's frontends depend only on the Service object, so claims are settled when a
service is upserted or deleted, not in every build. This is the pure twin's version;
ext/table.pyx has the compiled one, and the same tests run against both.
"""

from __future__ import annotations

from typing import Any

FrontendKey = tuple[int, str, str, int]  # (family, address or "" for a NodePort, protocol, port)


def _family(address: str) -> int:
    return 6 if ":" in address else 4


def service_frontend_keys(svc: Any) -> frozenset[FrontendKey]:
    """Every frontend a service would answer on (the same filters as the table's plans)."""
    if not svc.proxied:
        return frozenset()
    keys: set[FrontendKey] = set()
    external_capable = svc.type in ("NodePort", "LoadBalancer")
    for cluster_ip in svc.cluster_ips:
        family = _family(cluster_ip)
        addresses = [cluster_ip, *(a for a in svc.external_ips if _family(a) == family)]
        if svc.type == "LoadBalancer":
            addresses += [a for a in svc.lb_ingress_ips if _family(a) == family]
        for sp in svc.ports:
            keys.update((family, a, sp.protocol, sp.port) for a in addresses)
            if external_capable and sp.node_port:
                keys.add((family, "", sp.protocol, sp.node_port))
    return frozenset(keys)


class Claims:
    """First come, first served ownership of frontend keys, by service key."""

    def __init__(self) -> None:
        self._queues: dict[FrontendKey, list[str]] = {}
        self._held: dict[str, frozenset[FrontendKey]] = {}
        #: services that do not own every key they claim, with the keys they lack
        self.losers: dict[str, frozenset[FrontendKey]] = {}

    def update(self, service: str, keys: frozenset[FrontendKey]) -> list[str]:
        """Record that `service` now claims `keys` (none: it is gone).

        Returns the services whose owned keys changed because of it (they inherited a key
        it released) and must be recomputed.
        """
        old = self._held.get(service, frozenset())
        if old == keys:
            return []
        promoted: list[str] = []
        for key in old - keys:
            queue = self._queues[key]
            owner = queue[0] == service
            queue.remove(service)
            if not queue:
                del self._queues[key]
            elif owner:
                promoted.append(queue[0])
        for key in keys - old:
            self._queues.setdefault(key, []).append(service)
        if keys:
            self._held[service] = keys
        else:
            del self._held[service]
        for name in (service, *promoted):
            self._settle(name)
        return promoted

    def _settle(self, service: str) -> None:
        lost = frozenset(k for k in self._held.get(service, ()) if self._queues[k][0] != service)
        if lost:
            self.losers[service] = lost
        else:
            self.losers.pop(service, None)

    def owner(self, key: FrontendKey) -> str | None:
        queue = self._queues.get(key)
        return queue[0] if queue else None


def format_key(key: FrontendKey) -> str:
    """A frontend key as operators write it: 192.0.2.1:80/TCP, [2001:db8::1]:80/TCP, *:30080/TCP."""
    family, address, protocol, port = key
    host = "*" if not address else (f"[{address}]" if family == 6 else address)
    return f"{host}:{port}/{protocol}"


def describe_conflicts(losers: dict[str, frozenset[FrontendKey]]) -> dict[str, tuple[str, ...]]:
    """`ServiceTable.conflicts`: each losing service with the frontends it does not serve."""
    return {s: tuple(sorted(format_key(k) for k in lost)) for s, lost in losers.items()}
