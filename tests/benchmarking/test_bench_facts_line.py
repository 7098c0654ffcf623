"""The line under a result's table (EXTENSIONS §12.5) says how many calls a benchmark's
statistics cover, in the text table and the notebook view alike."""

from __future__ import annotations

from kcoral.bench.results import as_bench_result, format_comparison


def test_a_benchmarks_line_says_its_calls_not_only_its_rounds() -> None:
    # a benchmark of 1000 calls read "10 rounds", which reads as ten samples
    result = as_bench_result(
        {
            "kind": "kcoral.benchmark",
            "clock": "cpu",
            "rounds": 10,
            "sample_count": 1000,
            "stopped_by": "repeat",
            "samples_ms": [1.0] * 1000,
        }
    )
    line = "clock cpu, 1000 calls in 10 rounds, stopped by repeat"
    assert line in format_comparison(result).splitlines()
    assert f">{line}</div>" in result._repr_html_()


def test_a_comparisons_line_keeps_its_rounds_and_says_what_stopped_it_in_html_too() -> None:
    result = as_bench_result(
        {
            "kind": "kcoral.comparison",
            "clock": "cpu",
            "seed": 3,
            "rounds": 100,
            "stopped_by": "repeat",
            "candidates": {"a": {"status": "ok"}},
        }
    )
    line = "clock cpu, seed 3, 100 rounds, stopped by repeat"
    assert line in format_comparison(result).splitlines()
    assert f">{line}</div>" in result._repr_html_()
