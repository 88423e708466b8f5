"""The Lace CRDs' OpenAPI v3 schemas as JSON Schema validators, checking what the API server
would: shared by the CRD tests and the networks chart's tests."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from lace_proxy.model import LACE_GROUP_VERSION


def json_schema(node: Any) -> Any:
    """The OpenAPI v3 subset these CRDs use, as JSON Schema: x-kubernetes-* dropped, a `set`
    list unique."""
    if isinstance(node, list):
        return [json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    result = {k: json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if node.get("x-kubernetes-list-type") == "set":
        result["uniqueItems"] = True
    return result


FORMATS = jsonschema.FormatChecker(formats=())


@FORMATS.checks("cidr", raises=ValueError)
def _is_cidr(value: object) -> bool:
    """The API server's `cidr` format: Go's ParseCIDR (host bits may be set)."""
    if not isinstance(value, str):
        return True  # the type check reports it
    _, slash, bits = value.partition("/")
    return bool(slash and bits.isdigit() and ipaddress.ip_network(value, strict=False))


def validator(open_api_v3_schema: dict[str, Any]) -> jsonschema.Draft4Validator:
    """A validator of one CRD version's openAPIV3Schema."""
    return jsonschema.Draft4Validator(json_schema(open_api_v3_schema), format_checker=FORMATS)


CRD_DIR = Path(__file__).resolve().parents[1] / "charts" / "lace-networks" / "crds"
GROUP, VERSION = LACE_GROUP_VERSION.split("/")


def _load_crds() -> dict[str, tuple[Path, dict[str, Any]]]:
    crds = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        crds[doc["spec"]["names"]["kind"]] = (path, doc)
    return crds


CRDS = _load_crds()


def schema_of(kind: str) -> dict[str, Any]:
    return CRDS[kind][1]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def kind_validator(kind: str) -> jsonschema.Draft4Validator:
    """The validator of a Lace kind's CRD, as the chart ships it."""
    return validator(schema_of(kind))
