"""What the kernel must hold for a verdict to be what it is, and whether it does.

The expectations are written in the renderer's own element text (`Renderer.render_access`);
`check_kernel` compares them with what `NftablesBackend.read_back()` reports.
"""

from __future__ import annotations

import ipaddress
from dataclasses import replace
from types import SimpleNamespace
from typing import TYPE_CHECKING

from lace_proxy.dataplane.nftables import parts
from lace_proxy.dataplane.nftables.kernel import KernelState
from lace_proxy.dataplane.nftables.render import Rendered, Renderer, element_key, name_hash
from lace_proxy.dataplane.nftables.skeleton import FRONTEND_KINDS, NO_ENDPOINT_SETS, NODEPORT_KINDS
from lace_proxy.explain.explanation import Expect, Explanation, KernelCheck
from lace_proxy.explain.query import Query
from lace_proxy.table import NODE_PORT, Access

if TYPE_CHECKING:
    from lace_proxy.table import Frontend, Plan

#: Plan attributes `Renderer.render_access` reads (both table twins have them).
_ACCESS_FIELDS = ("family", "protocol", "port", "node_port", "cluster_ip", "external_ips", "lb_ips")


def access_elements(plan: Plan, f: Frontend, network: str | None) -> tuple[str, str, str | None]:
    """(controlled set, the frontend's element, `network`'s reach set) as the renderer writes
    them: `Renderer.render_access` on the plan, as if `network` were its only source."""
    view = SimpleNamespace(
        **{name: getattr(plan, name) for name in _ACCESS_FIELDS},
        access=Access(None, (network,) if network else ()),
    )
    out = Rendered()
    Renderer.render_access(view, out)
    v = f"v{plan.family}"
    if f.kind == NODE_PORT:
        controlled = f"controlled-nodeports-{v}"
        (element,) = out.elements[controlled]
        reach = f"reach-nodeports-{name_hash(network)}-{v}" if network else None
    else:
        controlled = f"controlled-{v}"
        element = next(x for x in out.elements[controlled] if x.split(" . ")[0] == f.address)
        reach = f"reach-{name_hash(network)}-{v}" if network else None
    if reach is not None and element not in out.elements.get(reach, ()):
        raise AssertionError(f"explain and the renderer disagree on {reach}")  # a bug here
    return controlled, element, reach


def dispatch_expects(plan: Plan, f: Frontend, q: Query) -> list[Expect]:
    """The frontend's dispatch element: in the kernel at all, whatever its verdict (a
    dispatch map's, or a set's that refuses it for want of endpoints)."""
    _, element, _ = access_elements(plan, f, None)
    v = f"v{plan.family}"
    nodeport = f.kind == NODE_PORT
    dispatch = (
        (f"service-nodeports-{v}", *(f"nodeports-{k}-{v}" for k in NODEPORT_KINDS))
        if nodeport
        else (f"service-ips-{v}", *(f"frontends-{k}-{v}" for k in FRONTEND_KINDS))
    )
    refusals = tuple(
        f"{name}-{v}"
        for name in NO_ENDPOINT_SETS
        if name.startswith("no-endpoint-nodeport-") == nodeport
    )
    what = "the service's dispatch"
    return [Expect((*dispatch, *refusals), element, True, what, programmed=True)]


def unpeered_expect(q: Query, present: bool) -> Expect:
    """Whether output's `host-unpeered` set must (not) cover the destination."""
    v = f"v{q.family}"
    what = "the pod networks host-local is not peered to"
    return Expect((f"host-unpeered-{v}",), q.destination, present, what, covers=True)


def _holds(elements: set[str], expect: Expect) -> bool:
    if not expect.covers:
        return any(element_key(x) == expect.element for x in elements)
    ip = ipaddress.ip_address(expect.element)
    for x in elements:
        first, _, last = element_key(x).partition("-")  # a prefix, or a range "first-last"
        try:
            if last:
                low, high = ipaddress.ip_address(first), ipaddress.ip_address(last)
                if low.version == ip.version and low <= ip <= high:  # type: ignore[operator]
                    return True
            elif ip in ipaddress.ip_network(first, strict=False):
                return True
        except (ValueError, TypeError):
            continue
    return False


def check_kernel(e: Explanation, kernel: KernelState | None, table: str) -> Explanation:
    """The explanation with the kernel's opinion: do its sets say what the table says?"""
    if e.kernel.detail and not e.expects:
        return e  # decided elsewhere (another node's kernel)
    if kernel is None:
        return replace(e, kernel=KernelCheck("not programmed", f"no table inet {table}"))
    if not e.expects:
        return replace(
            e, kernel=KernelCheck("agrees", "nothing of lace-proxy's applies to this connection")
        )
    missing, wrong, right = [], [], []
    for x in e.expects:
        holders = [h for c in x.containers for h in parts.holders(c, kernel.elements)]
        holding = [c for c in holders if _holds(kernel.elements[c], x)]
        held = bool(holding)
        where = "/".join(x.containers)
        if held == x.present:
            named = holding[0] if held else where
            right.append(f"{named} ({x.what}) {'holds' if held else 'lacks'} {x.element}")
        elif x.programmed and x.present:
            missing.append(f"{x.element} is not in {where} ({x.what})")
        elif not holders and x.present:
            wrong.append(f"no set {where} ({x.what}) to hold {x.element}")
        else:
            expected = "should hold" if x.present else "should not hold"
            found = "lacks it" if not held else "holds it"
            wrong.append(f"{where} ({x.what}) {expected} {x.element} but {found}")
    if missing:
        return replace(e, kernel=KernelCheck("not programmed", "; ".join(missing)))
    if wrong:
        return replace(e, kernel=KernelCheck("differs", "; ".join(wrong)))
    return replace(e, kernel=KernelCheck("agrees", "; ".join(right)))
