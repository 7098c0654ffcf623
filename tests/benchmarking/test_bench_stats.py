"""``kcoral.bench.stats``: percentiles, thinning, the median's precision and the seeded
bootstrap of a ratio of medians, on synthetic samples (no clocks, so exact where it can be)."""

from __future__ import annotations

import numpy as np
import pytest

from kcoral.bench.stats import (
    MIN_INTERVAL_SAMPLES,
    NO_DIFFERENCE,
    bootstrap_medians,
    median_precision,
    ratio_of_medians,
    summary,
    thinned,
    too_few_samples,
)


def test_the_summary_has_every_percentile_the_iqr_and_the_noise() -> None:
    stats = summary([float(x) for x in range(1, 101)], max_samples=1000)
    assert stats["latency_ms_median"] == pytest.approx(50.5)
    assert stats["latency_ms_p05"] == pytest.approx(5.95)
    assert stats["latency_ms_p25"] == pytest.approx(25.75)
    assert stats["latency_ms_p75"] == pytest.approx(75.25)
    assert stats["latency_ms_p95"] == pytest.approx(95.05)
    assert stats["latency_ms_iqr"] == pytest.approx(49.5)
    assert stats["noise"] == pytest.approx(49.5 / 50.5)
    assert (stats["latency_ms_min"], stats["latency_ms_max"]) == (1.0, 100.0)
    assert stats["samples_ms"] == [float(x) for x in range(1, 101)]
    assert stats["samples_thinned"] is False and stats["sample_count"] == 100


def test_thinned_samples_keep_the_first_and_last_in_order_and_the_statistics_cover_all() -> None:
    samples = [float(x) for x in range(10_000)]
    kept, was_thinned = thinned(samples, 100)
    assert was_thinned and len(kept) == 100
    assert kept[0] == 0.0 and kept[-1] == 9999.0 and kept == sorted(kept)
    stats = summary(samples, max_samples=100)
    assert stats["sample_count"] == 10_000 and stats["samples_thinned"] is True
    assert stats["latency_ms_max"] == 9999.0  # from every call, not the kept ones


def test_a_median_of_zero_gives_a_finite_noise() -> None:
    stats = summary([0.0, 0.0, 0.0], max_samples=10)
    assert stats["noise"] == 0.0


def test_the_median_precision_shrinks_as_samples_are_added() -> None:
    rng = np.random.default_rng(1)
    few = list(rng.normal(1.0, 0.1, size=20))
    many = list(rng.normal(1.0, 0.1, size=2000))
    assert median_precision(few) > median_precision(many)
    assert median_precision(many) < 0.01
    assert median_precision([1.0, 2.0]) == float("inf")  # too few for an interval


def test_a_two_to_one_ratio_has_an_interval_above_one() -> None:
    rng = np.random.default_rng(7)
    slow = list(rng.normal(2.0, 0.05, size=200))
    fast = list(rng.normal(1.0, 0.05, size=200))
    speedup = ratio_of_medians(slow, fast, seed=3)
    assert speedup["value"] == pytest.approx(2.0, rel=0.05)
    assert 1 < speedup["ci95_low"] <= speedup["value"] <= speedup["ci95_high"]
    assert speedup["verdict"] == "greater"


def test_samples_of_one_distribution_give_an_interval_that_contains_one() -> None:
    rng = np.random.default_rng(11)
    left = list(rng.normal(1.0, 0.1, size=300))
    right = list(rng.normal(1.0, 0.1, size=300))
    speedup = ratio_of_medians(left, right, seed=5)
    assert speedup["ci95_low"] < 1 < speedup["ci95_high"]
    assert speedup["verdict"] == NO_DIFFERENCE


def test_the_bootstrap_is_seeded() -> None:
    rng = np.random.default_rng(2)
    left, right = list(rng.random(50)), list(rng.random(50))
    assert ratio_of_medians(left, right, seed=9) == ratio_of_medians(left, right, seed=9)
    assert ratio_of_medians(left, right, seed=9) != ratio_of_medians(left, right, seed=10)


def test_a_zero_denominator_keeps_the_ratio_finite() -> None:
    speedup = ratio_of_medians([1.0] * 6, [0.0] * 6, seed=0)
    assert all(np.isfinite(speedup[k]) for k in ("value", "ci95_low", "ci95_high"))


@pytest.mark.parametrize("sizes", [(1, 1), (1, 50), (50, 5)])
def test_a_ratio_with_fewer_than_six_samples_on_a_side_has_no_interval_and_no_verdict(
    sizes: tuple[int, int],
) -> None:
    # one sample resampled is always itself: the interval had width 0, any ratio "significant"
    top = [1.0 + i * 1e-3 for i in range(sizes[0])]
    bottom = [2.0 + i * 1e-3 for i in range(sizes[1])]
    ratio = ratio_of_medians(top, bottom, seed=0)
    assert ratio["verdict"] == NO_DIFFERENCE
    assert ratio["ci95_low"] is None and ratio["ci95_high"] is None
    assert ratio["value"] == pytest.approx(np.median(top) / np.median(bottom))
    assert too_few_samples(top, bottom) is not None


def test_six_samples_a_side_are_enough_for_an_interval_and_a_verdict() -> None:
    top, bottom = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98], [2.0, 2.01, 1.99, 2.0, 2.02, 1.98]
    assert MIN_INTERVAL_SAMPLES == 6 and median_precision(top) != float("inf")
    assert ratio_of_medians(top, bottom, seed=0)["verdict"] == "smaller"
    assert too_few_samples(top, bottom) is None


def brute_force_bootstrap_medians(samples: np.ndarray, seed: int, resamples: int) -> np.ndarray:
    """The textbook bootstrap: draw n indexes with replacement, take the median, repeat."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, samples.size, size=(resamples, samples.size))
    return np.median(samples[picks], axis=1)


@pytest.mark.parametrize("size", [7, 12])
def test_the_order_statistic_bootstrap_draws_the_textbook_bootstraps_medians(size: int) -> None:
    # odd and even sizes: an even resample's median averages the two middle draws
    samples = np.random.default_rng(1).gamma(2.0, size=size)
    resamples = 200_000
    exact = bootstrap_medians(samples, np.random.default_rng(2), resamples)
    textbook = brute_force_bootstrap_medians(samples, 3, resamples)
    values = np.union1d(exact, textbook)
    exact_share = np.searchsorted(np.sort(exact), values, side="right") / resamples
    textbook_share = np.searchsorted(np.sort(textbook), values, side="right") / resamples
    # the same distribution: every cumulative share agrees within sampling noise (here
    # about 0.002; a wrong even case, the lower middle alone, is 0.18 off). 0.02 is far
    # past what 200,000 draws can differ by chance, whatever numpy's samplers draw
    assert np.max(np.abs(exact_share - textbook_share)) < 0.02
