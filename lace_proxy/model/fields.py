"""Field parsing shared by every kind: raw API dicts (JSON form) in, validated values out.

Each helper checks the JSON type first, then the value, and refuses with a `ValidationError`
whose reason and code name the field, so that wrong JSON types never escape as
TypeError/KeyError/AttributeError. Absent, null and empty values are treated alike, as Go's
decoding of these types does. parse.py (the Kubernetes kinds) and lace.py (the Lace kinds)
both build on this module.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from socket import AF_INET, AF_INET6, inet_ntop, inet_pton
from typing import Any, NoReturn

from lace_proxy.model.errors import ValidationError


class Subject:
    """The object being parsed, so that every error can name it."""

    __slots__ = ("kind", "name")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.name = ""

    def fail(self, field: str, value: Any, reason: str, code: str) -> NoReturn:
        raise ValidationError(self.kind, self.name, field, value, reason, code)


def as_mapping(s: Subject, value: Any, field: str) -> dict[str, Any]:
    """An object; absent or null is the empty one."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    s.fail(field, value, "must be an object", "invalid_type")


def as_list(s: Subject, value: Any, field: str) -> list[Any]:
    """A list; absent or null is the empty one."""
    if value is None:
        return []
    if isinstance(value, list):
        return value
    s.fail(field, value, "must be a list", "invalid_type")


