"""Benchmark and comparison results on the client (EXTENSIONS §12.5), through a real CPU
server and the real client: they arrive as ``dict`` subclasses that render a box plot above
a table, print as text with ``format_comparison``, and render a rogue server's names inert."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from bench_server import call_on_server
from server_process import RunningServer, running_server

from kcoral.bench.results import (
    BenchmarkResult,
    ComparisonResult,
    as_bench_result,
    format_comparison,
    ratio_text,
)

COMPARE_SOURCE = """
import time
from kcoral.builtins import benchmark, compare

def slow():
    time.sleep(0.002)

def fast():
    time.sleep(0.001)

def run_compare():
    return compare({"slow": slow, "fast": fast}, {"repeat": 20, "seed": 7})

def run_benchmark():
    return benchmark(fast, {"repeat": 10, "warmup": 1, "label": "one-ms"})

def run_variants():
    variants = {f"triton_matmul_BLOCK_M=128_BLOCK_N=64_BLOCK_K=32_stages={n}": fast for n in (3, 4)}
    return compare(variants, {"repeat": 10, "warmup": 1, "seed": 1})

def run_drifting():
    calls = [0]

    def drifts():  # free for the first 10000 timed calls, then 0.2 ms each
        calls[0] += 1
        if calls[0] > 10001:
            end = time.perf_counter() + 0.0002
            while time.perf_counter() < end:
                pass

    config = {"warmup": 1, "repeat": 20000, "max_samples": 100000, "flush_l2": False}
    return benchmark(drifts, config)
"""

EVIL = '<img src=x onerror="alert(1)">'
SCRIPT = "<script>alert(2)</script>"
# What a rogue server (or uploaded code pretending) may send back as a "comparison".
ROGUE_SOURCE = f"""
def rogue():
    stats = {{"status": "ok", "latency_ms_median": 1.0, "latency_ms_p05": 0.5,
              "latency_ms_p25": 0.8, "latency_ms_p75": 1.2, "latency_ms_p95": 1.5,
              "latency_ms_iqr": 0.4, "noise": 0.4, "samples_ms": [0.9, 1.0, 1.1]}}
    return {{
        "kind": "kcoral.comparison",
        "baseline": {EVIL!r},
        "candidates": {{
            {EVIL!r}: stats,
            {SCRIPT!r}: dict(stats, status={SCRIPT!r},
                             speedup={{"value": 1.0, "ci95_low": 0.9, "ci95_high": 1.1,
                                       "verdict": {SCRIPT!r}}}),
            "junk": {{"latency_ms_median": "not a number", "samples_ms": "nope"}},
            "also_junk": 7,
        }},
        "clock": {SCRIPT!r},
        "warnings": [{EVIL!r}, 3],
    }}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("bench-display"), ["--num-workers", "1"]) as s:
        yield s


def returned(server: RunningServer, source: str, name: str) -> object:
    result = call_on_server(server.url, source, name, 120)
    assert result.completed, result.error
    return result["value"]


