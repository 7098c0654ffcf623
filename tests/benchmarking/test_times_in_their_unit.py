"""A result's times read in the unit they fill (EXTENSIONS §12.5): a call of 591 ns reads
``591`` under ``median ns``, not ``0.000591`` under ``median ms``, in the table and on the
box plot's axis, whose last tick stays inside the picture."""

from __future__ import annotations

import re

import numpy as np
from kcoral_jupyter.bench_display import PLOT_WIDTH, box_plot_svg

from kcoral.bench.results import format_comparison, table_rows

#: the plot's font is 11 px monospace: a character is at most this wide
CHARACTER_PX = 7.0


def benchmark_of(samples: list[float]) -> dict:
    """A benchmark result of ``samples`` (ms), with the statistics it publishes."""
    p05, p25, p50, p75, p95 = (float(v) for v in np.percentile(samples, [5, 25, 50, 75, 95]))
    return {
        "kind": "kcoral.benchmark",
        "latency_ms_median": p50,
        "latency_ms_p05": p05,
        "latency_ms_p25": p25,
        "latency_ms_p75": p75,
        "latency_ms_p95": p95,
        "latency_ms_iqr": p75 - p25,
        "noise": (p75 - p25) / p50,
        "samples_ms": samples,
    }


def test_calls_of_nanoseconds_and_microseconds_read_in_their_unit_in_the_table() -> None:
    # seen: 'median ms 0.000591  IQR ms 0.001059' for `benchmark(lambda: 1 + 1)`
    result = benchmark_of(list(np.linspace(0.0004, 0.0008, 21)))
    header, row = table_rows(result)
    assert header[2:4] == ["median ns", "IQR ns"], header
    assert row[2] == "600" and row[3] == "200", row
    assert "median ns" in format_comparison(result)
    header, row = table_rows(benchmark_of(list(np.linspace(0.004, 0.008, 21))))
    assert header[2] == "median µs" and row[2] == "6", (header, row)


def test_a_comparison_shares_one_unit_the_largest_median_fills() -> None:
    fast = benchmark_of([0.0005] * 10) | {"status": "ok"}
    slow = benchmark_of([2.5] * 10) | {"status": "ok"}
    result = {
        "kind": "kcoral.comparison",
        "baseline": "slow",
        "candidates": {"slow": slow, "fast": fast},
    }
    header, first, second = table_rows(result)
    assert header[2] == "median ms" and first[2] == "2.5" and second[2] == "0.0005"
    seconds = {"kind": "kcoral.comparison", "candidates": {"long": benchmark_of([2500.0] * 10)}}
    assert table_rows(seconds)[0][2] == "median s" and table_rows(seconds)[1][2] == "2.5"


def test_a_plot_of_microsecond_calls_has_its_axis_in_microseconds_inside_the_picture() -> None:
    # seen: ticks '0.000175 0.00164 0.00311 0.00457 0.0060' with the last one cut at the
    # picture's right edge, under 'ms per call'
    svg = box_plot_svg([("benchmark", benchmark_of(list(np.linspace(0.0003, 0.0058, 50))))])
    assert svg is not None
    assert "µs per call" in svg and "ms per call" not in svg
    ticks = re.findall(r'<text x="([0-9.]+)" y="[0-9.]+" text-anchor="middle"[^>]*>([^<]*)<', svg)
    assert len(ticks) == 5
    for x, text in ticks:
        assert not text.startswith("0.00"), ticks
        assert float(x) + len(text) * CHARACTER_PX / 2 <= PLOT_WIDTH, ticks


def test_samples_beyond_the_axis_read_each_in_its_own_unit() -> None:
    # seen: '3 samples beyond the axis, at its edges: 0.0206 to 4.07 ms' under an axis in µs
    samples = [*np.linspace(0.0203, 0.0205, 60), 0.0206 * 0.9, 4.07]
    svg = box_plot_svg([("spin", benchmark_of(samples))])
    assert svg is not None
    (note,) = re.findall(r">([^<]*beyond the axis[^<]*)<", svg)
    assert note == "2 samples beyond the axis, at its edges: 18.5 µs to 4.07 ms", note
