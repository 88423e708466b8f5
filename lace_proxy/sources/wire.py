"""What the `kube` source decodes of the API's JSON: the fields the parsers read, no more.

A 30k-service list is 80 MB of JSON, much of it what a proxy never reads (managedFields,
uids, timestamps, an endpoint's targetRef). msgspec decodes it against the shapes below,
which skip every other field without building it, into the same plain dicts and lists that
`json.loads` gives, so the parsers (lace_proxy.model) stay the one place that validates.
A shape only says which members are objects; every value the parsers check is `Any`, so a
wrong type still reaches them and is rejected there, naming the object. A document that does
not fit a shape at all (a `metadata` that is not an object) is decoded whole instead.

Every field a parser reads must be listed here: tests/unit/test_wire.py parses rich
objects both ways and compares.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypedDict, TypeVar

import msgspec

Decode = Callable[[bytes], Any]
Item = TypeVar("Item")


class _Metadata(TypedDict, total=False):
    name: Any
    namespace: Any
    labels: Any
    annotations: Any
    resourceVersion: Any  # an event's version: where a watch resumes


class _Service(TypedDict, total=False):
    metadata: _Metadata
    spec: Any
    status: Any


class _Endpoint(TypedDict, total=False):
    addresses: Any
    conditions: Any
    nodeName: Any
    zone: Any
    hints: Any


class _EndpointSlice(TypedDict, total=False):
    metadata: _Metadata
    addressType: Any
    endpoints: list[_Endpoint]
    ports: Any


class _List(TypedDict, Generic[Item], total=False):
    """A list response: its metadata (resourceVersion, continue) whole, its items shaped."""

    metadata: Any
    items: list[Item]


class _Event(TypedDict, total=False):
    type: Any
    object: msgspec.Raw


#: Any JSON document, whole (msgspec: about twice as fast as `json.loads`).
decode: Decode = msgspec.json.Decoder().decode
_EVENT: msgspec.json.Decoder[_Event] = msgspec.json.Decoder(_Event)


def _shaped(shape: Any) -> Decode:
    decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(shape)

    def run(data: bytes) -> Any:
        try:
            return decoder.decode(data)
        except msgspec.ValidationError:  # valid JSON of another shape: the parser says why
            return decode(data)

    return run


class Decoders:
    """How one resource's list responses and watch events are decoded."""

    def __init__(self, item: Any = None) -> None:
        """`item`: the shape of one object (None: decoded whole); a list's is derived."""
        self.object: Decode = decode if item is None else _shaped(item)
        self.list: Decode = decode if item is None else _shaped(_List[item])

    def event(self, line: bytes) -> Any:
        """A watch event; its object by the resource's shape, except an ERROR's Status."""
        try:
            event = _EVENT.decode(line)
        except msgspec.ValidationError:
            return decode(line)
        raw = event.get("object")
        if raw is None:
            return event
        return {
            "type": event.get("type"),
            "object": (decode if event.get("type") == "ERROR" else self.object)(raw),
        }


WHOLE = Decoders()
SERVICES = Decoders(_Service)
ENDPOINT_SLICES = Decoders(_EndpointSlice)
