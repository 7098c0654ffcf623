"""Budgets at their edges, through a real CPU server and its worker (SERVER §15, EXTENSIONS
§12.2): a ``repeat_ms`` of 0 asks for the fewest rounds, a huge budget is capped at the
call cap instead of failing. Counts only, never timings."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from bench_server import call_on_server
from server_process import RunningServer, running_server

SOURCE = """
from kcoral.builtins import benchmark, compare

def nothing():
    return None

def zero_budget_comparison():
    return compare({"a": nothing, "b": nothing},
                   {"repeat_ms": 0, "warmup": 1, "seed": 1, "flush_l2": False})

def huge_budget_benchmark():
    return benchmark(nothing, {"repeat_ms": 1e308, "warmup": 1, "flush_l2": False})

def huge_warmup_budget():
    return benchmark(nothing, {"warmup_ms": 1e308, "repeat": 3, "flush_l2": False})

def huge_budget_comparison():
    return compare({"a": nothing, "b": nothing},
                   {"repeat_ms": 1e308, "warmup": 1, "seed": 1, "flush_l2": False})
def max_ms_alone():
    return benchmark(nothing, {"repeat_ms": 60_000, "max_ms": 50, "flush_l2": False})

def max_ms_alone_in_a_comparison():
    return compare({"a": nothing, "b": nothing}, {"repeat": 10, "max_ms": 50})
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("budgets"), ["--num-workers", "1"]) as s:
        yield s


def returned(server: RunningServer, name: str) -> Any:
    result = call_on_server(server.url, SOURCE, name, 300)
    assert result.completed, result.error
    return result["value"]


def test_a_comparison_with_a_zero_budget_runs_the_fewest_rounds(server) -> None:
    result = returned(server, "zero_budget_comparison")
    # ⌊0 / the estimates⌋ is 0, so the floor of 10 rounds; the old code ran 1000
    assert result["rounds"] == 10 and result["stopped_by"] == "repeat"
    assert [e["sample_count"] for e in result["candidates"].values()] == [10, 10]


def test_a_huge_budget_is_capped_at_the_call_cap_instead_of_failing(server) -> None:
    result = returned(server, "huge_budget_benchmark")
    assert result["repeat"] == 100_000 and result["stopped_by"] == "repeat"


def test_a_huge_warmup_budget_is_capped_at_the_call_cap_instead_of_failing(server) -> None:
    result = returned(server, "huge_warmup_budget")
    assert result["warmup"] == 100_000 and result["repeat"] == 3


def test_a_comparison_with_a_huge_budget_makes_at_most_the_call_cap(server) -> None:
    result = returned(server, "huge_budget_comparison")
    counts = [e["sample_count"] for e in result["candidates"].values()]
    assert sum(counts) <= 100_000 and min(counts) >= 10


@pytest.mark.parametrize(
    ("name", "start"),
    [("max_ms_alone", "benchmark config"), ("max_ms_alone_in_a_comparison", "compare: config")],
)
def test_max_ms_without_the_adaptive_mode_is_refused_not_ignored(server, name, start) -> None:
    result = call_on_server(server.url, SOURCE, name, 300)
    assert not result.completed
    assert result.error["kind"] == "runtime"
    assert result.error["message"] == (
        f"{start} 'max_ms' is the adaptive mode's budget and needs 'target_precision'; "
        "a fixed run's budget is 'repeat_ms'"
    )
