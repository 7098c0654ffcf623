"""Request-id rules of PROTOCOL.md §8."""

from __future__ import annotations

import uuid

import pytest

from kcoral.protocol.headers import accept_request_id, is_canonical_uuid, node_preference

CANONICAL = "d876de51-5ed4-4ab4-9c77-37a1a9f146d8"


@pytest.mark.parametrize(
    "value",
    [CANONICAL, "00000000-0000-0000-0000-000000000000", str(uuid.uuid1()), str(uuid.uuid4())],
)
def test_a_canonical_uuid_of_any_version_is_accepted(value: str) -> None:
    assert is_canonical_uuid(value)
    assert accept_request_id([value]) == value


@pytest.mark.parametrize(
    "value",
    [
        CANONICAL.upper(),
        CANONICAL.replace("-", ""),
        "{" + CANONICAL + "}",
        "urn:uuid:" + CANONICAL,
        " " + CANONICAL,
        CANONICAL + "\n",
        "",
        "not-a-uuid",
        None,
        5,
    ],
)
def test_a_non_canonical_request_id_is_replaced_by_a_fresh_uuid4(value: object) -> None:
    assert not is_canonical_uuid(value)
    fresh = accept_request_id([value])  # type: ignore[list-item]
    assert fresh != value and uuid.UUID(fresh).version == 4 and is_canonical_uuid(fresh)


def test_a_request_id_is_accepted_only_when_sent_exactly_once() -> None:
    assert accept_request_id([]) != CANONICAL
    assert uuid.UUID(accept_request_id([])).version == 4
    assert accept_request_id([CANONICAL, CANONICAL]) != CANONICAL


def test_every_generated_id_is_new() -> None:
    assert accept_request_id([]) != accept_request_id([])


def test_a_node_value_is_echoed_only_when_1_to_512_characters_long() -> None:
    assert node_preference("node-a") == "node-a"
    assert node_preference("x" * 512) == "x" * 512
    assert node_preference("x" * 513) is None
    assert node_preference("") is None
    assert node_preference(None) is None
