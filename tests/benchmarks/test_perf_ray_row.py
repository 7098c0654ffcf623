"""The Ray peer row of ``perf.py`` says why when Ray cannot run, instead of crashing the run.

Ray is never installed in the project's environment, so the project's own interpreter is a
real "interpreter without ray" to point ``--ray-python`` at.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import perf  # noqa: E402

PLAN = perf.make_plan(quick=True, repeat=1)


def no_log(message: str) -> None:
    pass


@pytest.mark.timeout(120)
def test_an_interpreter_without_ray_gives_a_row_that_names_the_missing_module():
    ray = perf.ray_row_results(Path(sys.executable), PLAN.ray_calls, no_log)
    row = perf.ray_row(ray, 0.01, "default flags")
    assert row.value == "not measured"
    assert "No module named 'ray'" in row.reference
    assert row.verdict == "info"


def test_a_missing_ray_interpreter_gives_a_row_that_says_how_to_make_one(tmp_path):
    ray = perf.ray_row_results(tmp_path / "bin" / "python", PLAN.ray_calls, no_log)
    row = perf.ray_row(ray, 0.01, "default flags")
    assert row.value == "not measured"
    assert "setup_ray.sh" in row.reference


def test_a_ray_measurement_becomes_a_row_with_the_kcoral_to_ray_ratio():
    ray = {"version": "2.0", "p50_seconds": 0.001, "p90_seconds": 0.002, "calls": 3}
    row = perf.ray_row(ray, 0.004, "default flags")
    assert row.value == "1.00 ms"
    assert row.ratio == pytest.approx(4.0)
    assert "kcoral/ray" in row.target


@pytest.mark.timeout(300)
@pytest.mark.skipif(
    not perf.DEFAULT_RAY_PYTHON.exists(),
    reason="Ray is no project dependency: benchmarks/setup_ray.sh makes benchmarks/.ray-venv",
)
def test_the_ray_peer_row_measures_actor_calls_in_rays_own_interpreter():
    ray = perf.ray_row_results(perf.DEFAULT_RAY_PYTHON, PLAN.ray_calls, no_log)
    assert "skipped" not in ray, ray
    assert ray["calls"] == PLAN.ray_calls
    row = perf.ray_row(ray, 0.01, "default flags")
    assert row.value.endswith(" ms") and row.ratio > 0


def test_ray_calls_measured_in_rounds_give_one_p50_over_every_call():
    rounds = [
        {"version": "2.0", "samples": [0.001, 0.003], "init_seconds": 2.0, "p50_seconds": 0.002},
        {"version": "2.0", "samples": [0.002], "init_seconds": 4.0, "p50_seconds": 0.002},
    ]
    ray = perf.ray_of_rounds(rounds)
    assert ray["p50_seconds"] == pytest.approx(0.002)
    assert ray["calls"] == 3 and ray["rounds"] == 2
    assert ray["init_seconds"] == pytest.approx(3.0)
