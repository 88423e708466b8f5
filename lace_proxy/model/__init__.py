"""The proxy's validated, immutable view of Services, EndpointSlices and Nodes."""

from lace_proxy.model.endpointslice import (
    LAST_CHANGE_TRIGGER_TIME,
    SERVICE_NAME_LABEL,
    Endpoint,
    EndpointPort,
    EndpointSlice,
)
from lace_proxy.model.errors import Rejections, ValidationError
from lace_proxy.model.load import LoadResult, load_manifests
from lace_proxy.model.node import ZONE_LABEL, Node
from lace_proxy.model.parse import (
    LB_SOURCE_RANGES_ANNOTATION,
    parse_endpoint_slice,
    parse_node,
    parse_object,
    parse_service,
)
from lace_proxy.model.service import (
    DEFAULT_AFFINITY_TIMEOUT,
    HEADLESS_LABEL,
    SERVICE_PROXY_NAME_LABEL,
    Service,
    ServicePort,
)

__all__ = [
    "DEFAULT_AFFINITY_TIMEOUT",
    "HEADLESS_LABEL",
    "LAST_CHANGE_TRIGGER_TIME",
    "LB_SOURCE_RANGES_ANNOTATION",
    "SERVICE_NAME_LABEL",
    "SERVICE_PROXY_NAME_LABEL",
    "ZONE_LABEL",
    "Endpoint",
    "EndpointPort",
    "EndpointSlice",
    "LoadResult",
    "Node",
    "Rejections",
    "Service",
    "ServicePort",
    "ValidationError",
    "load_manifests",
    "parse_endpoint_slice",
    "parse_node",
    "parse_object",
    "parse_service",
]
