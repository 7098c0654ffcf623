"""A timed call that fails after earlier calls returned says which call it was (EXTENSIONS
§12): ``benchmark: ValueError: flaky`` read the same for a function that always fails and
for one that failed once in a thousand calls, or after state its calls built up. The first
call's failure reads as before."""

from __future__ import annotations

import pytest

from kcoral.builtins import benchmark, compare
from kcoral.protocol.errors import ExecutionError


def fails_on_call(number: int):
    made = {"calls": 0}

    def call(*_args) -> int:
        made["calls"] += 1
        if made["calls"] == number:
            raise ValueError("flaky")
        return 1

    return call


def test_a_benchmark_whose_seventh_call_fails_names_that_call() -> None:
    with pytest.raises(ExecutionError) as info:
        benchmark(fails_on_call(7), {"warmup": 2, "repeat": 20})
    assert info.value.message == "benchmark: ValueError: flaky (in call 7, warm-up included)"


def test_a_benchmark_whose_first_call_fails_reads_as_before() -> None:
    with pytest.raises(ExecutionError) as info:
        benchmark(fails_on_call(1), {"warmup": 2, "repeat": 20})
    assert info.value.message == "benchmark: ValueError: flaky"


def test_a_compared_candidate_that_fails_later_is_failed_with_its_call_number() -> None:
    result = compare({"steady": lambda: 1, "flaky": fails_on_call(9)}, {"repeat": 20})
    flaky = result["candidates"]["flaky"]
    assert flaky["status"] == "failed"
    assert flaky["error"] == (
        "ValueError: flaky (in call 9, the correctness check and warm-up included)"
    )
