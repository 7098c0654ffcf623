"""Statistics of benchmark samples (EXTENSIONS §12): percentiles, spread, a distribution-free
interval for the median, and a seeded bootstrap for the ratio of two medians.

numpy only, imported by ``kcoral.builtins`` when a helper runs (never at ``import kcoral``).
Every value is finite, because the wire's number nodes must be (PROTOCOL §6): a median of 0
gives a noise of 0, never NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

#: Bootstrap resamples behind every speedup interval; enough for a stable 95 % interval.
BOOTSTRAP_RESAMPLES = 2000
#: The 95 % normal quantile, for the order-statistic interval of the median.
_Z95 = 1.959963984540054
#: What an interval that contains 1 reads as.
NO_DIFFERENCE = "no significant difference"
#: Samples a list needs before its median has an interval: below this ``precision`` is
#: ``null`` and a ratio of medians claims no difference (a bootstrap of 1 sample has width 0).
MIN_INTERVAL_SAMPLES = 6


def thinned(samples: Sequence[float], max_samples: int) -> tuple[list[float], bool]:
    """At most ``max_samples`` of ``samples``, evenly spaced in call order, and whether
    any were left out (the statistics are always computed over all of them)."""
    if len(samples) <= max_samples:
        return [float(x) for x in samples], False
    picks = np.linspace(0, len(samples) - 1, num=max_samples).round().astype(int)
    return [float(samples[i]) for i in picks], True


def summary(samples: Sequence[float], max_samples: int) -> dict[str, Any]:
    """The published statistics of one sample list (SERVER §15 plus EXTENSIONS §12)."""
    times = np.asarray(samples, dtype=float)
    p05, p25, median, p75, p95 = (float(v) for v in np.percentile(times, [5, 25, 50, 75, 95]))
    iqr = p75 - p25
    kept, was_thinned = thinned(samples, max_samples)
    return {
        "latency_ms_median": median,
        "latency_ms_mean": float(times.mean()),
        "latency_ms_min": float(times.min()),
        "latency_ms_max": float(times.max()),
        "latency_ms_p05": p05,
        "latency_ms_p25": p25,
        "latency_ms_p75": p75,
        "latency_ms_p95": p95,
        "latency_ms_iqr": iqr,
        "noise": iqr / median if median > 0 else 0.0,
        "sample_count": int(times.size),
        "samples_ms": kept,
        "samples_thinned": was_thinned,
    }


def median_precision(samples: Sequence[float]) -> float:
    """Half the width of a 95 % interval for the median, divided by the median.

    The interval is distribution-free: the order statistics at ranks n/2 ± 1.96·√n/2
    (a binomial argument), so it needs no resampling and shrinks as calls are added,
    unlike the noise (IQR / median), which is a property of the kernel, not of the count.
    Infinite while there are too few samples for the interval to exist."""
    n = len(samples)
    if n < MIN_INTERVAL_SAMPLES:
        return math.inf
    ordered = np.sort(np.asarray(samples, dtype=float))
    half_width_ranks = _Z95 * math.sqrt(n) / 2
    low = max(0, math.floor(n / 2 - half_width_ranks))
    high = min(n - 1, math.ceil(n / 2 + half_width_ranks))
    median = float(np.median(ordered))
    if median <= 0:
        return 0.0
    return float(ordered[high] - ordered[low]) / 2 / median


def too_few_samples(*sides: Sequence[float]) -> str | None:
    """Why no interval can compare these sample lists (one has fewer than
    ``MIN_INTERVAL_SAMPLES``), else ``None``: the text a result's warning goes on with."""
    counts = [len(side) for side in sides]
    if min(counts) >= MIN_INTERVAL_SAMPLES:
        return None
    return (
        f"{' and '.join(str(c) for c in counts)} samples, fewer than {MIN_INTERVAL_SAMPLES} "
        f"on a side, give no 95 % interval, so it reads as {NO_DIFFERENCE!r}"
    )


def bootstrap_medians(samples: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    """The medians of ``resamples`` bootstrap resamples of ``samples``, drawn exactly without
    building a resample: drawing n indexes uniformly, the k-th smallest is ``floor(n * U)``
    with U the k-th smallest of n uniforms, which is Beta(k, n - k + 1); the next one up is
    ``U + (1 - U) * Beta(1, n - k)``. So each resample costs O(1), not O(n): a comparison of
    100 000 samples a side took seconds of resampling, now milliseconds."""
    ordered = np.sort(samples)
    n = ordered.size

    def at(uniform: np.ndarray) -> np.ndarray:
        return ordered[np.minimum((uniform * n).astype(np.int64), n - 1)]

    k = (n + 1) // 2  # the lower middle: the median itself when n is odd
    lower = rng.beta(k, n - k + 1, size=resamples)
    if n % 2:
        return at(lower)
    upper = lower + (1.0 - lower) * rng.beta(1, n - k, size=resamples)
    averaged: np.ndarray = (at(lower) + at(upper)) / 2
    return averaged


def _ratios(top: Any, bottom: Any) -> Any:
    """top / bottom, finite: a zero bottom counts as the smallest positive float, and two
    zero medians (calls too short for the clock) are a ratio of 1, not of 0."""
    tiny, limit = np.finfo(float).tiny, np.finfo(float).max
    both_zero = (np.asarray(top) <= 0) & (np.asarray(bottom) <= 0)
    ratio = np.minimum(np.asarray(top) / np.maximum(bottom, tiny), limit)
    return np.where(both_zero, 1.0, ratio)


def ratio_of_medians(
    numerator: Sequence[float],
    denominator: Sequence[float],
    seed: int,
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> dict[str, Any]:
    """median(numerator) / median(denominator) with a seeded percentile-bootstrap 95 %
    interval (each list resampled on its own) and what the interval says.

    ``verdict`` is ``"greater"`` when the whole interval lies above 1, ``"smaller"`` when
    below, else ``"no significant difference"``. A zero denominator median counts as the
    smallest positive float, so the ratio stays finite; two zero medians are a ratio of 1.
    With fewer than ``MIN_INTERVAL_SAMPLES`` on either side there is no interval (``null``
    bounds) and the
    verdict is ``"no significant difference"``: resampling one sample always gives it back,
    so any difference would read as significant (see ``too_few_samples``)."""
    top = np.asarray(numerator, dtype=float)
    bottom = np.asarray(denominator, dtype=float)
    value = float(_ratios(np.median(top), np.median(bottom)))
    if too_few_samples(numerator, denominator):
        return {"value": value, "ci95_low": None, "ci95_high": None, "verdict": NO_DIFFERENCE}
    rng = np.random.default_rng(seed)
    ratios = _ratios(
        bootstrap_medians(top, rng, resamples), bootstrap_medians(bottom, rng, resamples)
    )
    limit = np.finfo(float).max
    low, high = (min(float(v), limit) for v in np.percentile(ratios, [2.5, 97.5]))
    if low > 1:
        verdict = "greater"
    elif high < 1:
        verdict = "smaller"
    else:
        verdict = NO_DIFFERENCE
    return {"value": value, "ci95_low": low, "ci95_high": high, "verdict": verdict}
