"""A change handler that records what a source told it: the common test double for sources."""

from __future__ import annotations

from typing import Any

from lace_proxy.model import EndpointSlice, Node, Service


class Recorder:
    """A change handler that records what it was told, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.objects: dict[str, Any] = {}

    def service_upserted(self, svc: Service) -> None:
        self.events.append(("service+", svc.key))
        self.objects[svc.key] = svc

    def service_deleted(self, key: str) -> None:
        self.events.append(("service-", key))

    def slice_upserted(self, sl: EndpointSlice) -> None:
        self.events.append(("slice+", sl.key))
        self.objects[sl.key] = sl

    def slice_deleted(self, key: str) -> None:
        self.events.append(("slice-", key))

    def node_upserted(self, node: Node) -> None:
        self.events.append(("node+", node.name))

    def node_deleted(self, name: str) -> None:
        self.events.append(("node-", name))

    def synced(self, source: str) -> None:
        self.events.append(("synced", source))

    def take(self) -> list[tuple[str, str]]:
        events, self.events = self.events, []
        return events
