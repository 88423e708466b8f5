"""The Lace CRDs (charts/lace-networks/crds): well formed, structural, and in agreement with the
model's validation (lace_proxy/model/lace.py) on the examples of test_lace_model.py.

The API server validates with the CRDs' OpenAPI v3 schemas; the subset they use reads as JSON
Schema draft 4 once the x-kubernetes-* extensions are dropped (a `set` list becomes
`uniqueItems`), and the `cidr` format is checked as the API server does, with Go's ParseCIDR
rules: host bits may be set, a bare address is not a CIDR.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from lace_proxy.model import LACE_KINDS, ValidationError, parse_object

from ..crdschema import CRDS, GROUP, VERSION, kind_validator, schema_of
from ..lacecases import (
    ALL_ERRORS,
    SCHEMA_GAPS,
    VALID,
    load,
    mutated,
)

# --- structure ----------------------------------------------------------------------------------


def test_one_crd_per_lace_kind() -> None:
    assert sorted(CRDS) == sorted(LACE_KINDS)
    for path, crd in CRDS.values():
        assert path.name == f"{GROUP}_{crd['spec']['names']['plural']}.yaml"


@pytest.mark.parametrize("kind", sorted(LACE_KINDS))
def test_crd_identity(kind: str) -> None:
    _, crd = CRDS[kind]
    spec = crd["spec"]
    names = spec["names"]
    assert (crd["apiVersion"], crd["kind"]) == (
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
    )
    assert crd["metadata"]["name"] == f"{names['plural']}.{GROUP}"
    assert (spec["group"], spec["scope"]) == (GROUP, "Cluster")
    assert (names["kind"], names["listKind"], names["singular"]) == (
        kind,
        f"{kind}List",
        kind.lower(),
    )
    assert names["plural"] in (f"{kind.lower()}s", f"{kind.lower()[:-1]}ies")
    assert names["shortNames"] and "lace" in names["categories"]
    [version] = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == (VERSION, True, True)


def test_short_names_are_unique() -> None:
    short = [name for _, crd in CRDS.values() for name in crd["spec"]["names"]["shortNames"]]
    assert len(short) == len(set(short))


_SCHEMA_KEYS = {
    "type",
    "description",
    "properties",
    "required",
    "items",
    "additionalProperties",
    "enum",
    "pattern",
    "format",
    "minItems",
    "maxItems",
    "maxLength",
    "x-kubernetes-list-type",
    "x-kubernetes-map-type",
}
_JUNCTORS = ("allOf", "anyOf", "oneOf", "not")
#: What the API server refuses inside a junctor of a structural schema.
_NOT_IN_JUNCTORS = {"type", "description", "default", "additionalProperties", "nullable"}


def _structural_problems(node: dict[str, Any], path: str = "") -> list[str]:
    """Why `node` is not a structural schema (with the keys these CRDs use), if it is not.

    Every node has a type, objects have properties or additionalProperties (not both; root
    metadata is the exception), arrays have items, required names exist, and junctors only
    restrict fields that the schema around them specifies.
    """
    problems = [f"{path}: unknown key {key}" for key in node.keys() - _SCHEMA_KEYS - {*_JUNCTORS}]
    kind = node.get("type")
    if kind is None:
        problems.append(f"{path}: no type")
    properties = node.get("properties", {})
    has_properties, has_additional = "properties" in node, "additionalProperties" in node
    if kind == "object" and path != ".metadata" and has_properties == has_additional:
        problems.append(f"{path}: needs properties or additionalProperties (one of them)")
    if kind == "array" and not isinstance(node.get("items"), dict):
        problems.append(f"{path}: array without items")
    problems += [
        f"{path}: required {n} is no property"
        for n in node.get("required", ())
        if n not in properties
    ]
    for name, child in properties.items():
        problems += _structural_problems(child, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), dict):
        problems += _structural_problems(node["additionalProperties"], f"{path}.*")
    if isinstance(node.get("items"), dict):
        problems += _structural_problems(node["items"], f"{path}[]")
    for junctor in _JUNCTORS:
        for branch in _branches(node.get(junctor)):
            problems += _junctor_problems(branch, node, f"{path}/{junctor}")
    return problems


def _branches(value: Any) -> list[dict[str, Any]]:
    """The schemas of a junctor: a list for allOf/anyOf/oneOf, one schema for not."""
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _junctor_problems(branch: dict[str, Any], outer: dict[str, Any], path: str) -> list[str]:
    problems = [
        f"{path}: {key} not allowed in a junctor" for key in branch.keys() & _NOT_IN_JUNCTORS
    ]
    problems += [
        f"{path}: unknown key {key}" for key in branch.keys() - _SCHEMA_KEYS - {*_JUNCTORS}
    ]
    outer_properties = outer.get("properties", {})
    for name in branch.get("required", ()):
        if name not in outer_properties:
            problems.append(f"{path}: required {name} is not specified outside")
    for name, child in branch.get("properties", {}).items():
        if name not in outer_properties:
            problems.append(f"{path}: property {name} is not specified outside")
        else:
            problems += _junctor_problems(child, outer_properties[name], f"{path}.{name}")
    if "items" in branch:
        problems += _junctor_problems(branch["items"], outer.get("items", {}), f"{path}[]")
    for junctor in _JUNCTORS:
        for nested in _branches(branch.get(junctor)):
            problems += _junctor_problems(nested, outer, f"{path}/{junctor}")
    return problems


@pytest.mark.parametrize("kind", sorted(LACE_KINDS))
def test_schema_is_structural(kind: str) -> None:
    schema = schema_of(kind)
    assert _structural_problems(schema) == []
    assert set(schema["properties"]) == {"apiVersion", "kind", "metadata", "spec"}


def test_structural_check_finds_problems() -> None:
    """The check above must be able to fail."""
    schema = {
        "type": "object",
        "properties": {"a": {"properties": {}}, "b": {"type": "array"}},
        "required": ["c"],
        "oneOf": [{"type": "object", "required": ["d"], "properties": {"e": {"minItems": 1}}}],
    }
    assert _structural_problems(schema) == [
        ": required c is no property",
        ".a: no type",
        ".b: array without items",
        "/oneOf: type not allowed in a junctor",
        "/oneOf: required d is not specified outside",
        "/oneOf: property e is not specified outside",
    ]


def _field_exists(schema: dict[str, Any], json_path: str) -> bool:
    """Whether a printer column's JSONPath (like .spec.rules[*].network) names a field."""
    node = schema
    for step in re.findall(r"\.([^.\[]+)(\[\*\])?", json_path):
        name, every = step
        node = node.get("properties", {}).get(name)
        if node is None:
            return False
        if every:
            node = node["items"]
    return True


