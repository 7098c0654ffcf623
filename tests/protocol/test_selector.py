"""Node selectors (EXTENSIONS §14): one parser, shared by client and server."""

from __future__ import annotations

import pytest

from kcoral.protocol.selector import (
    SelectorError,
    as_selector,
    format_selector,
    offers,
    parse_selector,
    selector_matches,
)


def test_a_selector_reads_as_a_map_and_prints_in_one_canonical_order():
    selector = parse_selector("gpus=2, gpu=h100,zone=eu-1")
    assert selector == {"gpus": "2", "gpu": "h100", "zone": "eu-1"}
    assert format_selector(selector) == "gpu=h100,gpus=2,zone=eu-1"


def test_a_caller_may_give_a_map_with_integers_or_the_text_form_or_nothing():
    assert as_selector({"gpu": "a100", "gpus": 4}) == {"gpu": "a100", "gpus": "4"}
    assert as_selector("gpu=a100") == {"gpu": "a100"}
    assert as_selector(None) == {} and as_selector("  ") == {}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("gpu", "must be key=value"),
        ("gpu=h100,gpu=a100", "twice"),
        ("GPU=h100", "lowercase"),
        ("gpu=", "1-64 characters"),
        ("gpu=h100;rm", "1-64 characters"),
        ("gpus=two", "whole number"),
        ("x=" + "a" * 600, "at most 512"),
    ],
)
def test_a_malformed_selector_is_refused_with_what_is_wrong(text, says):
    with pytest.raises(SelectorError, match=says):
        parse_selector(text)


def test_a_map_with_a_value_that_is_neither_text_nor_a_number_is_refused():
    with pytest.raises(SelectorError, match="string or an integer"):
        as_selector({"gpus": True})


def test_gpus_means_at_least_and_every_other_key_means_equal():
    node = {"gpu": "h100", "arch": "sm_90", "gpus": "4", "node": "n1", "zone": "eu"}
    assert selector_matches({"gpus": "2"}, node)
    assert selector_matches({"gpus": "4", "gpu": "h100", "zone": "eu"}, node)
    assert not selector_matches({"gpus": "8"}, node)
    assert not selector_matches({"gpu": "a100"}, node)
    assert not selector_matches({"rack": "r1"}, node)  # a label the node does not have
    assert selector_matches({}, node)


def test_a_node_offers_its_labels_and_only_the_built_in_keys_it_knows():
    known = offers({"zone": "eu"}, gpu="h100", arch="sm_90", gpus=8, node="n1")
    assert known == {"zone": "eu", "gpu": "h100", "arch": "sm_90", "gpus": "8", "node": "n1"}
    # A published supervisor's node reports no kind; a direct server may have no node id.
    assert offers({}, gpu="", arch="", gpus=0, node="") == {"gpus": "0"}
