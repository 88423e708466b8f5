"""The BGP annotations of a Service: parsed, canonical, and a bad value names its field."""

from __future__ import annotations

from typing import Any

import pytest

from lace_proxy.model import ValidationError, parse_service
from lace_proxy.model.service import (
    BGP_ADVERTISE_ANNOTATION,
    BGP_COMMUNITIES_ANNOTATION,
    BgpAnnotations,
    community,
)

from ..helpers import annotated_service


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({}, None),
        ({BGP_ADVERTISE_ANNOTATION: ""}, None),
        ({BGP_ADVERTISE_ANNOTATION: "true"}, BgpAnnotations(True)),
        ({BGP_ADVERTISE_ANNOTATION: "False"}, BgpAnnotations(False)),
        (
            {BGP_COMMUNITIES_ANNOTATION: " 65000:100, no-export,65000:0100,4200000000:1:2 "},
            BgpAnnotations(None, ("4200000000:1:2", "65000:100", "65535:65281")),
        ),
        (
            {BGP_ADVERTISE_ANNOTATION: "true", BGP_COMMUNITIES_ANNOTATION: "1:2"},
            BgpAnnotations(True, ("1:2",)),
        ),
    ],
)
def test_bgp_annotations(annotations: dict[str, Any], expected: BgpAnnotations | None) -> None:
    assert parse_service(annotated_service(annotations)).bgp == expected


@pytest.mark.parametrize(
    ("key", "value", "code", "says"),
    [
        (BGP_ADVERTISE_ANNOTATION, "yes", "invalid_bgp_advertise", 'must be "true" or "false"'),
        (BGP_COMMUNITIES_ANNOTATION, "65000", "invalid_bgp_community", "is not a community"),
        (BGP_COMMUNITIES_ANNOTATION, "1:2,65536:1", "invalid_bgp_community", "at most 65535"),
        (BGP_COMMUNITIES_ANNOTATION, "1:2:4294967296", "invalid_bgp_community", "4294967295"),
        (BGP_COMMUNITIES_ANNOTATION, "1:-2", "invalid_bgp_community", "is not a community"),
        (BGP_COMMUNITIES_ANNOTATION, "1:²", "invalid_bgp_community", "is not a community"),
    ],
)
def test_a_bad_bgp_annotation_rejects_the_service_naming_it(
    key: str, value: str, code: str, says: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_service(annotated_service({key: value}))
    assert caught.value.code == code
    assert f'metadata.annotations["{key}"]' in str(caught.value)
    assert says in str(caught.value)


def test_community_forms() -> None:
    assert community("0:0") == "0:0"
    assert community("blackhole") == "65535:666"
    assert community("65535:65535") == "65535:65535"
    with pytest.raises(ValueError, match="no-export"):
        community("no_export")
