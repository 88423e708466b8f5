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

from collections.abc import Callable, Iterator
from typing import Any, TypedDict

import msgspec

Decode = Callable[[bytes], Any]


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


class _List(TypedDict, total=False):
    """A list response: its metadata (resourceVersion, continue) whole, each item left
    encoded (a `Raw` is a span of the response, not a copy), to be decoded when reached."""

    metadata: Any
    items: list[msgspec.Raw]


class _Event(TypedDict, total=False):
    type: Any
    object: msgspec.Raw


#: Any JSON document, whole (msgspec: about twice as fast as `json.loads`).
decode: Decode = msgspec.json.Decoder().decode
_EVENT: msgspec.json.Decoder[_Event] = msgspec.json.Decoder(_Event)
_LIST: msgspec.json.Decoder[_List] = msgspec.json.Decoder(_List)


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
        """`item`: the shape of one object (None: decoded whole), a list's items' too."""
        self.object: Decode = decode if item is None else _shaped(item)

    def list(self, data: bytes) -> tuple[Any, Iterator[Any]]:
        """A list response's metadata and its items, each decoded only when the iterator
        reaches it: the first list of 30k objects arrives whole, and is held as its bytes
        rather than as 30k decoded objects at once (~170 MiB more at the peak)."""
        try:
            body = _LIST.decode(data)
            items: Iterator[Any] = map(self.object, body.get("items") or [])
        except msgspec.ValidationError:  # items that are not a list: the parser says why
            body = decode(data)
            items = iter(body.get("items") or [])
        return body.get("metadata") or {}, items

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
