"""Benchmark history (EXTENSIONS §12.6): where the file goes, its key, the change against the
previous run of the same key with its interval, regressions flagged, unreadable lines
skipped, samples capped."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kcoral.bench.history import (
    BESIDE_NOTEBOOK,
    HISTORY_FILE,
    HISTORY_SAMPLES,
    IN_WORKING_DIRECTORY,
    history_directory,
    remember,
    remember_benchmarks,
)
from kcoral.bench.results import as_bench_result


def comparison(median_a: float, median_b: float, seed: int, clock: str = "cpu") -> dict:
    rng = np.random.default_rng(seed)
    return as_bench_result(
        {
            "kind": "kcoral.comparison",
            "baseline": "a",
            "clock": clock,
            "candidates": {
                "a": {"status": "ok", "samples_ms": list(rng.normal(median_a, 0.02, 500))},
                "b": {"status": "ok", "samples_ms": list(rng.normal(median_b, 0.02, 500))},
            },
        }
    )


def test_the_first_run_of_a_key_has_no_change_and_is_appended(tmp_path) -> None:
    result = remember(comparison(1.0, 2.0, 1), "mm", tmp_path, BESIDE_NOTEBOOK)
    history = result["history"]
    assert history["file"] == str(tmp_path / HISTORY_FILE)
    assert history["previous_time"] is None and history["changes"] == {}
    assert history["key"] == {"label": "mm", "gpu": "cpu", "clock": "cpu"}
    entry = json.loads((tmp_path / HISTORY_FILE).read_text())
    assert len(entry["candidates"]["a"]["samples_ms"]) == HISTORY_SAMPLES  # capped


def test_a_run_that_got_slower_is_flagged_as_a_regression(tmp_path) -> None:
    remember(comparison(1.0, 2.0, 1), "mm", tmp_path)
    result = remember(comparison(1.0, 3.0, 2), "mm", tmp_path)
    same, slower = result["history"]["changes"]["a"], result["history"]["changes"]["b"]
    assert slower["value"] == pytest.approx(1.5, rel=0.02)
    assert slower["ci95_low"] > 1 and slower["regression"] is True
    assert same["ci95_low"] < 1 < same["ci95_high"] and same["regression"] is False


def test_a_run_that_got_faster_is_no_regression(tmp_path) -> None:
    remember(comparison(1.0, 2.0, 1), "mm", tmp_path)
    change = remember(comparison(1.0, 1.0, 2), "mm", tmp_path)["history"]["changes"]["b"]
    assert change["ci95_high"] < 1 and change["verdict"] == "faster"
    assert change["regression"] is False


def test_another_label_or_clock_is_another_key(tmp_path) -> None:
    remember(comparison(1.0, 2.0, 1), "mm", tmp_path)
    assert remember(comparison(1.0, 3.0, 2), "other", tmp_path)["history"]["changes"] == {}
    gpu = comparison(1.0, 3.0, 3, clock="cupti")
    gpu["gpu_state"] = {"available": True, "name": "NVIDIA H200"}
    history = remember(gpu, "mm", tmp_path)["history"]
    assert history["changes"] == {}
    assert history["key"] == {"label": "mm", "gpu": "NVIDIA H200", "clock": "cupti"}


def test_unreadable_lines_in_the_history_are_skipped(tmp_path) -> None:
    remember(comparison(1.0, 2.0, 1), "mm", tmp_path)
    with (tmp_path / HISTORY_FILE).open("a") as handle:
        handle.write("{not json\n[1, 2]\n\n")
    result = remember(comparison(1.0, 2.0, 2), "mm", tmp_path)
    assert set(result["history"]["changes"]) == {"a", "b"}


def test_the_history_goes_beside_the_notebook_jupyter_names(tmp_path, monkeypatch) -> None:
    notebook = tmp_path / "work" / "kernels.ipynb"
    notebook.parent.mkdir()
    notebook.write_text("{}")
    monkeypatch.setenv("JPY_SESSION_NAME", str(notebook))
    assert history_directory() == (notebook.parent.resolve(), BESIDE_NOTEBOOK)
    # a relative name: the kernel runs in the notebook's folder
    monkeypatch.setenv("JPY_SESSION_NAME", "work/kernels.ipynb")
    monkeypatch.chdir(notebook.parent)
    assert history_directory() == (notebook.parent.resolve(), BESIDE_NOTEBOOK)


def test_vs_code_names_its_notebook_in_the_namespace(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    notebook = tmp_path / "v.ipynb"
    notebook.write_text("{}")
    assert history_directory({"__vsc_ipynb_file__": str(notebook)})[0] == tmp_path.resolve()


def test_without_a_notebook_path_the_working_directory_is_used_and_said(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.chdir(tmp_path)
    assert history_directory() == (tmp_path.resolve(), IN_WORKING_DIRECTORY)
    notes = remember_benchmarks("mm", [comparison(1.0, 2.0, 1)], {})
    assert notes == [
        f"kcoral: benchmark 'mm' recorded in {tmp_path.resolve() / HISTORY_FILE} "
        f"({IN_WORKING_DIRECTORY})"
    ]


def test_only_labelled_benchmark_results_are_remembered(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.chdir(tmp_path)
    labelled = comparison(1.0, 2.0, 1)
    labelled["label"] = "own-label"
    assert remember_benchmarks(None, [comparison(1.0, 2.0, 1), {"kind": "x"}, 3], {}) == []
    assert "'own-label'" in remember_benchmarks(None, [labelled], {})[0]
