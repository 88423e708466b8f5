"""Sources feed typed changes (validated model objects) to one change handler: the proxier.

`files` reads a folder of manifests (the embedded default); `kube` (later) watches the API.
"""

from __future__ import annotations

from typing import Protocol

from lace_proxy.model import EndpointSlice, Node, Service


class ChangeHandler(Protocol):
    """What a source calls; implemented by the proxier's change tracker."""

    def service_upserted(self, svc: Service) -> None: ...
    def service_deleted(self, key: str) -> None: ...
    def slice_upserted(self, sl: EndpointSlice) -> None: ...
    def slice_deleted(self, key: str) -> None: ...
    def node_upserted(self, node: Node) -> None: ...
    def node_deleted(self, name: str) -> None: ...
    def synced(self, source: str) -> None:
        """The source has delivered its complete initial state."""
