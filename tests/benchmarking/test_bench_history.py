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
from kcoral.bench.results import as_bench_result, format_comparison


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


# ---------------------------------------------------------------------- audit 2026-12


def gpu_benchmark(samples: list, gpu_state: dict, **extra) -> dict:
    return {
        "kind": "kcoral.benchmark",
        "clock": "cuda_events",
        "gpu_state": gpu_state,
        "samples_ms": samples,
        "warnings": [],
        **extra,
    }


NO_NVML = {"available": False, "reason": "nvidia-ml-py is not installed", "uuid": None}


def test_a_one_sample_run_is_never_a_regression_and_says_why(tmp_path) -> None:
    remember(gpu_benchmark([1.0], {"name": "H100"}), "mm", tmp_path)
    result = remember(gpu_benchmark([5.0], {"name": "H100"}), "mm", tmp_path)
    change = result["history"]["changes"]["benchmark"]
    assert change["value"] == pytest.approx(5.0) and change["regression"] is False
    assert change["verdict"] == "no significant difference"
    assert change["ci95_low"] is None and change["ci95_high"] is None
    assert any("fewer than 6" in w for w in result["warnings"])


def test_runs_on_an_unknown_gpu_are_recorded_but_compared_with_nothing(tmp_path) -> None:
    remember(gpu_benchmark([1.0] * 10, NO_NVML), "mm", tmp_path)  # say an H100
    result = remember(gpu_benchmark([3.0] * 10, NO_NVML), "mm", tmp_path)  # say an A10
    assert result["history"]["key"]["gpu"] == "unknown GPU"
    assert result["history"]["changes"] == {}
    assert any("GPU kind is unknown" in w for w in result["warnings"])
    assert len((tmp_path / HISTORY_FILE).read_text().splitlines()) == 2  # both recorded


def test_the_device_name_torch_reported_keeps_gpu_kinds_apart_without_nvml(tmp_path) -> None:
    remember(gpu_benchmark([1.0] * 10, dict(NO_NVML, device_name="NVIDIA H100")), "mm", tmp_path)
    a10_state = dict(NO_NVML, device_name="NVIDIA A10")
    a10 = remember(gpu_benchmark([3.0] * 10, a10_state), "mm", tmp_path)
    assert a10["history"]["key"]["gpu"] == "NVIDIA A10"
    assert a10["history"]["previous_time"] is None and a10["history"]["changes"] == {}


@pytest.mark.parametrize(
    "old",
    [
        '["x", 1.0]',
        "[NaN, NaN, 1.0]",
        "[null, 1.0]",
        "[[1.0], [2.0]]",
        "[1e400, 1.0]",
        "[-5.0, -4.0]",
        '{"a": 1}',
        '"1.0"',
        "[true, false]",
    ],
)
def test_a_previous_line_with_unusable_samples_is_cleaned_or_skipped_never_fatal(
    tmp_path, old: str
) -> None:
    key = {"label": "mm", "gpu": "cpu", "clock": "cpu"}
    line = '{"key": %s, "time": "t", "candidates": {"mm": {"samples_ms": %s}}}\n'
    (tmp_path / HISTORY_FILE).write_text(line % (json.dumps(key), old))
    current = {"kind": "kcoral.benchmark", "clock": "cpu", "samples_ms": [1.0, 1.1, 0.9] * 4}
    result = remember(current, "mm", tmp_path)
    for change in result["history"]["changes"].values():
        numbers = [change[k] for k in ("value", "ci95_low", "ci95_high") if change[k] is not None]
        assert all(np.isfinite(numbers)) and all(x < 1e300 for x in numbers)
        assert change["regression"] is False  # at most one usable old sample
    if old in ("[[1.0], [2.0]]", "[-5.0, -4.0]", '{"a": 1}', '"1.0"', "[true, false]"):
        assert result["history"]["changes"] == {}  # nothing usable: skipped


def test_driver_cuda_and_torch_versions_are_kept_and_a_change_between_runs_warns(tmp_path) -> None:
    old = {"driver": "550.54", "cuda": "12.4", "torch": "2.5.0"}
    remember(gpu_benchmark([1.0] * 10, {"name": "H100"}, versions=old), "mm", tmp_path)
    new = dict(old, driver="560.35")
    result = remember(gpu_benchmark([1.0] * 10, {"name": "H100"}, versions=new), "mm", tmp_path)
    lines = [json.loads(x) for x in (tmp_path / HISTORY_FILE).read_text().splitlines()]
    assert lines[0]["versions"] == old and lines[1]["versions"] == new
    assert [w for w in result["warnings"] if "differs" in w] == [
        "history: driver 560.35 differs from the previous run's 550.54, so a change may "
        "come from it"
    ]


