"""The speedup interval's bootstrap of the median: ``kcoral.bench.stats.bootstrap_medians``
(each resample's median drawn from its order statistic's Beta law, O(1) a resample) against
the textbook bootstrap it replaced (draw n indexes, take the median: O(n) a resample), in
one run, for the 2000 resamples behind every interval.

    python benchmarks/bootstrap.py [--sizes 1000 10000 100000]

Prints each size's time for both and the ratio, and the largest gap between the two
intervals' bounds (the same distribution, so only sampling noise). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from kcoral.bench.stats import BOOTSTRAP_RESAMPLES, bootstrap_medians


def textbook(samples: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    """The replaced implementation: 250 resamples at a time, so memory stays bounded."""
    medians = np.empty(resamples)
    for start in range(0, resamples, 250):
        count = min(250, resamples - start)
        picks = rng.integers(0, samples.size, size=(count, samples.size))
        medians[start : start + count] = np.median(samples[picks], axis=1)
    return medians


def timed(draw, samples: np.ndarray) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    medians = draw(samples, np.random.default_rng(0), BOOTSTRAP_RESAMPLES)
    return time.perf_counter() - start, medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    sizes = parser.parse_args().sizes
    print(f"load average at start {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    print(f"{'samples':>8} | {'textbook':>10} | {'order statistic':>15} | ratio | 95 % bounds gap")
    for size in sizes:
        samples = np.random.default_rng(size).gamma(4.0, size=size)
        old_s, old = timed(textbook, samples)
        new_s, new = timed(bootstrap_medians, samples)
        gap = np.max(np.abs(np.percentile(old, [2.5, 97.5]) - np.percentile(new, [2.5, 97.5])))
        width = np.ptp(np.percentile(old, [2.5, 97.5]))
        print(
            f"{size:>8} | {old_s * 1000:>8.1f}ms | {new_s * 1000:>13.2f}ms | "
            f"{old_s / new_s:>4.0f}x | {gap / width:.1%} of the interval"
        )
    print(f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