def opt_str(s: Subject, value: Any, field: str) -> str | None:
    """A string, or None for absent/null/empty (Go cannot tell these apart)."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return value
    s.fail(field, value, "must be a string", "invalid_type")


def req_str(s: Subject, value: Any, field: str) -> str:
    """A non-empty string: "" is absent to Go, so it is missing here too."""
    result = opt_str(s, value, field)
    if result is None:
        s.fail(field, None, "required", "missing_field")
    return result


def opt_enum(s: Subject, value: Any, field: str, allowed: tuple[str, ...], default: str) -> str:
    """One of `allowed`, or `default` when absent (the API server's defaulting)."""
    result = opt_str(s, value, field)
    if result is None:
        return default
    if result not in allowed:
        s.fail(field, value, f"must be one of {', '.join(allowed)}", "invalid_value")
    return result


def req_enum(s: Subject, value: Any, field: str, allowed: tuple[str, ...]) -> str:
    """One of `allowed`, for fields that have no default."""
    result = req_str(s, value, field)
    if result not in allowed:
        s.fail(field, value, f"must be one of {', '.join(allowed)}", "invalid_value")
    return result


def as_bool(s: Subject, value: Any, field: str, default: bool) -> bool:
    """A JSON boolean (not a truthy value), or `default` when absent."""
    if value is None:
        return default
    if value is True or value is False:
        return value
    s.fail(field, value, "must be a boolean", "invalid_type")


def as_int(s: Subject, value: Any, field: str) -> int:
    """A JSON integer."""
    # bool is an int subclass; `port: true` in YAML must not become port 1.
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    s.fail(field, value, "must be an integer", "invalid_type")


def as_port(s: Subject, value: Any, field: str, *, zero_ok: bool = False) -> int:
    """1-65535; with `zero_ok`, also 0 (= none allocated), which is then the default."""
    if value is None:
        if zero_ok:
            return 0
        s.fail(field, None, "required", "missing_field")
    port = as_int(s, value, field)
    if not (0 if zero_ok else 1) <= port <= 65535:
        s.fail(field, value, "must be 0-65535" if zero_ok else "must be 1-65535", "invalid_port")
    return port


_MAPPED = bytes(10) + b"\xff\xff"  # ::ffff:0:0/96, IPv4-mapped
_COMPATIBLE = bytes(12)  # ::/96, "IPv4-compatible" (deprecated)


@lru_cache(maxsize=65536)
def canonical_ip(text: str) -> tuple[int, str] | None:
    """(version, canonical text), or None if `text` is not a plain IP address.

    IPv6 zones are refused (Go's parser refuses them too), and an IPv4-mapped IPv6 address is
    the IPv4 address, as Go sees it. The C library's inet_pton parses (300k endpoint addresses
    in a 30k-service list: `ipaddress` took 3 s of it) and takes exactly what `ipaddress` and
    Go's netip take: four decimal octets without leading zeros, RFC 4291's IPv6 forms. An IPv4
    address it takes is already canonical; inet_ntop prints IPv6 in RFC 5952's canonical form,
    as `ipaddress` does, except ::/96, which it prints dotted: those go through `ipaddress`.
    Cached: endpoint addresses recur in every update of their slice.
    """
    try:
        if ":" not in text:
            inet_pton(AF_INET, text)
            return 4, text
        packed = inet_pton(AF_INET6, text)
    except (OSError, ValueError):  # ValueError: an embedded NUL
        return None
    prefix = packed[:12]
    if prefix == _MAPPED:
        return 4, inet_ntop(AF_INET, packed[12:])
    if prefix == _COMPATIBLE:
        return 6, str(ipaddress.IPv6Address(packed))
    return 6, inet_ntop(AF_INET6, packed)


def as_ip(s: Subject, value: Any, field: str, version: int | None = None) -> str:
    """Canonical text of an IP address, of the given version if one is given."""
    if not isinstance(value, str):
        s.fail(field, value, "must be a string", "invalid_type")
    parsed = canonical_ip(value)
    if parsed is None:
        s.fail(field, value, "not an IP address", "invalid_ip")
    if version is not None and parsed[0] != version:
        s.fail(field, value, f"not an IPv{version} address", "invalid_ip")
    return parsed[1]


def as_ips(s: Subject, value: Any, field: str) -> tuple[str, ...]:
    """A list of IP addresses, canonical, each error naming its index."""
    items = as_list(s, value, field)
    return tuple(as_ip(s, item, f"{field}[{i}]") for i, item in enumerate(items))


def as_cidr(s: Subject, value: Any, field: str) -> str:
    """Canonical CIDR; host bits are cleared (as Go's ParseCIDR does), padding is ignored."""
    if not isinstance(value, str):
        s.fail(field, value, "must be a string", "invalid_type")
    text = value.strip()
    address, slash, prefix = text.partition("/")
    # ip_network would also take a bare address or a netmask ("/255.0.0.0"); Go takes neither.
    if slash and prefix.isascii() and prefix.isdigit() and "%" not in address:
        try:
            return str(ipaddress.ip_network(text, strict=False))
        except ValueError:
            pass
    s.fail(field, value, "not a CIDR (like 10.0.0.0/8)", "invalid_cidr")


def as_cidrs(s: Subject, value: Any, field: str) -> tuple[str, ...]:
    """A list of CIDRs, canonical, each error naming its index."""
    items = as_list(s, value, field)
    return tuple(as_cidr(s, item, f"{field}[{i}]") for i, item in enumerate(items))


def object_metadata(
    obj: Any, kind: str, *, namespaced: bool
) -> tuple[Subject, dict[str, Any], str, str]:
    """(subject, metadata, namespace, name), checked first so later errors can name the object.

    The namespace is "" for cluster-scoped kinds and defaults to "default" otherwise.
    """
    s = Subject(kind)
    if not isinstance(obj, dict):
        s.fail("", obj, "must be an object", "invalid_type")
    meta = as_mapping(s, obj.get("metadata"), "metadata")
    name = req_str(s, meta.get("name"), "metadata.name")
    if not namespaced:
        s.name = name
        return s, meta, "", name
    namespace = opt_str(s, meta.get("namespace"), "metadata.namespace") or "default"
    s.name = f"{namespace}/{name}"
    return s, meta, namespace, name


def object_labels(s: Subject, meta: dict[str, Any]) -> dict[str, str]:
    """metadata.labels, every value a string (selectors compare them as strings)."""
    labels = as_mapping(s, meta.get("labels"), "metadata.labels")
    for key, value in labels.items():
        if not isinstance(value, str):
            s.fail(f'metadata.labels["{key}"]', value, "must be a string", "invalid_type")
    return labels


def sorted_pairs(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """Labels as sorted (key, value) pairs: hashable, and equal whatever the input order."""
    return tuple(sorted(labels.items()))
