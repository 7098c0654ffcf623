"""A budget spent mostly on cache flushes says so (SERVER §15, EXTENSIONS §12.1): on a CPU
worker each call's flush zeroes twice the largest cache (64 MiB behind a 32 MiB L3), so an
empty call's ``repeat_ms`` 5 buys a few flushed calls. Through a real CPU server and its
worker, as the user's program runs; counts and the warning's words, never timings."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from bench_server import value_returned
from server_process import RunningServer, running_server

from kcoral.bench.compare import MIN_ROUNDS
from kcoral.bench.flush_cost import FEW_CALLS, spent_on_flushes

SOURCE = """
from kcoral.builtins import benchmark, compare

def nothing():
    return None

def small_budget():
    return benchmark(nothing, {"repeat_ms": 5})

def small_budget_without_flushes():
    return benchmark(nothing, {"repeat_ms": 5, "flush_l2": False})

def explicit_repeat():
    return benchmark(nothing, {"repeat": 3})

def small_budget_comparison():
    return compare({"a": nothing, "b": nothing}, {"repeat_ms": 5, "seed": 1})
"""

WARNING = re.compile(
    r"repeat_ms 5 gave (\d+) measured calls?: the cache flush before each call \(flush_l2\) "
    r"took .+ of the .+ estimated for a call and its flush; for more calls give repeat_ms "
    r"\d+ or more \(10 calls\), an explicit repeat, or flush_l2=False"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("flushes"), ["--num-workers", "1"]) as s:
        yield s


def returned(server: RunningServer, name: str) -> Any:
    return value_returned(server.url, SOURCE, name)


def flush_warnings(result: dict[str, Any]) -> list[str]:
    return [text for text in result["warnings"] if "flush_l2" in text]


def test_a_budget_spent_on_flushes_says_how_many_calls_it_gave_and_what_to_do(server) -> None:
    result = returned(server, "small_budget")
    (warning,) = flush_warnings(result)
    match = WARNING.fullmatch(warning)
    assert match, warning
    assert int(match.group(1)) == result["repeat"] == result["sample_count"] < FEW_CALLS


def test_a_benchmark_without_flushes_has_no_such_warning(server) -> None:
    assert flush_warnings(returned(server, "small_budget_without_flushes")) == []


def test_an_explicit_repeat_is_the_users_count_and_has_no_such_warning(server) -> None:
    result = returned(server, "explicit_repeat")
    assert result["repeat"] == 3 and flush_warnings(result) == []


def test_a_comparison_of_the_same_budget_runs_its_fewest_rounds_and_needs_no_warning(
    server,
) -> None:
    # compare's budget covers a round of every candidate, flushes included, and never goes
    # under its 10 rounds: each candidate gets the calls the benchmark's warning asks for
    result = returned(server, "small_budget_comparison")
    assert MIN_ROUNDS >= FEW_CALLS
    assert result["rounds"] == MIN_ROUNDS and flush_warnings(result) == []
    assert [e["sample_count"] for e in result["candidates"].values()] == [MIN_ROUNDS] * 2


@pytest.mark.parametrize(
    ("calls", "estimate_ms", "flush_ms", "warns"),
    [
        (9, 2.0, 1.01, True),
        (10, 2.0, 1.9, False),  # enough calls, however much was flushing
        (9, 2.0, 1.0, False),  # the call itself took half: a larger budget is the answer
        (1, 2.0, None, False),  # flush_l2=False
        (1, None, None, False),  # no estimate: both counts given
    ],
)
def test_the_flush_rule_in_numbers(calls, estimate_ms, flush_ms, warns) -> None:
    assert spent_on_flushes(calls, estimate_ms, flush_ms) is warns


def test_an_estimate_without_flushes_reads_the_clock_only_around_its_calls(monkeypatch) -> None:
    # a clock read per flush would lengthen a tiny call's estimate, and shrink its counts,
    # where there is no flush to time
    from kcoral.bench import clocks

    reads = []
    real = clocks.time.perf_counter_ns
    monkeypatch.setattr(clocks.time, "perf_counter_ns", lambda: reads.append(1) or real())
    clock = clocks.CpuClock(flush_l2=False)
    clock.estimate(lambda: None)
    assert len(reads) == 2 and clock.flush_ms() is None
