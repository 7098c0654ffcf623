"""The line under a result's box plot that counts the samples beyond its axis (EXTENSIONS
§12.5) is read on a row of its own: drawn beside the axis's unit, it ran into it (``3
samples beyond the axis, at its edges: 0.243 to 4.48 msms per call``), and one sample read
``1 samples``."""

from __future__ import annotations

import re

import numpy as np
from kcoral_jupyter.bench_display import box_plot_svg


def candidate(median: float, slow_calls: int) -> dict:
    # evenly spread within ±0.01 ms of the median, so only the slow calls lie beyond the axis
    samples = list(np.linspace(median - 0.01, median + 0.01, 100))
    for index in range(slow_calls):
        samples[10 + index] = 4.48  # calls 15x the median: a page fault, a neighbour's burst
    p05, p25, p50, p75, p95 = np.percentile(samples, [5, 25, 50, 75, 95])
    return {
        "latency_ms_p05": p05,
        "latency_ms_p25": p25,
        "latency_ms_median": p50,
        "latency_ms_p75": p75,
        "latency_ms_p95": p95,
        "samples_ms": samples,
    }


def texts(svg: str) -> dict[str, float]:
    """Each text of ``svg`` with its baseline."""
    found = re.findall(r'<text[^>]* y="([0-9.]+)"[^>]*>([^<]*)<', svg)
    return {text: float(y) for y, text in found}


def test_the_count_of_samples_beyond_the_axis_does_not_run_into_the_axis_unit() -> None:
    svg = box_plot_svg([("a", candidate(0.27, 1)), ("b", candidate(0.30, 0))])
    assert svg is not None
    lines = texts(svg)
    (note,) = [text for text in lines if "beyond the axis" in text]
    assert lines[note] != lines["ms per call"], lines
    assert note == "1 sample beyond the axis, at its edges: 4.48 to 4.48 ms", note
    size = re.search(r'<svg[^>]* height="([0-9.]+)"', svg)
    assert size is not None
    height = float(size.group(1))
    assert lines[note] < height, (lines, height)  # inside the picture
