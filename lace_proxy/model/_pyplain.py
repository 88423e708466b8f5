"""Endpoints as the EndpointSlice controller writes them, parsed without the checked parse's
bookkeeping: the pure-Python twin of ext/plain.pyx (`_cplain`), and its reference."""

from __future__ import annotations

from typing import Any

from lace_proxy.model.endpointslice import Endpoint
from lace_proxy.model.fields import canonical_ip

IMPLEMENTATION = "pure"


def plain_endpoint(value: Any, version: int | None) -> Endpoint | None:
    """The endpoint as the EndpointSlice controller writes it (IP addresses, conditions,
    node and zone, no hints), in a third of the checked parse's time; None for anything
    else, which the checked parse then judges. A 30k-service list holds 300k endpoints."""
    if type(value) is not dict or version is None or value.get("hints") is not None:
        return None
    raw = value.get("addresses")
    if type(raw) is not list or not raw:
        return None
    addresses = []
    for text in raw:
        ip = canonical_ip(text) if type(text) is str else None
        if ip is None or ip[0] != version:
            return None
        addresses.append(ip[1])
    conditions = value.get("conditions")
    if conditions is None:
        conditions = {}
    elif type(conditions) is not dict:
        return None
    ready: Any = conditions.get("ready")
    serving: Any = conditions.get("serving")
    terminating: Any = conditions.get("terminating")
    ready = True if ready is None else ready
    serving = True if serving is None else serving
    terminating = False if terminating is None else terminating
    if not (type(ready) is type(serving) is type(terminating) is bool):
        return None
    node, zone = value.get("nodeName"), value.get("zone")
    if (node is not None and type(node) is not str) or (zone is not None and type(zone) is not str):
        return None
    return Endpoint(tuple(addresses), ready, serving, terminating, node or None, zone or None)
