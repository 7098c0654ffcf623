"""Candidates that misbehave, through a real CPU server and its worker (EXTENSIONS §12.2):
an exception whose message cannot be made fails its candidate only."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from bench_server import call_on_server
from server_process import RunningServer, running_server

from kcoral.bench.results import ComparisonResult, format_comparison

SOURCE = """
from kcoral.builtins import benchmark, compare

class Unprintable(Exception):
    def __str__(self):
        raise TypeError("no message")

def nothing():
    return None

def raises_unprintable():
    raise Unprintable()

calls = [0]

def raises_unprintable_while_timed():
    calls[0] += 1
    if calls[0] > 3:
        raise Unprintable()

def comparison():
    candidates = {"base": nothing, "at once": raises_unprintable,
                  "later": raises_unprintable_while_timed, "fine": nothing}
    return compare(candidates, {"repeat": 10, "warmup": 1, "seed": 1, "flush_l2": False})

def benchmarked():
    return benchmark(raises_unprintable, {"repeat": 3, "warmup": 1})

def one():
    return 1

def two():
    return 2

def broken():
    raise RuntimeError("the kernel ran out of shared memory")

def checked():
    candidates = {"base": one, "off by one": two, "broken": broken}
    return compare(candidates, {"reference": 1, "repeat": 10, "warmup": 1, "flush_l2": False})
def softmax_with_a_nan():
    import torch

    def exact(x):
        return torch.softmax(x, dim=0)

    def unguarded(x):
        out = torch.softmax(x, dim=0)
        out[1] = float("nan")  # e.g. exp overflowed where the reference stayed finite
        return out

    config = {"reference": exact, "repeat": 10, "warmup": 1, "flush_l2": False}
    return compare({"exact": exact, "unguarded": unguarded}, torch.arange(4.0), config)
async def fetch():
    return 1

def rows():
    yield 1

def async_benchmarked():
    return benchmark(fetch, {"repeat": 3, "warmup": 1})

def generator_compared():
    return compare({"base": nothing, "rows": rows}, {"repeat": 3, "warmup": 1})
def outputs_without_arguments():
    return compare({"base": nothing}, {"outputs": [0], "reference": None})
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("candidates"), ["--num-workers", "1"]) as s:
        yield s


def execute(server: RunningServer, name: str) -> Any:
    return call_on_server(server.url, SOURCE, name, 120)


def test_a_candidate_whose_exception_cannot_be_printed_fails_alone(server) -> None:
    result = execute(server, "comparison")
    assert result.completed, result.error
    entries = result["value"]["candidates"]
    assert entries["at once"]["status"] == "failed" == entries["later"]["status"]
    assert entries["at once"]["error"] == "Unprintable"
    # the fourth call of "later" raised: its number is told (a flaky call, EXTENSIONS §12)
    assert entries["later"]["error"] == (
        "Unprintable (in call 4, the correctness check and warm-up included)"
    )
    assert entries["fine"]["status"] == "ok" and entries["fine"]["sample_count"] == 10


def test_a_benchmark_whose_function_raises_an_unprintable_exception_says_its_type(
    server,
) -> None:
    result = execute(server, "benchmarked")
    assert not result.completed
    assert result.error["kind"] == "runtime"
    assert result.error["message"] == "benchmark: Unprintable"


def test_the_table_says_why_a_candidate_failed_or_did_not_match(server) -> None:
    result = execute(server, "checked")
    assert result.completed, result.error
    comparison = result["value"]
    assert isinstance(comparison, ComparisonResult)
    failed = "broken (failed): RuntimeError: the kernel ran out of shared memory"
    mismatched = "off by one (mismatch): 2 differs from the reference 1"
    text = format_comparison(comparison).splitlines()
    assert failed in text and mismatched in text
    page = comparison._repr_html_()
    assert page is not None and failed in page and mismatched in page


def test_a_nan_where_the_reference_has_a_number_is_counted_not_given_a_size(server) -> None:
    result = execute(server, "softmax_with_a_nan")
    assert result.completed, result.error
    entry = result["value"]["candidates"]["unguarded"]
    assert entry["status"] == "mismatch"
    assert entry["max_abs_error"] is None  # a NaN difference has no size (not 1.8e308)
    assert entry["error"] == (
        "differs from the reference beyond rtol=1e-05, atol=1e-08; "
        "at 1 place the difference is NaN or infinite"
    )
    assert "unguarded  mismatch  " in format_comparison(result["value"])


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "async_benchmarked",
            "benchmark: fetch is an async function: a call only creates a coroutine and runs "
            "none of it; time a function that runs it (e.g. lambda: asyncio.run(fetch()))",
        ),
        (
            "generator_compared",
            "compare: candidate 'rows': rows is a generator function: a call only creates a "
            "generator and runs none of it; time a function that consumes it (e.g. lambda: "
            "list(rows()))",
        ),
    ],
)
def test_a_function_whose_calls_run_nothing_is_refused_not_timed(server, name, message) -> None:
    result = execute(server, name)
    assert not result.completed
    assert result.error["kind"] == "runtime" and result.error["message"] == message


def test_outputs_without_arguments_say_no_arguments_were_given(server) -> None:
    result = execute(server, "outputs_without_arguments")
    assert not result.completed
    assert result.error["message"] == (
        "compare: config 'outputs': 0 is not an argument position (no arguments were given)"
    )
