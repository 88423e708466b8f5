"""The `files` source: a folder of Service, EndpointSlice, Node, ServiceCIDR and Lace manifests,
kept in step.

It polls the folder's file signatures (name, size, mtime) and reloads when they change;
the reload is diffed against what was delivered before, so the handler sees only real
changes. Bad input never removes what is being served: an object that fails validation
keeps its last good version, and a file that does not parse keeps all its objects.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

from lace_proxy.model import (
    EndpointSlice,
    Node,
    Rejections,
    Service,
    ServiceCIDR,
    load_manifests,
)
from lace_proxy.model.load import MANIFEST_SUFFIXES, LoadResult
from lace_proxy.sources import ChangeHandler

log = logging.getLogger(__name__)

SOURCE_NAME = "files"
Key = tuple[str, str]  # (kind, namespace/name or node name)


def _signature(root: Path) -> tuple[tuple[str, int, int], ...]:
    if root.is_file():
        st = root.stat()
        return ((root.name, st.st_size, st.st_mtime_ns),)
    out = []
    with os.scandir(root) as entries:
        for entry in entries:
            if entry.name.lower().endswith(MANIFEST_SUFFIXES) and entry.is_file():
                st = entry.stat()
                out.append((entry.name, st.st_size, st.st_mtime_ns))
    return tuple(sorted(out))


class ManifestSource:
    """Delivers a manifest folder's objects to a change handler, and then their changes."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        handler: ChangeHandler,
        rejections: Rejections | None = None,
        interval: float = 0.5,
    ) -> None:
        self.path = Path(path)
        self.handler = handler
        self.rejections = rejections or Rejections()
        self.interval = interval
        self._signature: tuple[tuple[str, int, int], ...] | None = None
        self._objects: dict[Key, Any] = {}
        self._origins: dict[Key, str] = {}
        self._rejected: set[Key] = set()
        self._synced = False
        self._error: str | None = None

    def waiting(self) -> list[str]:
        """The folder, until it has been read once (`Proxier.describe_source`)."""
        if self._synced:
            return []
        return [f"{self.path} ({self._error or 'not read yet'})"]

    def poll(self) -> bool:
        """Reload if the folder changed; True when something was delivered."""
        loaded = self.scan()
        return loaded is not None and self.deliver(loaded)

    def scan(self) -> LoadResult | None:
        """Read the folder if it changed (None if not). Touches no handler: thread-safe."""
        try:
            signature = _signature(self.path)
            if signature == self._signature:
                return None
            result = load_manifests(self.path)
        except OSError as exc:
            if str(exc) != self._error:  # once per distinct problem, not every poll
                self._error = str(exc)
                log.error("cannot read manifests: %s; keeping what is served", exc)
            return None
        self._error = None
        self._signature = signature
        return result

    def deliver(self, result: LoadResult) -> bool:
        """Hand the handler what changed since the last delivery; True if anything did."""
        objects: dict[Key, Any] = {}
        origins = dict(result.origins)
        for table in (result.services, result.slices, result.nodes, result.service_cidrs):
            for name, obj in table.items():
                objects[(type(obj).__name__, name)] = obj
        objects.update(result.lace)
        bad_files: set[str] = set()
        rejected: set[Key] = set()
        for error in result.rejected:
            self.rejections.record(error)
            if error.kind == "File":
                bad_files.add(str(error.object))
            else:
                rejected.add((error.kind, str(error.object)))
        # Keep the last good version of whatever is broken now.
        for key, obj in self._objects.items():
            if key not in objects and (key in rejected or self._origins.get(key) in bad_files):
                objects[key] = obj
                origins[key] = self._origins[key]
        for key in self._rejected - rejected:
            self.rejections.forget(*key)
        self._rejected = rejected
        self._origins = origins
        return self._deliver(objects)

    def _deliver(self, objects: dict[Key, Any]) -> bool:
        h = self.handler
        old = self._objects
        changed = False
        # Deletions of slices before services, additions of services before slices:
        # the table never needs the order, but logs read naturally this way.
        for key in sorted(old.keys() - objects.keys(), key=_order, reverse=True):
            kind, name = key
            if kind == "Service":
                h.service_deleted(name)
            elif kind == "EndpointSlice":
                h.slice_deleted(name)
            elif kind == "Node":
                h.node_deleted(name)
            elif kind == "ServiceCIDR":
                h.service_cidr_deleted(name)
            else:
                h.lace_deleted(kind, name)
            changed = True
        for key in sorted(objects, key=_order):
            obj = objects[key]
            if old.get(key) == obj:
                continue
            if isinstance(obj, Service):
                h.service_upserted(obj)
            elif isinstance(obj, EndpointSlice):
                h.slice_upserted(obj)
            elif isinstance(obj, Node):
                h.node_upserted(obj)
            elif isinstance(obj, ServiceCIDR):
                h.service_cidr_upserted(obj)
            else:
                h.lace_upserted(obj)
            changed = True
        self._objects = objects
        return changed

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver the folder, report it synced, then follow changes until `stop` is set."""
        while True:
            loaded = await asyncio.to_thread(self.scan)
            if loaded is not None:
                self.deliver(loaded)  # on the loop: the handler is not thread-safe
            if self._signature is not None and not self._synced:
                self._synced = True
                self.handler.synced(SOURCE_NAME)
            try:
                await asyncio.wait_for(stop.wait(), self.interval)
                return
            except TimeoutError:
                pass


def _order(key: Key) -> tuple[int, str, str]:
    """Networks and policies first, then ServiceCIDRs, nodes, services and slices."""
    order = {"ServiceCIDR": 1, "Node": 2, "Service": 3, "EndpointSlice": 4}
    return order.get(key[0], 0), key[0], key[1]