def plot_svg(page: str) -> str:
    found = re.search(r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', page)
    assert found, "no inline SVG plot"
    return base64.b64decode(found.group(1)).decode("utf-8")


def test_a_comparison_from_the_server_arrives_as_a_comparison_result_that_renders(server) -> None:
    value = returned(server, COMPARE_SOURCE, "run_compare")
    assert isinstance(value, ComparisonResult) and isinstance(value, dict)
    assert value["kind"] == "kcoral.comparison" and value["seed"] == 7
    page = value._repr_html_()
    assert page is not None and "kcoral-bench-table" in page
    svg = plot_svg(page)
    assert svg.startswith("<svg") and svg.count("<rect") >= 3  # background and one box each
    assert ">slow<" in svg and ">fast<" in svg
    text = format_comparison(value)
    assert "baseline" in text and "fast" in text and "seed 7" in text
    assert text.splitlines()[0].split()[:3] == ["candidate", "status", "median"]


def test_a_benchmark_from_the_server_arrives_as_a_benchmark_result(server) -> None:
    value = returned(server, COMPARE_SOURCE, "run_benchmark")
    assert isinstance(value, BenchmarkResult)
    assert value["label"] == "one-ms" and len(value["samples_ms"]) == 10
    assert "one-ms" in format_comparison(value)
    assert "data:image/svg+xml;base64," in value._repr_html_()


def test_long_candidate_names_that_differ_at_the_end_stay_apart_in_table_and_plot(
    server,
) -> None:
    value = returned(server, COMPARE_SOURCE, "run_variants")
    assert isinstance(value, ComparisonResult)
    rows = format_comparison(value).splitlines()[2:4]
    assert rows[0].split()[0].endswith("stages=3") and rows[1].split()[0].endswith("stages=4")
    labels = re.findall(r'text-anchor="end">([^<]*)</text>', plot_svg(value._repr_html_()))
    assert len(labels) == 2 and labels[0] != labels[1]  # were both 'triton_matmul_BLOCK_M…'


def test_the_plot_dots_sample_the_whole_run_not_its_first_calls(server) -> None:
    value = returned(server, COMPARE_SOURCE, "run_drifting")
    assert isinstance(value, BenchmarkResult) and len(value["samples_ms"]) == 20000
    dots = [float(x) for x in re.findall(r'<circle cx="([0-9.]+)"', plot_svg(value._repr_html_()))]
    # half the dots from the free calls, half from the 0.2 ms ones: far apart on the axis
    assert len(dots) == 200 and max(dots) - min(dots) > 200


def test_a_rogue_servers_candidate_names_render_inert(server) -> None:
    value = returned(server, ROGUE_SOURCE, "rogue")
    assert isinstance(value, ComparisonResult)
    page = value._repr_html_()
    assert "<img src=x" not in page and "<script" not in page
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in page
    svg = plot_svg(page)
    assert "<img" not in svg and "<script" not in svg  # names are text in the SVG too
    # the only <img> is our own plot, whose SVG a browser never runs or lets load anything
    assert page.count("<img") == 1
    text = format_comparison(value)  # junk entries print as dashes, never raise
    assert "junk" in text and "-" in text


def test_a_plain_dict_that_is_no_benchmark_stays_a_plain_dict(server) -> None:
    source = "def f():\n    return {'kind': 'kcoral.comparison', 'candidates': 3}\n"
    value = returned(server, source, "f")
    assert type(value) is dict


def test_format_comparison_shows_the_history_change_and_flags_a_regression() -> None:
    result = as_bench_result(
        {
            "kind": "kcoral.comparison",
            "baseline": "a",
            "candidates": {"a": {"status": "ok", "latency_ms_median": 2.0}},
            "history": {
                "file": str(Path("/tmp/kcoral-benchmarks.jsonl")),
                "changes": {
                    "a": {"value": 1.5, "ci95_low": 1.3, "ci95_high": 1.7, "regression": True}
                },
            },
        }
    )
    text = format_comparison(result)
    assert "vs previous" in text and "1.5× [1.3, 1.7]" in text and "REGRESSION" in text
    assert "history: /tmp/kcoral-benchmarks.jsonl" in text
    assert "REGRESSION" in result._repr_html_()


def test_a_significant_speedup_close_to_one_never_reads_as_one() -> None:
    speedup = {"value": 1.0012, "ci95_low": 1.0004, "ci95_high": 1.0021, "verdict": "faster"}
    result = as_bench_result(
        {
            "kind": "kcoral.comparison",
            "baseline": "a",
            "candidates": {
                "a": {"status": "ok", "latency_ms_median": 2.0024},
                "b": {"status": "ok", "latency_ms_median": 2.0, "speedup": speedup},
            },
        }
    )
    text = format_comparison(result)
    assert "1.001× [1.0004, 1.002]  faster" in text  # was "1× [1, 1]  faster"
    assert "1.001× [1.0004, 1.002]" in result._repr_html_()


def test_a_narrow_interval_shows_the_digits_its_width_needs() -> None:
    # seen on a CPU comparison of 20 and 18 µs spins: '1.11× [1.11, 1.11]  faster'
    speedup = {"value": 1.1093, "ci95_low": 1.1071, "ci95_high": 1.1118, "verdict": "faster"}
    assert ratio_text(speedup) == "1.109× [1.107, 1.112]"
    assert ratio_text(speedup | {"ci95_low": 1.05, "ci95_high": 1.2}) == "1.11× [1.05, 1.2]"
    assert ratio_text(speedup | {"ci95_low": 1.1093, "ci95_high": 1.1093}) == "1.11× [1.11, 1.11]"


def test_a_mismatch_row_shows_its_largest_error_and_a_failed_one_its_status() -> None:
    result = as_bench_result(
        {
            "kind": "kcoral.comparison",
            "baseline": "a",
            "candidates": {
                "a": {"status": "ok", "latency_ms_median": 1.0},
                "b": {"status": "mismatch", "max_abs_error": 0.5},
                "c": {"status": "failed", "error": "ValueError: boom"},
            },
        }
    )
    text = format_comparison(result)
    assert "mismatch (max error 0.5)" in text and "failed" in text
    assert "color:#cf222e" in result._repr_html_()


def test_in_ipython_the_plain_text_of_a_result_is_its_table_not_every_sample() -> None:
    from IPython.lib.pretty import pretty

    result = as_bench_result(
        {"kind": "kcoral.benchmark", "latency_ms_median": 1.0, "samples_ms": [1.0] * 1000}
    )
    assert pretty(result) == format_comparison(result)
    assert repr(result) == repr(dict(result))  # the JSON stays the source of truth
