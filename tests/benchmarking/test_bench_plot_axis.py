"""The box plot of a result (EXTENSIONS §12.5) keeps its boxes readable whatever a few calls
did: its axis spans the whiskers, and the samples beyond it are drawn at its edge and
counted."""

from __future__ import annotations

import re

import numpy as np
from kcoral_jupyter.bench_display import PLOT_WIDTH, box_plot_svg


def candidate(median: float, seed: int) -> dict:
    samples = list(np.random.default_rng(seed).normal(median, 0.01, 100))
    samples[50] = 4.48  # one call 15x the median: a page fault, a neighbour's burst
    p05, p25, p50, p75, p95 = np.percentile(samples, [5, 25, 50, 75, 95])
    return {
        "latency_ms_p05": p05,
        "latency_ms_p25": p25,
        "latency_ms_median": p50,
        "latency_ms_p75": p75,
        "latency_ms_p95": p95,
        "samples_ms": samples,
    }


def test_one_slow_call_does_not_squeeze_every_box_into_a_few_pixels() -> None:
    # seen on a CPU comparison of 0.27 and 0.30 ms: one 4.48 ms call set the axis to
    # 0.04-4.69 ms, both boxes were 1.4 px wide and their 10 % difference did not show
    svg = box_plot_svg([("a", candidate(0.27, 1)), ("b", candidate(0.30, 2))])
    assert svg is not None
    boxes = [float(w) for w in re.findall(r'<rect x="[0-9.]+" y="[0-9.]+" width="([0-9.]+)"', svg)]
    assert len(boxes) == 2 and min(boxes) > PLOT_WIDTH / 20
    medians = [float(x) for x in re.findall(r'<line x1="([0-9.]+)" x2="\1" y1', svg)]
    assert medians[1] - medians[0] > PLOT_WIDTH / 10  # the two medians are far apart
    note = re.findall(r"<text[^>]*>([^<]*beyond the axis[^<]*)</text>", svg)
    assert len(note) == 1
    assert re.fullmatch(
        r"[1-9][0-9]* samples beyond the axis, at its edges: \S+ to 4\.48 ms", note[0]
    )
    dots = [float(x) for x in re.findall(r'<circle cx="([0-9.]+)"', svg)]
    assert max(dots) <= PLOT_WIDTH - 20  # the slow call sits at the axis's edge, inside
