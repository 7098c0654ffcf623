"""The X-KCoral-Serialization admission rule and its environment variable."""

from __future__ import annotations

import pytest
from kcoral_server.execution.serialization import allowed_serialization, check_serialization

from kcoral.protocol.errors import ValidationError


def test_no_header_admits_the_request_without_a_format() -> None:
    assert check_serialization([], ["json"]) is None


def test_an_allowed_format_is_admitted() -> None:
    assert check_serialization(["pickle"], ["json", "pickle"]) == "pickle"
    assert check_serialization([" json "], ["json"]) == "json"


def test_a_disallowed_format_gets_the_exact_message() -> None:
    with pytest.raises(ValidationError) as info:
        check_serialization(["pickle"], ["json"])
    assert str(info.value) == "Serialization format 'pickle' not allowed. Allowed formats: ['json']"


def test_the_allowed_list_is_shown_in_configured_order() -> None:
    with pytest.raises(ValidationError, match=r"Allowed formats: \[\]"):
        check_serialization(["json"], [])
    with pytest.raises(ValidationError, match=r"Allowed formats: \['pickle'\]"):
        check_serialization(["json"], ["pickle"])


@pytest.mark.parametrize("values", [["yaml"], ["JSON"], [""], ["json, pickle"], ["json", "json"]])
def test_unknown_or_repeated_formats_are_rejected(values) -> None:
    with pytest.raises(ValidationError):
        check_serialization(values, ["json", "pickle"])


def test_the_environment_default_allows_both_formats() -> None:
    assert allowed_serialization({}) == ["json", "pickle"]


def test_the_environment_list_keeps_order_and_drops_blanks_and_repeats() -> None:
    env = {"KCORAL_ALLOWED_SERIALIZATION": " pickle, ,json,pickle"}
    assert allowed_serialization(env) == ["pickle", "json"]
    assert allowed_serialization({"KCORAL_ALLOWED_SERIALIZATION": " "}) == ["json", "pickle"]


def test_an_unknown_name_in_the_environment_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match="yaml"):
        allowed_serialization({"KCORAL_ALLOWED_SERIALIZATION": "json,yaml"})
