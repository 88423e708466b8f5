"""Load Services, EndpointSlices, Nodes, ServiceCIDRs and the Lace resources from manifest
files (a static, API-less source).

A bad file or object is reported and skipped; everything else still loads, so that one typo
does not take down every service.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lace_proxy.model.endpointslice import EndpointSlice
from lace_proxy.model.errors import ValidationError
from lace_proxy.model.lace import LaceObject
from lace_proxy.model.node import Node
from lace_proxy.model.objects import parse_object
from lace_proxy.model.service import Service
from lace_proxy.model.servicecidr import ServiceCIDR

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")

# The C loader is several times faster on large dumps; same safe semantics.
_YamlLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass
class LoadResult:
    services: dict[str, Service] = field(default_factory=dict)  # by "namespace/name"
    slices: dict[str, EndpointSlice] = field(default_factory=dict)  # by "namespace/name"
    nodes: dict[str, Node] = field(default_factory=dict)  # by name
    service_cidrs: dict[str, ServiceCIDR] = field(default_factory=dict)  # by name
    # Lace resources (cluster-scoped) by (kind, name): ("Network", "default")
    lace: dict[tuple[str, str], LaceObject] = field(default_factory=dict)
    rejected: list[ValidationError] = field(default_factory=list)  # each has .source
    # (kind, key) -> the file each loaded object came from ("Service", "default/web")
    origins: dict[tuple[str, str], str] = field(default_factory=dict)


def load_manifests(path: str | os.PathLike[str]) -> LoadResult:
    """Load one manifest file, or every *.yaml/*.yml/*.json file directly in a folder.

    Files are read in name order; a file may hold several YAML documents, and `kind: List`
    (or `<Kind>List`, as the API returns) is expanded. A file that does not parse is
    rejected as a whole; an object already loaded from an earlier place is rejected as
    "duplicate" rather than silently replacing it. Raises FileNotFoundError if `path`
    does not exist.
    """
    root = Path(path)
    if root.is_dir():
        files = sorted(
            p for p in root.iterdir() if p.suffix.lower() in MANIFEST_SUFFIXES and p.is_file()
        )
    elif root.exists():
        files = [root]
    else:
        raise FileNotFoundError(f"no such manifest file or folder: {root}")

    result = LoadResult()
    origins = result.origins
    tables: dict[type, dict[str, Any]] = {
        Service: result.services,
        EndpointSlice: result.slices,
        Node: result.nodes,
        ServiceCIDR: result.service_cidrs,
    }
    for file in files:
        source = str(file)
        try:
            documents = _read_documents(file)
        except ValidationError as error:
            result.rejected.append(error)
            continue
        for item in _expand(documents, source, result.rejected):
            try:
                obj = parse_object(item)
            except ValidationError as error:
                result.rejected.append(error.with_source(source))
                continue
            kind = type(obj).__name__
            key = obj.name if isinstance(obj, Node) else obj.key
            first = origins.get((kind, key))
            if first is not None:
                reason = f"duplicate; already loaded from {first}"
                result.rejected.append(
                    ValidationError(kind, key, "", None, reason, "duplicate", source)
                )
                continue
            origins[kind, key] = source
            if isinstance(obj, Service | EndpointSlice | Node | ServiceCIDR):
                tables[type(obj)][key] = obj
            else:
                result.lace[kind, key] = obj
    return result


def _read_documents(file: Path) -> list[Any]:
    """All documents of one file, or a ValidationError (kind "File") if it cannot be read."""
    name = str(file)
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        reason = f"not UTF-8 (byte {error.start})"
        raise ValidationError("File", name, "", None, reason, "read_error") from error
    except OSError as error:
        reason = f"cannot read: {error.strerror or error}"
        raise ValidationError("File", name, "", None, reason, "read_error") from error
    if file.suffix.lower() == ".json":
        try:
            return [json.loads(text)]
        except json.JSONDecodeError as error:
            reason = f"line {error.lineno}, column {error.colno}: {error.msg}"
            raise ValidationError("File", name, "", None, reason, "syntax_error") from error
    try:
        # list(): a syntax error late in the file must discard the documents before it too.
        return [doc for doc in yaml.load_all(text, Loader=_YamlLoader) if doc is not None]
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        reason = f"{where}{error.problem or error.context or 'invalid YAML'}"
        raise ValidationError("File", name, "", None, reason, "syntax_error") from error
    except (yaml.YAMLError, ValueError) as error:  # ValueError: e.g. a timestamp like 2024-13-01
        raise ValidationError("File", name, "", None, str(error), "syntax_error") from error


def _expand(documents: list[Any], source: str, rejected: list[ValidationError]) -> Iterator[Any]:
    """Yield objects, expanding lists: `kind: List`, and the API's `<Kind>List`, whose items
    carry no apiVersion/kind of their own (they are inherited here)."""
    for doc in documents:
        kind = doc.get("kind") if isinstance(doc, dict) else None
        if not (isinstance(kind, str) and kind.endswith("List") and "items" in doc):
            yield doc
            continue
        items = doc["items"]
        if not isinstance(items, list):
            reason = "must be a list"
            rejected.append(
                ValidationError(kind, "", "items", items, reason, "invalid_type", source)
            )
            continue
        if kind != "List":
            inherited = {"apiVersion": doc.get("apiVersion"), "kind": kind[: -len("List")]}
            items = [
                {**inherited, **item} if isinstance(item, dict) and "kind" not in item else item
                for item in items
            ]
        yield from _expand(items, source, rejected)
