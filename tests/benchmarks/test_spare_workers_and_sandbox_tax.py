"""``benchmarks/spare_workers.py`` runs end to end, and ``perf.py``'s sandbox-tax rows
compare the two configurations of one run (smoke and unit tests, not measurements: nothing
about the numbers of a real run is asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import perf  # noqa: E402


def _configuration(scale: float) -> dict:
    groups: dict[str, dict[str, float]] = {"reused": {}, "fresh": {}}
    for group, key, _measure in perf.SANDBOX_TAX_MEASURES:
        groups[group][key] = 0.010 * scale
    return groups


def test_the_sandbox_tax_rows_give_each_measure_with_default_flags_over_sandbox_none():
    rows = perf.sandbox_tax_rows(
        {"default flags": _configuration(1.2), "--sandbox none": _configuration(1.0)}
    )
    assert [row.measure for row in rows] == [m for _g, _k, m in perf.SANDBOX_TAX_MEASURES]
    assert all(row.ratio == pytest.approx(1.2) and row.verdict == "MISS" for row in rows)
    assert all(row.reference.startswith("--sandbox none ") for row in rows)
    # one configuration alone has nothing to compare with
    assert perf.sandbox_tax_rows({"default flags": _configuration(1.0)}) == []


@pytest.mark.timeout(300)
def test_the_spare_workers_benchmark_prints_both_configurations_and_their_ratio(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "spare_workers.py"), "--spaced", "2",
         "--back-to-back", "3"],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| measure | spares (default) | --no-spare-workers | ratio |" in done.stdout
    for row in ("back to back queue_ms", "back to back p50 (ms)", "spaced p50 (ms)"):
        assert f"| {row} |" in done.stdout, done.stdout


def test_rounds_share_out_the_samples_but_not_the_cpu_window():
    plan = perf.make_plan(quick=False, repeat=3)
    share = perf.round_plan(plan)
    assert plan.rounds == 3
    assert (share.trivial, share.back_to_back, share.ray_calls) == (40, 15, 200)
    assert share.cpu_requests == plan.cpu_requests  # measured whole, in the first round


def test_the_median_of_rounds_combines_numbers_and_keeps_names():
    rounds = [
        {"sandbox": "bubblewrap", "reused": {"trivial_p50_seconds": 0.002, "rates": {"1": 10}}},
        {"sandbox": "bubblewrap", "reused": {"trivial_p50_seconds": 0.004, "rates": {"1": 30}}},
        {"sandbox": "bubblewrap", "reused": {"trivial_p50_seconds": 0.003, "rates": {"1": 20},
                                             "frontend_cpu_seconds_per_request": 0.001}},
    ]  # fmt: skip
    combined = perf.median_of_rounds(rounds)
    assert combined["sandbox"] == "bubblewrap"
    assert combined["reused"]["trivial_p50_seconds"] == pytest.approx(0.003)
    assert combined["reused"]["rates"] == {"1": 20}
    # only the first round measures the CPU window: its number is kept as measured
    assert combined["reused"]["frontend_cpu_seconds_per_request"] == pytest.approx(0.001)