def test_a_result_reports_its_software_versions_and_torchs_device_name_without_nvml(
    monkeypatch,
) -> None:
    from bench_fakes import VirtualTime, install_gpu

    from kcoral.builtins import benchmark

    clock = VirtualTime()
    install_gpu(monkeypatch, clock)
    torch = __import__("sys").modules["torch"]
    monkeypatch.setattr(torch, "__version__", "2.5.0", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA A10", raising=False)
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)
    result = benchmark(clock.kernel(1.0), {"warmup": 1, "repeat": 10})
    assert result["gpu_state"]["available"] is False
    assert result["gpu_state"]["device_name"] == "NVIDIA A10"
    assert result["versions"] == {"driver": None, "cuda": None, "torch": "2.5.0"}


# ---------------------------------------------------------------------- a damaged file


def test_bytes_that_are_not_utf8_spoil_only_their_own_line(tmp_path) -> None:
    remember(comparison(1.0, 2.0, 1), "mm", tmp_path)
    with (tmp_path / HISTORY_FILE).open("ab") as handle:
        handle.write(b'{"key": "\xff\xfe"}\n')  # a damaged or hand-edited line
    result = remember(comparison(1.0, 2.0, 2), "mm", tmp_path)
    assert set(result["history"]["changes"]) == {"a", "b"}  # the first run still found


def test_a_line_cut_short_does_not_swallow_the_next_record(tmp_path) -> None:
    remember(comparison(1.0, 2.0, 1), "mm", tmp_path)
    path = tmp_path / HISTORY_FILE
    path.write_text(path.read_text()[:100])  # a write cut off: no newline at the end
    remember(comparison(1.0, 2.0, 2), "mm", tmp_path)
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["key"]["label"] == "mm"
    again = remember(comparison(1.0, 2.0, 3), "mm", tmp_path)
    assert set(again["history"]["changes"]) == {"a", "b"}  # compared with the second run


def test_a_line_records_the_results_own_median_not_the_upper_middle_sample(tmp_path) -> None:
    result = comparison(1.0, 2.0, 5)
    for entry in result["candidates"].values():
        entry["samples_ms"] = entry["samples_ms"][:10]  # an even count
    result["candidates"]["a"]["latency_ms_median"] = 0.987  # covers calls thinned away
    remember(result, "mm", tmp_path)
    line = json.loads((tmp_path / HISTORY_FILE).read_text())["candidates"]
    assert line["a"]["latency_ms_median"] == 0.987
    assert line["b"]["latency_ms_median"] == pytest.approx(
        float(np.median(result["candidates"]["b"]["samples_ms"]))
    )


def test_two_runs_too_short_for_the_clock_are_no_change_not_a_faster_one(tmp_path) -> None:
    # a clock that reads 0 for calls shorter than its resolution: both medians are 0
    remember(gpu_benchmark([0.0] * 10, {"name": "H100"}), "mm", tmp_path)
    result = remember(gpu_benchmark([0.0] * 10, {"name": "H100"}), "mm", tmp_path)
    change = result["history"]["changes"]["benchmark"]
    assert (change["value"], change["ci95_low"], change["ci95_high"]) == (1.0, 1.0, 1.0)
    assert change["verdict"] == "no significant difference" and change["regression"] is False


def cpu_benchmark(median: float, seed: int, **extra) -> dict:
    rng = np.random.default_rng(seed)
    samples = list(rng.normal(median, 0.02, 500))
    return as_bench_result(
        {"kind": "kcoral.benchmark", "clock": "cpu", "samples_ms": samples, **extra}
    )


def test_a_benchmark_kept_under_bench_label_is_its_row_and_compares_with_a_config_label(
    tmp_path, monkeypatch
) -> None:
    # `%%kcoral --bench-label mm` kept an unlabelled benchmark as a row named "benchmark":
    # the table said "benchmark", and a later run labelled in its config ('label': 'mm')
    # was compared with nothing, its one row named "mm"
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.chdir(tmp_path)
    first = cpu_benchmark(1.0, 1)
    remember_benchmarks("mm", [first], {})
    assert first["label"] == "mm" and format_comparison(first).splitlines()[2].startswith("mm ")
    later = cpu_benchmark(2.0, 2, label="mm")
    remember_benchmarks(None, [later], {})
    assert later["history"]["changes"]["mm"]["regression"] is True
