"""A budget that asks for more calls than one measurement makes (100000) is capped, and the
result says so (EXTENSIONS §12.1): ``repeat_ms: 1e12`` took its 100000 calls, minutes of
them with the cache flushed, and said nothing of the count it was not given."""

from __future__ import annotations

import re

from kcoral.bench.config import MAX_CALLS
from kcoral.builtins import benchmark, compare

#: no flush: 100000 calls of an empty function take a fraction of a second
UNFLUSHED = {"flush_l2": False}


def nothing() -> None:
    return None


def test_a_repeat_budget_past_the_cap_warns_that_its_count_was_capped() -> None:
    result = benchmark(nothing, {"repeat_ms": 1e12, "warmup": 1, **UNFLUSHED})
    assert result["repeat"] == MAX_CALLS
    capped = [w for w in result["warnings"] if w.startswith("repeat_ms")]
    assert len(capped) == 1 and re.fullmatch(
        r"repeat_ms 1e\+12 asks for over 100000 calls of \S+ [nµm]?s; "
        r"capped at 100000 \(max_calls\)",
        capped[0],
    ), result["warnings"]


def test_the_capped_budgets_warning_gives_the_call_in_its_unit() -> None:
    # an empty call's estimate read '0.00111 ms'
    from kcoral.bench.config import budget_cap_warning

    capped = budget_cap_warning("repeat_ms", 1e12, 0.00111)
    assert (
        capped
        == "repeat_ms 1e+12 asks for over 100000 calls of 1.11 µs; capped at 100000 (max_calls)"
    )


def test_a_warm_up_budget_past_the_cap_warns_too() -> None:
    result = benchmark(nothing, {"warmup_ms": 1e12, "repeat": 10, **UNFLUSHED})
    assert result["warmup"] == MAX_CALLS
    assert any(w.startswith("warmup_ms 1e+12 asks for over 100000") for w in result["warnings"])


def test_a_budget_the_cap_leaves_alone_adds_no_warning() -> None:
    result = benchmark(nothing, {"repeat_ms": 5, "warmup_ms": 1, **UNFLUSHED})
    assert result["repeat"] < MAX_CALLS
    assert not any("capped" in w for w in result["warnings"]), result["warnings"]


def test_a_comparison_whose_budget_passes_the_cap_says_which_candidates_and_the_total() -> None:
    result = compare({"a": nothing, "b": nothing}, {"repeat_ms": 1e12, "warmup": 1, **UNFLUSHED})
    calls = sum(entry["sample_count"] for entry in result["candidates"].values())
    assert calls <= MAX_CALLS
    assert (
        "repeat_ms 1e+12 asks for over 100000 calls of 'a', 'b'; capped at 100000 calls in all "
        "(max_calls)"
    ) in result["warnings"], result["warnings"]
    warm = compare({"a": nothing}, {"warmup_ms": 1e12, "repeat": 10, **UNFLUSHED})
    assert any(w.startswith("'a': warmup_ms 1e+12 asks") for w in warm["warnings"])
