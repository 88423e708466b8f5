"""The proxy's validated, immutable view of Services, EndpointSlices, Nodes, ServiceCIDRs and
the Lace network model (Networks and their binding and routing policies)."""

from lace_proxy.model.endpointslice import (
    LAST_CHANGE_TRIGGER_TIME,
    SERVICE_NAME_LABEL,
    Endpoint,
    EndpointPort,
    EndpointSlice,
)
from lace_proxy.model.errors import Rejections, ValidationError
from lace_proxy.model.lace import (
    LACE_GROUP_VERSION,
    LACE_KINDS,
    MATCH_KINDS,
    NETWORK_LABEL,
    NETWORK_TYPES,
    POD_NETWORK_TYPES,
    SELECTOR_OPERATORS,
    BindingRule,
    BindingSelector,
    LabelRequirement,
    LabelSelector,
    LaceObject,
    Network,
    NetworkBindingPolicy,
    NetworkRoutingPolicy,
    ServiceRoutingPolicy,
    parse_network,
    parse_network_binding_policy,
    parse_network_routing_policy,
    parse_service_routing_policy,
)
from lace_proxy.model.load import LoadResult, load_manifests
from lace_proxy.model.node import ZONE_LABEL, Node
from lace_proxy.model.objects import parse_object
from lace_proxy.model.parse import (
    LB_SOURCE_RANGES_ANNOTATION,
    parse_endpoint_slice,
    parse_node,
    parse_service,
    parse_service_cidr,
)
from lace_proxy.model.service import (
    DEFAULT_AFFINITY_TIMEOUT,
    HEADLESS_LABEL,
    SERVICE_PROXY_NAME_LABEL,
    Service,
    ServicePort,
)
from lace_proxy.model.servicecidr import ServiceCIDR

__all__ = [
    "DEFAULT_AFFINITY_TIMEOUT",
    "HEADLESS_LABEL",
    "LACE_GROUP_VERSION",
    "LACE_KINDS",
    "LAST_CHANGE_TRIGGER_TIME",
    "LB_SOURCE_RANGES_ANNOTATION",
    "MATCH_KINDS",
    "NETWORK_LABEL",
    "NETWORK_TYPES",
    "POD_NETWORK_TYPES",
    "SELECTOR_OPERATORS",
    "SERVICE_NAME_LABEL",
    "SERVICE_PROXY_NAME_LABEL",
    "ZONE_LABEL",
    "BindingRule",
    "BindingSelector",
    "Endpoint",
    "EndpointPort",
    "EndpointSlice",
    "LabelRequirement",
    "LabelSelector",
    "LaceObject",
    "LoadResult",
    "Network",
    "NetworkBindingPolicy",
    "NetworkRoutingPolicy",
    "Node",
    "Rejections",
    "Service",
    "ServiceCIDR",
    "ServicePort",
    "ServiceRoutingPolicy",
    "ValidationError",
    "load_manifests",
    "parse_endpoint_slice",
    "parse_network",
    "parse_network_binding_policy",
    "parse_network_routing_policy",
    "parse_node",
    "parse_object",
    "parse_service",
    "parse_service_cidr",
    "parse_service_routing_policy",
]
