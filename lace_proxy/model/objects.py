"""Any supported API object -> its model object, chosen by apiVersion and kind.

The one module that knows both the Kubernetes kinds (parse.py) and the Lace kinds (lace.py),
so that neither has to import the other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lace_proxy.model.endpointslice import EndpointSlice
from lace_proxy.model.errors import ValidationError
from lace_proxy.model.lace import LACE_GROUP_VERSION, LACE_KINDS, LaceObject
from lace_proxy.model.node import Node
from lace_proxy.model.parse import (
    parse_endpoint_slice,
    parse_node,
    parse_service,
    parse_service_cidr,
)
from lace_proxy.model.service import Service
from lace_proxy.model.servicecidr import SERVICE_CIDR_API_VERSION, ServiceCIDR

#: Every parser by (apiVersion, kind); this order is the order error messages list them in.
_PARSERS: dict[tuple[str, str], Callable[[dict[str, Any]], Any]] = {
    ("v1", "Service"): parse_service,
    ("discovery.k8s.io/v1", "EndpointSlice"): parse_endpoint_slice,
    ("v1", "Node"): parse_node,
    (SERVICE_CIDR_API_VERSION, "ServiceCIDR"): parse_service_cidr,
    **{(LACE_GROUP_VERSION, kind): parser for kind, parser in LACE_KINDS.items()},
}


def parse_object(obj: Any) -> Service | EndpointSlice | Node | ServiceCIDR | LaceObject:
    """Any supported object, chosen by apiVersion and kind; others are "unsupported_kind"."""
    if not isinstance(obj, dict):
        raise ValidationError("Object", "", "", obj, "must be an object", "invalid_type")
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if isinstance(api_version, str) and isinstance(kind, str):
        parser = _PARSERS.get((api_version, kind))
        if parser is not None:
            return parser(obj)
    supported = [f"{version} {name}" for version, name in _PARSERS]
    expected = f"expected {', '.join(supported[:-1])} or {supported[-1]}"
    if isinstance(kind, str) and kind in {name for _, name in _PARSERS}:
        field, value, reason = "apiVersion", api_version, f"unsupported version; {expected}"
    else:
        field, value, reason = "kind", kind, f"unsupported kind; {expected}"
    label = kind if isinstance(kind, str) and kind else "Object"
    raise ValidationError(label, _identity(obj), field, value, reason, "unsupported_kind")


def _identity(obj: dict[str, Any]) -> str:
    """Best-effort "namespace/name" of an object that will not be parsed."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        return ""
    name, namespace = meta["name"], meta.get("namespace")
    return f"{namespace}/{name}" if isinstance(namespace, str) and namespace else name
