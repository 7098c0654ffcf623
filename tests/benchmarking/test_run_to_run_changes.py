"""The change against the previous run of a history key (EXTENSIONS §12.6): the ratio of
the medians the user saw, and no verdict from the noise between two runs of unchanged code."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kcoral.bench.history import HISTORY_FILE, remember
from kcoral.bench.results import as_bench_result, format_comparison
from kcoral.bench.run_to_run import RUN_TO_RUN_NOISE, WITHIN_NOISE


def benchmark(samples: list[float], median: float | None = None) -> dict:
    result = {"kind": "kcoral.benchmark", "clock": "cpu", "label": "sum", "samples_ms": samples}
    if median is not None:
        result["latency_ms_median"] = median
    return as_bench_result(result)


def test_the_change_is_the_ratio_of_the_medians_the_table_and_the_file_show(tmp_path) -> None:
    # what a CPU run of unchanged code gave: the line's 200 kept samples (thinned in call
    # order) have a median of 0.2695 where the run's own, over its 1000 calls, was 0.2657;
    # the change read 0.98x [0.978, 0.997] "faster" against 0.2640 / 0.2657 = 0.9936
    rng = np.random.default_rng(3)
    old = list(rng.normal(0.2695, 0.01, 200))
    remember(benchmark(old, median=0.2657), "sum", tmp_path)
    new = benchmark(list(rng.normal(0.2640, 0.01, 1000)), median=0.2640)
    change = remember(new, "sum", tmp_path)["history"]["changes"]["sum"]
    recorded = json.loads((tmp_path / HISTORY_FILE).read_text().splitlines()[0])
    by_hand = 0.2640 / recorded["candidates"]["sum"]["latency_ms_median"]
    assert change["value"] == pytest.approx(by_hand)
    assert change["ci95_low"] < change["value"] < change["ci95_high"]
    assert change["verdict"] != "faster" and change["regression"] is False
    assert "0.994× [" in format_comparison(new)


def test_a_small_significant_change_between_runs_is_within_noise_not_a_regression(
    tmp_path,
) -> None:
    # 1000 tight samples a side make a 2 % shift "significant" within the runs' own calls,
    # but two runs of unchanged code differ that much (clocks, neighbours): no REGRESSION
    rng = np.random.default_rng(1)
    remember(benchmark(list(rng.normal(1.00, 0.01, 1000))), "sum", tmp_path)
    result = benchmark(list(rng.normal(1.02, 0.01, 1000)))
    change = remember(result, "sum", tmp_path)["history"]["changes"]["sum"]
    assert 1 < change["ci95_low"] < 1 + RUN_TO_RUN_NOISE
    assert change["verdict"] == WITHIN_NOISE == "not beyond 5% noise"
    assert change["regression"] is False
    assert "REGRESSION" not in format_comparison(result)


def test_a_change_beyond_the_noise_band_is_a_regression_or_a_speedup(tmp_path) -> None:
    rng = np.random.default_rng(2)
    remember(benchmark(list(rng.normal(1.00, 0.01, 1000))), "sum", tmp_path)
    slower = benchmark(list(rng.normal(1.10, 0.01, 1000)))
    change = remember(slower, "sum", tmp_path)["history"]["changes"]["sum"]
    assert change["verdict"] == "slower" and change["regression"] is True
    assert "REGRESSION" in format_comparison(slower)
    faster = benchmark(list(rng.normal(0.90, 0.01, 1000)))
    change = remember(faster, "sum", tmp_path)["history"]["changes"]["sum"]
    assert change["verdict"] == "faster" and change["regression"] is False


def test_a_cpu_run_on_another_machine_or_without_the_l2_flush_warns(tmp_path) -> None:
    # every CPU run's key is "cpu": a laptop's run was compared with a server's in silence
    rng = np.random.default_rng(4)
    laptop = benchmark(list(rng.normal(1.0, 0.01, 500)))
    laptop.update(flush_l2=True, machine={"cpu_model": "Laptop CPU", "usable_cpus": 8})
    remember(laptop, "sum", tmp_path)
    server = benchmark(list(rng.normal(0.5, 0.01, 500)))
    server.update(flush_l2=False, machine={"cpu_model": "Server CPU", "usable_cpus": 64})
    history = remember(server, "sum", tmp_path)["history"]
    assert history["changes"]["sum"]["verdict"] == "faster"
    assert history["warnings"] == [
        "history: this run's L2 flush (False) differs from the previous run's (True), so a "
        "change may come from it",
        "history: this run's CPU ('Server CPU') differs from the previous run's ('Laptop CPU'), "
        "so a change may come from it",
        "history: this run's usable CPUs (64) differs from the previous run's (8), so a "
        "change may come from it",
    ]
    assert "warning: history: this run's CPU ('Server CPU')" in format_comparison(server)


def test_a_cpu_workers_machine_names_its_cpu_model() -> None:
    from kcoral.bench.gpu_state import cpu_machine_state

    model = cpu_machine_state()["cpu_model"]
    assert model is None or (isinstance(model, str) and model)
    with open("/proc/cpuinfo") as handle:
        if "model name" in handle.read():
            assert isinstance(model, str)


def test_a_change_against_a_run_that_shared_its_cpus_says_so(tmp_path) -> None:
    # unchanged code on a loaded 2-CPU VM read 0.708x "faster": its previous run had been
    # slowed by neighbours, which only that run's own output had said
    rng = np.random.default_rng(5)
    crowded = benchmark(list(rng.normal(0.37, 0.01, 500)))
    crowded["machine"] = {"cpu_model": "VM", "usable_cpus": 2, "others_busy_cpus": 1.12}
    remember(crowded, "sum", tmp_path)
    quiet = benchmark(list(rng.normal(0.26, 0.01, 500)))
    quiet["machine"] = {"cpu_model": "VM", "usable_cpus": 2, "others_busy_cpus": 0.02}
    history = remember(quiet, "sum", tmp_path)["history"]
    assert history["warnings"] == [
        "history: other processes kept 1.12 of the 2 CPUs busy during the previous run, so a "
        "change may come from them"
    ]
    again = benchmark(list(rng.normal(0.26, 0.01, 500)))
    again["machine"] = {"cpu_model": "VM", "usable_cpus": 2, "others_busy_cpus": 0.1}
    assert remember(again, "sum", tmp_path)["history"]["warnings"] == []


def test_the_table_says_which_run_vs_previous_is_against(tmp_path) -> None:
    rng = np.random.default_rng(6)
    first = remember(benchmark(list(rng.normal(1.0, 0.01, 100))), "sum", tmp_path)
    file = tmp_path / HISTORY_FILE
    assert format_comparison(first).endswith(f"history: {file}, the first run of 'sum' here")
    later = remember(benchmark(list(rng.normal(1.0, 0.01, 100))), "sum", tmp_path)
    when = json.loads(file.read_text().splitlines()[0])["time"]
    assert format_comparison(later).endswith(f"history: {file}, vs the run of {when}")
    assert f"history: {file}, vs the run of {when}</div>" in later._repr_html_()


def test_a_gpu_run_with_its_clocks_unlocked_against_one_locked_warns(tmp_path) -> None:
    rng = np.random.default_rng(7)
    runs = []
    for locked in (True, False):
        run = benchmark(list(rng.normal(1.0, 0.01, 100)))
        run.update(clock="cuda_events", gpu_state={"name": "NVIDIA H100", "clocks_locked": locked})
        runs.append(remember(run, "mm", tmp_path))
    assert runs[1]["history"]["warnings"] == [
        "history: this run's GPU clocks locked (False) differs from the previous run's (True), "
        "so a change may come from it"
    ]


def test_a_change_from_a_median_of_zero_keeps_its_value_inside_its_interval(tmp_path) -> None:
    # a previous run whose calls the clock read as 0 (too short for it), then a real time:
    # the interval's scaled bounds overflowed to the largest float, above the value
    remember(benchmark([0.0] * 10, median=0.0), "sum", tmp_path)
    rng = np.random.default_rng(8)
    change = remember(benchmark(list(rng.normal(1.0, 0.01, 100)), median=1.0), "sum", tmp_path)[
        "history"
    ]["changes"]["sum"]
    assert change["ci95_low"] <= change["value"] <= change["ci95_high"]
    assert change["regression"] is True


def test_a_long_history_is_read_from_its_end_only_as_far_as_the_last_run(
    tmp_path, monkeypatch
) -> None:
    # 20 000 runs (160 MB) took 3.4 s a cell: every line was read and parsed
    import os

    rng = np.random.default_rng(9)
    other = json.dumps({"key": {"label": "old", "gpu": "cpu", "clock": "cpu"}}) + "\n"
    (tmp_path / HISTORY_FILE).write_text(other * 200_000)  # about 11 MB of other labels
    remember(benchmark(list(rng.normal(1.0, 0.01, 100))), "sum", tmp_path)
    read = []
    real_pread, real_read = os.pread, os.read

    def counted_pread(fd: int, size: int, offset: int) -> bytes:
        read.append(size)
        return real_pread(fd, size, offset)

    def counted_read(fd: int, size: int) -> bytes:
        data = real_read(fd, size)
        read.append(len(data))
        return data

    monkeypatch.setattr(os, "pread", counted_pread)
    monkeypatch.setattr(os, "read", counted_read)
    later = remember(benchmark(list(rng.normal(1.0, 0.01, 100))), "sum", tmp_path)
    assert "sum" in later["history"]["changes"]
    assert sum(read) <= 2 * 1024 * 1024
