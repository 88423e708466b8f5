"""The answer: an `Explanation` (verdict, reason, backends, what the kernel must hold), read
top to bottom as text or as a stable JSON document."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lace_proxy.explain.query import Query
from lace_proxy.networks.graph import Condition
from lace_proxy.table.changeset import backend_state

#: Verdicts, and whether the connection goes through (exit code 0) or not (1).
ALLOWED = "allowed"  # lace-proxy forwards it to a backend
PASSES = "passes"  # not lace-proxy's to decide: it lets it through untouched
DENIED = "denied"  # the network model refuses it (ICMP admin-prohibited)
DROPPED = "dropped"  # silently dropped (a timeout for the client)
REJECTED = "rejected"  # refused for want of endpoints / service port (port-unreachable)
UNPROXIED = "unproxied"  # the node's connection to a ClusterIP outside node.serviceCIDRs
GOES_THROUGH = (ALLOWED, PASSES)


@dataclass(frozen=True)
class BackendInfo:
    """An endpoint that may answer, with the conditions it was chosen under."""

    ip: str
    port: int
    ready: bool
    serving: bool
    terminating: bool
    local: bool

    def __str__(self) -> str:
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        state = "ready" if self.ready else ("terminating" if self.terminating else "not-ready")
        serving = ",serving" if self.serving else ""
        return f"{host}:{self.port} ({state}{serving},{'local' if self.local else 'remote'})"


@dataclass(frozen=True)
class Expect:
    """One thing the kernel must hold (or must not) for the verdict to be what it is.

    `containers`: the set or map names, any of which may hold it; `element` is the renderer's
    text (a map element is matched by its key). With `covers`, an interval set must (not) hold
    a prefix covering the address `element`. `programmed` marks the frontend's own dispatch:
    missing, the connection is "not programmed" rather than "differs".
    """

    containers: tuple[str, ...]
    element: str
    present: bool
    what: str
    covers: bool = False
    programmed: bool = False


@dataclass(frozen=True)
class KernelCheck:
    """Whether the kernel agrees with the table's verdict."""

    status: str  # "agrees" | "differs" | "not programmed" | "not checked"
    detail: str = ""

    def __str__(self) -> str:
        text = {
            "agrees": "kernel agrees",
            "differs": "kernel differs",
            "not programmed": "not programmed",
            "not checked": "not checked",
        }[self.status]
        return f"{text}: {self.detail}" if self.detail else text


@dataclass(frozen=True)
class Explanation:
    """The answer, in parts an operator reads top to bottom (and `to_dict` for scripts)."""

    query: Query
    networks_enabled: bool
    source_network: str | None
    source_reason: str
    destination_kind: str  # a frontend kind, "pod", "node", "ClusterIP (other port)", "none"
    destination: str
    service: str | None = None
    service_port_name: str | None = None
    destination_network: str | None = None  # the pod network of a pod address
    bound_network: str | None = None
    bound_by: str | None = None
    binding_reason: str | None = None
    verdict: str = PASSES
    reason: str = ""
    allowed_by: tuple[tuple[str, str], ...] = ()  # (kind, name); ("own network", network)
    backends: tuple[BackendInfo, ...] = ()
    no_backends: str | None = None
    excluded: tuple[tuple[str, str], ...] = ()
    conditions: tuple[Condition, ...] = ()
    rejections: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    expects: tuple[Expect, ...] = ()
    kernel: KernelCheck = field(default_factory=lambda: KernelCheck("not checked"))

    @property
    def goes_through(self) -> bool:
        return self.verdict in GOES_THROUGH

    @property
    def exit_code(self) -> int:
        """0: it goes through; 1: refused, dropped, unanswered or not proxied."""
        return 0 if self.goes_through else 1

    def to_dict(self) -> dict[str, Any]:
        """A stable JSON document (keys never depend on the case)."""
        q = self.query
        return {
            "query": {
                "source": q.source,
                "destination": q.destination,
                "port": q.port,
                "protocol": q.protocol,
            },
            "networkModel": self.networks_enabled,
            "source": {"network": self.source_network, "reason": self.source_reason},
            "destination": {
                "kind": self.destination_kind,
                "description": self.destination,
                "service": self.service,
                "portName": self.service_port_name,
                "network": self.destination_network,
            },
            "binding": {
                "network": self.bound_network,
                "boundBy": self.bound_by,
                "reason": self.binding_reason,
            },
            "verdict": self.verdict,
            "allowed": self.goes_through,
            "reason": self.reason,
            "allowedBy": [{"kind": k, "name": n} for k, n in self.allowed_by],
            "backends": [backend_state(b) for b in self.backends],
            "noBackends": self.no_backends,
            "excluded": [{"address": a, "reason": r} for a, r in self.excluded],
            "conditions": [
                {"code": c.code, "subject": c.subject, "message": c.message}
                for c in self.conditions
            ],
            "rejected": list(self.rejections),
            "notes": list(self.notes),
            "kernel": {"status": self.kernel.status, "detail": self.kernel.detail},
            "exitCode": self.exit_code,
        }

    def to_text(self) -> str:
        """Aligned `label  value` lines; lists continue under an empty label."""
        rows: list[tuple[str, str]] = [
            ("connection", str(self.query)),
            ("source", self.source_reason),
            ("destination", self.destination),
        ]
        if self.binding_reason is not None:
            rows.append(("bound to", self.binding_reason))
        rows.append(("verdict", self.verdict))
        rows.append(("why", self.reason))
        if self.service is not None or self.backends:
            rows += _many("backends", [str(b) for b in self.backends] or [self.no_backends or "-"])
        rows += _many("excluded", [f"{a}: {r}" for a, r in self.excluded])
        rows += _many("condition", [f"{c.subject} {c.code}: {c.message}" for c in self.conditions])
        rows += _many("rejected", list(self.rejections))
        rows += _many("note", list(self.notes))
        rows.append(("kernel", str(self.kernel)))
        width = max(len(label) for label, _ in rows)
        return "\n".join(f"{label.ljust(width)}  {value}".rstrip() for label, value in rows)


def _many(label: str, values: Sequence[str]) -> list[tuple[str, str]]:
    return [(label if i == 0 else "", v) for i, v in enumerate(values)]