@pytest.mark.parametrize("kind", sorted(LACE_KINDS))
def test_printer_columns_name_real_fields(kind: str) -> None:
    columns = CRDS[kind][1]["spec"]["versions"][0]["additionalPrinterColumns"]
    schema = schema_of(kind)
    for column in columns:
        assert column["type"] in ("string", "date", "integer")
        if not column["jsonPath"].startswith(".metadata."):
            assert _field_exists(schema, column["jsonPath"]), column
    assert columns[-1] == {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


def test_network_shows_its_type() -> None:
    columns = CRDS["Network"][1]["spec"]["versions"][0]["additionalPrinterColumns"]
    assert {"name": "Type", "type": "string", "jsonPath": ".spec.type"} in columns


# --- the schemas agree with the model -----------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_objects_pass_the_model_and_the_crd(name: str) -> None:
    obj = VALID[name]
    parse_object(obj)
    errors = [error.message for error in kind_validator(obj["kind"]).iter_errors(obj)]
    assert errors == []


@pytest.mark.parametrize(
    ("text", "path", "new", "field", "value", "code"),
    ALL_ERRORS,
    ids=[f"{load(case[0])['kind']}-{case[3]}-{case[5]}" for case in ALL_ERRORS],
)
def test_the_crd_rejects_what_the_model_rejects(
    text: str, path: str, new: Any, field: str, value: Any, code: str
) -> None:
    obj = mutated(text, path, new)
    with pytest.raises(ValidationError):
        parse_object(obj)
    # A gap must stay a gap: if the CRD learns to reject it, drop it from SCHEMA_GAPS.
    assert kind_validator(obj["kind"]).is_valid(obj) is ((obj["kind"], field, value) in SCHEMA_GAPS)
