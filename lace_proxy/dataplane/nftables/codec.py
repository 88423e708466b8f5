"""The nf_tables element codec (compiled, else its pure twin) and each container's layout.

`LACE_PROXY_NO_EXTENSIONS=1` forces the pure twin, as for the service table. A layout is
what the codec needs to read an element's text: the key's fields, the data's (none for a
set, VERDICT for a verdict map), and whether the set holds intervals. It follows the
declarations in skeleton.py and render.py; a test holds each against the kernel's own key
and data lengths.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, NamedTuple

from lace_proxy.dataplane.nftables.shared import ENDPOINT_MAP, NEED_SET
from lace_proxy.dataplane.nftables.skeleton import FRONTEND_KINDS, NODEPORT_KINDS, VERDICTS
from lace_proxy.twins import load

if TYPE_CHECKING:  # both twins have the pure one's API (a test holds them equal)
    import lace_proxy.dataplane.nftables._pycodec as _twin
else:
    _twin = load("lace_proxy.dataplane.nftables._ccodec", "lace_proxy.dataplane.nftables._pycodec")

IMPLEMENTATION = _twin.IMPLEMENTATION
ADDR4, ADDR6, PROTO, PORT = _twin.ADDR4, _twin.ADDR6, _twin.PROTO, _twin.PORT
MARK, VERDICT = _twin.MARK, _twin.VERDICT
Batch = _twin.Batch
DumpParser = _twin.DumpParser
CodecError = _twin.CodecError
dump_request = _twin.dump_request

__all__ = [
    "IMPLEMENTATION",
    "Batch",
    "CodecError",
    "DumpParser",
    "Layout",
    "dump_request",
    "layout",
]


class Layout(NamedTuple):
    """How a map's or set's elements are encoded."""

    key: tuple[int, ...]
    data: tuple[int, ...] = ()
    interval: bool = False


def _layouts(family: int) -> dict[str, Layout]:
    a = ADDR4 if family == 4 else ADDR6
    frontend = (a, PROTO, PORT)
    port_key = (PROTO, PORT)
    flow = (a, PORT, a, PORT)
    out = {
        "cluster-route": Layout(frontend),
        "affinity-ids": Layout(frontend, (MARK,)),
        "affinity-nodeport-ids": Layout(port_key, (MARK,)),
        "nodeport-cluster-route": Layout(port_key),
        "service-ips": Layout(frontend, (VERDICT,)),
        "firewall-ips": Layout(frontend),
        "firewall-allow": Layout((*frontend, a), interval=True),
        "service-nodeports": Layout(port_key, (VERDICT,)),
        "cluster-ips": Layout((a,)),
        "hairpin": Layout((a, a)),
        "service-ports": Layout(frontend),
        "ipvs-addresses": Layout((a,)),
        "controlled": Layout(frontend),
        "controlled-nodeports": Layout(port_key),
        "source-networks": Layout((a,), (VERDICT,), interval=True),
        "rescue-daddr": Layout(flow, (a,)),
        "rescue-dport": Layout(flow, (PORT,)),
        "rescue-sport": Layout(flow, (PORT,)),
        "rescue-saddr": Layout(flow, (a,)),
    }
    for kind in FRONTEND_KINDS:
        out[f"frontends-{kind}"] = Layout(frontend)
    for kind in NODEPORT_KINDS:
        out[f"nodeports-{kind}"] = Layout(port_key)
    for verdict in VERDICTS:
        out[f"no-endpoint-{verdict}"] = Layout(frontend)
        out[f"no-local-endpoint-{verdict}"] = Layout(frontend)
        out[f"no-endpoint-nodeport-{verdict}"] = Layout(port_key)
    for name in (
        "cluster-cidrs",
        "nodeport-cidrs",
        "service-cidrs",
        "clusterip-ranges",
        "host-unpeered",
        "local-pod-cidrs",
    ):
        out[name] = Layout((a,), interval=True)
    return out


_BY_NAME = {f"{name}-v{fam}": lay for fam in (4, 6) for name, lay in _layouts(fam).items()}
_REACH = re.compile(r"^reach-(nodeports-)?[a-z2-7]+-v([46])$")
#: A part of a split container (parts.py): its layout is the container's.
_PART = re.compile(r"^(.+-v[46])-p[0-9]+$")


def layout(container: str) -> Layout | None:
    """The layout of one of our maps or sets; None for one the codec does not write (the
    packet path's own state: affinity-vF, aff-*)."""
    part = _PART.match(container)
    found = _BY_NAME.get(container if part is None else part[1])
    if found is not None:
        return found
    counted = NEED_SET.match(container) or ENDPOINT_MAP.match(container)
    if counted is not None:  # endpoint counts' frontends, affinity timeouts' ids, endpoints
        if counted[1] is None:
            return Layout((MARK,))
        a = ADDR4 if counted[3] == "4" else ADDR6
        key = (PROTO, PORT) if counted[1].startswith("nodeport-") else (a, PROTO, PORT)
        return Layout(key, (a, PORT)) if counted.re is ENDPOINT_MAP else Layout(key)
    match = _REACH.match(container)
    if match is None:
        return None
    a = ADDR4 if match.group(2) == "4" else ADDR6
    return Layout((PROTO, PORT) if match.group(1) else (a, PROTO, PORT))
