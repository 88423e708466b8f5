"""The Lace network model resolved from Network and policy objects (DESIGN.md §3)."""

from lace_proxy.networks.graph import NetworkGraph, ServiceRef
from lace_proxy.networks.view import Binding, NetworkView

__all__ = ["Binding", "NetworkGraph", "NetworkView", "ServiceRef"]
