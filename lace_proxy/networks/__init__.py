"""The Lace network model resolved from Network and policy objects (DESIGN.md §3)."""

from lace_proxy.networks.graph import NetworkGraph, ServiceRef

__all__ = ["NetworkGraph", "ServiceRef"]
