"""A benchmark the program's deadline would cut, through a real CPU server and its worker
(EXTENSIONS §12.1): the front-end tells the worker the seconds left, so the measurement stops
sampling before the deadline and returns the samples it took, marked cut short. It used to
run on into the 504, which carries no result: every sample was lost. Counts only, never
timings."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from bench_server import call_on_server
from server_process import RunningServer, running_server

from kcoral.bench.results import format_comparison
from kcoral.errors import KCoralError

SOURCE = """
import time
from kcoral.builtins import benchmark, compare

def slow():
    time.sleep(0.1)

def long_benchmark():
    return benchmark(slow, {"repeat": 200, "warmup": 1, "flush_l2": False})

def long_warm_up():
    return benchmark(slow, {"repeat": 5, "warmup": 200, "flush_l2": False})

def long_comparison():
    return compare({"a": slow, "b": slow},
                   {"repeat": 100, "warmup": 1, "seed": 1, "flush_l2": False})

def long_adaptive_benchmark():
    return benchmark(slow, {"target_precision": 1e-9, "max_ms": 60_000, "repeat": 20,
                            "warmup": 1, "flush_l2": False})

def short_benchmark():
    return benchmark(slow, {"repeat": 3, "warmup": 1, "flush_l2": False})

def one_call_past_the_deadline():
    return benchmark(lambda: time.sleep(60), {"repeat": 3, "warmup": 1, "flush_l2": False})
"""

#: The program's deadline in these tests, in seconds; the calls asked for take 20 s.
DEADLINE = 4
SAID = re.compile(
    r"stopped after (\d+) of (\d+) calls: the program's deadline of [\d.]+ s was near"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("deadline"), ["--num-workers", "1"]) as s:
        yield s


def returned(server: RunningServer, name: str, timeout: float = DEADLINE) -> Any:
    result = call_on_server(server.url, SOURCE, name, timeout)
    assert result.completed, result.error
    return result["value"]


def said(result: dict[str, Any]) -> tuple[int, int]:
    found = [m for w in result["warnings"] if (m := SAID.fullmatch(w))]
    assert len(found) == 1, result["warnings"]
    return int(found[0][1]), int(found[0][2])


def test_a_benchmark_near_its_deadline_returns_the_samples_it_took(server) -> None:
    result = returned(server, "long_benchmark")
    assert (result["cut_short"], result["stopped_by"]) == ("deadline", "deadline")
    assert result["calls_asked"] == 200
    assert 1 <= result["sample_count"] == result["repeat"] < 200
    assert said(result) == (result["repeat"], 200)
    assert "stopped by deadline" in format_comparison(result)


def test_a_warm_up_near_the_deadline_leaves_time_for_a_timed_call(server) -> None:
    result = returned(server, "long_warm_up")
    assert result["cut_short"] == "deadline"
    assert 1 <= result["warmup"] < 200 and result["sample_count"] >= 1


def test_a_comparison_near_its_deadline_keeps_a_sample_of_every_candidate(server) -> None:
    result = returned(server, "long_comparison")
    assert (result["cut_short"], result["calls_asked"]) == ("deadline", 200)
    counts = [entry["sample_count"] for entry in result["candidates"].values()]
    assert all(count >= 1 for count in counts) and sum(counts) < 200
    assert said(result) == (sum(counts), 200)


def test_an_adaptive_benchmark_near_its_deadline_says_the_calls_it_took(server) -> None:
    result = returned(server, "long_adaptive_benchmark")
    assert (result["cut_short"], result["calls_asked"]) == ("deadline", None)
    calls = result["sample_count"]
    assert f"stopped after {calls} calls: the program's deadline of" in " ".join(result["warnings"])


def test_a_benchmark_that_finishes_in_time_is_not_cut(server) -> None:
    result = returned(server, "short_benchmark", timeout=300)
    assert (result["cut_short"], result["stopped_by"]) == (None, "repeat")
    assert (result["calls_asked"], result["sample_count"]) == (3, 3)
    assert not any(SAID.fullmatch(w) for w in result["warnings"])


def test_a_single_call_longer_than_the_deadline_still_times_out(server) -> None:
    with pytest.raises(KCoralError) as caught:
        call_on_server(server.url, SOURCE, "one_call_past_the_deadline", 2)
    assert (caught.value.status_code, caught.value.kind) == (504, "timeout")
