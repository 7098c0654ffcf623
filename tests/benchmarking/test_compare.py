"""``kcoral.builtins.compare`` and the new keys of ``benchmark`` (EXTENSIONS §12): sleeps of
known length on the CPU clock (generous bounds: the machine is loaded), exact costs on a fake
GPU's virtual clock, the seeded shuffled order, the correctness gate and the adaptive mode."""

from __future__ import annotations

import time

import numpy as np
import pytest
from bench_fakes import VirtualTime, install_gpu

from kcoral.builtins import benchmark, compare
from kcoral.protocol.errors import ExecutionError

PUBLISHED_KEYS = {
    "latency_ms_median",
    "latency_ms_mean",
    "latency_ms_min",
    "latency_ms_max",
    "activities_stable",
    "flush_l2",
    "warmup",
    "repeat",
    "clock",
    "clock_fallback",
}
NEW_KEYS = {
    "kind",
    "samples_ms",
    "latency_ms_p05",
    "latency_ms_p25",
    "latency_ms_p75",
    "latency_ms_p95",
    "latency_ms_iqr",
    "noise",
    "sample_count",
    "samples_thinned",
    "stopped_by",
    "warnings",
}


def sleeper(ms: float):
    """A call of known cost: spins on the wall clock for ``ms`` (``time.sleep`` wakes late by
    the scheduler's latency, several ms on a loaded 2-core machine, which would drown the
    difference; a spin is late only when it is preempted at its very end)."""

    def sleep(*_args) -> None:
        deadline = time.perf_counter() + ms / 1000
        while time.perf_counter() < deadline:
            pass

    return sleep


# ---------------------------------------------------------------------- benchmark's new keys


def test_a_benchmark_keeps_its_published_keys_and_every_sample_in_order() -> None:
    calls = []
    result = benchmark(lambda: calls.append(len(calls)), {"warmup": 1, "repeat": 25})
    assert PUBLISHED_KEYS | NEW_KEYS <= set(result)
    assert result["kind"] == "kcoral.benchmark"
    assert len(result["samples_ms"]) == 25 == result["sample_count"] == result["repeat"]
    assert result["stopped_by"] == "repeat"
    s = result
    assert s["latency_ms_min"] <= s["latency_ms_p05"] <= s["latency_ms_p25"]
    assert s["latency_ms_p25"] <= s["latency_ms_median"] <= s["latency_ms_p75"]
    assert s["latency_ms_p75"] <= s["latency_ms_p95"] <= s["latency_ms_max"]
    assert s["noise"] == pytest.approx(s["latency_ms_iqr"] / s["latency_ms_median"])


def test_samples_beyond_max_samples_are_thinned_and_say_so() -> None:
    result = benchmark(lambda: None, {"warmup": 1, "repeat": 300, "max_samples": 50})
    assert len(result["samples_ms"]) == 50
    assert result["samples_thinned"] is True and result["sample_count"] == 300


@pytest.mark.parametrize(
    "config",
    [
        {"max_samples": 0},
        {"max_samples": 10**9},
        {"target_precision": 0},
        {"target_precision": 2},
        {"target_precision": "tight"},
        {"discard_throttled": "yes"},
        {"label": ""},
        {"label": "x" * 201},
        {"reference": 1},  # compare's key, not benchmark's
    ],
)
def test_bad_new_configuration_fails_with_runtime(config: dict) -> None:
    with pytest.raises(ExecutionError) as info:
        benchmark(lambda: None, config)
    assert info.value.kind == "runtime"


def test_the_adaptive_mode_stops_when_the_median_is_known_well_enough() -> None:
    result = benchmark(sleeper(0.5), {"target_precision": 0.5, "max_ms": 60_000, "repeat_ms": 5})
    assert result["stopped_by"] == "target_precision"
    assert result["precision"] <= 0.5
    assert result["target_precision"] == 0.5


def test_the_adaptive_mode_stops_at_its_budget_and_says_so() -> None:
    clock = VirtualTime()
    noisy = iter(np.random.default_rng(0).uniform(0.5, 5.0, size=100_000))

    def kernel() -> None:
        clock.advance_ms(float(next(noisy)))

    with pytest.MonkeyPatch.context() as patch:
        install_gpu(patch, clock)
        result = benchmark(kernel, {"target_precision": 1e-6, "max_ms": 30, "repeat": 20})
    assert result["stopped_by"] == "max_ms"
    assert any("did not reach the target precision" in w for w in result["warnings"])


# ---------------------------------------------------------------------- compare on the CPU clock


def test_a_two_millisecond_sleep_is_about_twice_as_slow_as_a_one_millisecond_sleep() -> None:
    config = {"repeat": 60, "seed": 1, "flush_l2": False}
    result = compare({"slow": sleeper(2.0), "fast": sleeper(1.0)}, config)
    assert result["kind"] == "kcoral.comparison" and result["baseline"] == "slow"
    speedup = result["candidates"]["fast"]["speedup"]
    # generous bounds for a loaded machine: the interval above 1 is what matters
    assert 1.2 < speedup["value"] < 3.5
    assert speedup["ci95_low"] > 1 and speedup["verdict"] == "faster"
    assert "speedup" not in result["candidates"]["slow"]
    assert all(c["status"] == "ok" for c in result["candidates"].values())
    assert PUBLISHED_KEYS - {"warmup", "repeat", "clock", "clock_fallback", "flush_l2"} <= set(
        result["candidates"]["fast"]
    )


def test_a_function_compared_with_itself_shows_no_big_difference() -> None:
    work = sleeper(1.0)
    result = compare({"a": work, "b": work}, {"repeat": 60, "seed": 2, "flush_l2": False})
    speedup = result["candidates"]["b"]["speedup"]
    # a 95 % interval misses 1 one time in twenty by design; this bound allows for that
    assert speedup["ci95_low"] < 1.15 and speedup["ci95_high"] > 0.87


def test_a_cpu_comparison_reports_the_machine_and_not_a_gpu() -> None:
    result = compare({"a": lambda: None, "b": lambda: None}, {"repeat": 10})
    assert result["clock"] == "cpu" and result["gpu_state"] is None
    assert set(result["machine"]) == {
        "cpu_model",
        "governor",
        "load_average",
        "cpu_count",
        "usable_cpus",
        "others_busy_cpus",
    }
    assert any("CPU worker" in w for w in result["warnings"])
    assert isinstance(result["seed"], int)  # chosen when not given, and reported


# ---------------------------------------------------------------------- exact costs on a fake GPU


def test_on_a_virtual_gpu_clock_the_speedup_is_exact(monkeypatch) -> None:
    clock = VirtualTime()
    install_gpu(monkeypatch, clock)
    result = compare(
        {"naive": clock.kernel(2.0), "tiled": clock.kernel(1.0), "same": clock.kernel(2.0)},
        {"repeat": 30, "seed": 4},
    )
    assert result["clock"] == "cuda_events"
    tiled, same = result["candidates"]["tiled"], result["candidates"]["same"]
    assert tiled["latency_ms_median"] == pytest.approx(1.0)
    assert tiled["speedup"]["value"] == pytest.approx(2.0)
    assert tiled["speedup"]["ci95_low"] == pytest.approx(2.0)
    assert same["speedup"]["ci95_low"] <= 1 <= same["speedup"]["ci95_high"]
    assert same["speedup"]["verdict"] == "no significant difference"


def test_an_adaptive_comparison_stops_once_every_median_is_known(monkeypatch) -> None:
    clock = VirtualTime()
    install_gpu(monkeypatch, clock)
    result = compare(
        {"a": clock.kernel(2.0), "b": clock.kernel(1.0)},
        {"target_precision": 0.01, "max_ms": 60_000, "seed": 0},
    )
    assert result["stopped_by"] == "target_precision"
    assert all(c["sample_count"] >= 10 for c in result["candidates"].values())
    assert all(c["precision"] <= 0.01 for c in result["candidates"].values())


# ---------------------------------------------------------------------- order


def recording_candidates(log: list[str]) -> dict:
    def make(name: str):
        return lambda: log.append(name)

    return {name: make(name) for name in ("a", "b", "c")}


def measured_order(seed: int) -> list[str]:
    log: list[str] = []
    compare(recording_candidates(log), {"repeat": 30, "warmup": 1, "seed": seed})
    # one check call and one warm-up call each, in candidate order, then the rounds
    assert log[:6] == ["a", "b", "c", "a", "b", "c"]
    return log[6:]


def test_rounds_call_every_candidate_once_in_a_seeded_shuffled_order() -> None:
    order = measured_order(seed=123)
    rounds = [tuple(order[i : i + 3]) for i in range(0, len(order), 3)]
    assert len(rounds) == 30
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds)
    assert len(set(rounds)) > 1  # shuffled afresh each round
    assert measured_order(seed=123) == order  # the same seed replays the same order
    assert measured_order(seed=124) != order


# ---------------------------------------------------------------------- the correctness gate


def test_a_candidate_that_differs_from_the_reference_is_not_timed_and_the_others_are() -> None:
    calls = {"good": 0, "bad": 0}
    x = np.arange(6.0)

    def good(v):
        calls["good"] += 1
        return v * 2

    def bad(v):
        calls["bad"] += 1
        return v * 2 + np.array([0, 0, 0, 0, 0, 0.5])

    result = compare(
        {"base": lambda v: v + v, "good": good, "bad": bad},
        x,
        {"reference": x * 2, "repeat": 10, "warmup": 1},
    )
    entry = result["candidates"]["bad"]
    assert entry["status"] == "mismatch" and entry["max_abs_error"] == pytest.approx(0.5)
    assert "latency_ms_median" not in entry and "speedup" not in entry
    assert calls["bad"] == 1  # the check, nothing more
    assert result["candidates"]["good"]["status"] == "ok"
    assert calls["good"] == 1 + 1 + 10  # the check, the warm-up, ten rounds
    assert "speedup" in result["candidates"]["good"]
    assert result["reference_checked"] is True


def test_a_reference_callable_and_tolerances_decide_a_match() -> None:
    x = np.ones(4)
    result = compare(
        {"base": lambda v: v * 3, "close": lambda v: v * 3 + 1e-4, "far": lambda v: v * 3 + 1},
        x,
        {"reference": lambda v: v * 3, "rtol": 0, "atol": 1e-3, "repeat": 5},
    )
    statuses = {name: c["status"] for name, c in result["candidates"].items()}
    assert statuses == {"base": "ok", "close": "ok", "far": "mismatch"}


def test_kernels_that_write_into_an_output_argument_are_checked_on_it() -> None:
    def into(out, a, b):
        np.matmul(a, b, out=out)

    def wrong_into(out, a, b):
        out[:] = 0

    a, b = np.eye(3) * 2, np.ones((3, 3))
    result = compare(
        {"numpy": into, "zeros": wrong_into},
        np.empty((3, 3)),
        a,
        b,
        {"reference": a @ b, "outputs": [0], "repeat": 5},
    )
    assert result["candidates"]["numpy"]["status"] == "ok"
    assert result["candidates"]["zeros"]["status"] == "mismatch"
    assert result["candidates"]["zeros"]["max_abs_error"] == pytest.approx(2.0)


def test_arguments_are_cloned_so_one_candidate_cannot_feed_another() -> None:
    def corrupt(out, a):
        a[:] = 100  # writes into its input as well
        out[:] = a * 0 + 1

    def honest(out, a):
        out[:] = a + 1

    data = np.zeros(3)
    result = compare(
        {"honest": honest, "corrupt": corrupt, "honest_again": honest},
        np.empty(3),
        data,
        {"reference": np.ones(3), "outputs": [0], "repeat": 5},
    )
    assert result["candidates"]["honest_again"]["status"] == "ok"
    assert data.tolist() == [0, 0, 0]  # the caller's arguments are never written


def test_torch_tensors_are_compared_with_allclose_on_their_device() -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed here")
    a = torch.randn(16, 16)
    result = compare(
        {
            "matmul": lambda x: x @ x,
            "einsum": lambda x: torch.einsum("ij,jk->ik", x, x),
            "off": lambda x: x @ x + 1,
        },
        a,
        {"reference": a @ a, "rtol": 1e-4, "atol": 1e-4, "repeat": 5},
    )
    statuses = {name: c["status"] for name, c in result["candidates"].items()}
    assert statuses == {"matmul": "ok", "einsum": "ok", "off": "mismatch"}
    assert result["candidates"]["off"]["max_abs_error"] == pytest.approx(1.0, rel=1e-4)


def test_nan_where_the_reference_has_nan_matches_and_nan_anywhere_else_does_not() -> None:
    masked = np.array([1.0, np.nan, 3.0, np.inf])
    result = compare(
        {
            "base": lambda v: v.copy(),
            "shifted": lambda v: v + np.array([0, 0, 0.5, 0]),
            "nan_elsewhere": lambda v: np.array([np.nan, np.nan, 3.0, np.inf]),
            "a_float": lambda v: float("nan"),
        },
        masked,
        {"reference": masked, "repeat": 5},
    )
    entries = result["candidates"]
    assert entries["base"]["status"] == "ok" and entries["base"]["max_abs_error"] == 0.0
    assert entries["shifted"]["max_abs_error"] == pytest.approx(0.5)  # NaN and inf: no error
    assert entries["nan_elsewhere"]["status"] == "mismatch"
    assert entries["a_float"]["status"] == "mismatch"  # NaN for an array: not the same value
    floats = compare({"base": lambda: float("nan")}, {"reference": float("nan"), "repeat": 5})
    assert floats["candidates"]["base"]["status"] == "ok"


def test_nan_where_the_torch_reference_has_nan_matches() -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed here")
    masked = torch.tensor([1.0, float("nan"), float("inf")])
    result = compare(
        {"base": lambda v: v.clone(), "off": lambda v: v + torch.tensor([1.0, 0.0, 0.0])},
        masked,
        {"reference": masked, "repeat": 5},
    )
    entries = result["candidates"]
    assert entries["base"]["status"] == "ok" and entries["base"]["max_abs_error"] == 0.0
    assert entries["off"]["status"] == "mismatch"
    assert entries["off"]["max_abs_error"] == pytest.approx(1.0)


def test_a_candidate_that_calls_sys_exit_is_failed_and_the_others_are_still_compared() -> None:
    def exits() -> None:
        raise SystemExit(3)

    result = compare({"base": lambda: None, "exits": exits, "ok": lambda: None}, {"repeat": 5})
    assert result["candidates"]["exits"]["status"] == "failed"
    assert "SystemExit" in result["candidates"]["exits"]["error"]
    assert result["candidates"]["ok"]["status"] == "ok"


def test_a_baseline_that_mismatches_fails_the_comparison_naming_it() -> None:
    with pytest.raises(ExecutionError) as info:
        compare({"wrong_base": lambda: 3, "right": lambda: 4}, {"reference": 4, "repeat": 5})
    assert info.value.kind == "runtime"
    assert "baseline 'wrong_base' does not match the reference" in info.value.message


def test_a_candidate_that_raises_is_failed_and_the_others_are_still_compared() -> None:
    def broken() -> None:
        raise ValueError("kernel launch failed")

    result = compare({"base": lambda: None, "broken": broken, "ok": lambda: None}, {"repeat": 5})
    assert result["candidates"]["broken"]["status"] == "failed"
    assert "ValueError: kernel launch failed" in result["candidates"]["broken"]["error"]
    assert result["candidates"]["ok"]["status"] == "ok"


def test_a_candidate_that_raises_only_while_timed_is_failed_too() -> None:
    count = [0]

    def flaky() -> None:
        count[0] += 1
        if count[0] > 3:
            raise RuntimeError("out of memory")

    result = compare({"base": lambda: None, "flaky": flaky}, {"repeat": 10, "warmup": 1})
    assert result["candidates"]["flaky"]["status"] == "failed"
    assert "latency_ms_median" not in result["candidates"]["flaky"]
    assert result["candidates"]["base"]["sample_count"] == 10


@pytest.mark.parametrize(
    ("candidates", "config", "message"),
    [
        ([lambda: None], {}, "candidates must map names"),
        ({}, {}, "from 1 to 32 candidates"),
        ({"a": 3}, {}, "not callable"),
        ({"a": lambda: None}, {"outputs": [5]}, "not an argument position"),
        ({"a": lambda: None}, {"seed": -1}, "seed"),
        ({"a": lambda: None}, {"rtol": -1}, "rtol"),
        ({"a": lambda: None}, {"colour": "red"}, "unknown config key"),
        # benchmark's own keys, checked by the same code, said as compare's
        ({"a": lambda: None}, {"repeat": 0}, "config 'repeat' must be at least 1"),
    ],
)
def test_misused_compare_fails_with_runtime_and_says_why(candidates, config, message) -> None:
    with pytest.raises(ExecutionError) as info:
        compare(candidates, config)
    assert info.value.kind == "runtime" and message in info.value.message
    assert info.value.message.startswith("compare: "), info.value.message


# ---------------------------------------------------------------------- few samples, the call cap


def test_a_comparison_of_one_round_claims_no_difference_and_warns_why(monkeypatch) -> None:
    clock = VirtualTime()
    install_gpu(monkeypatch, clock)
    result = compare(
        {"naive": clock.kernel(2.0), "tiled": clock.kernel(1.0)}, {"repeat": 1, "seed": 4}
    )
    speedup = result["candidates"]["tiled"]["speedup"]
    assert speedup["value"] == pytest.approx(2.0)
    assert speedup["verdict"] == "no significant difference"
    assert speedup["ci95_low"] is None and speedup["ci95_high"] is None
    assert result["candidates"]["tiled"]["precision"] is None
    assert any("'tiled'" in w and "fewer than 6" in w for w in result["warnings"])


@pytest.mark.parametrize("key", ["repeat", "warmup"])
def test_a_count_above_the_call_cap_is_refused_before_anything_runs(key: str) -> None:
    calls = []
    with pytest.raises(ExecutionError, match=f"'{key}' must be at most 100000") as caught:
        benchmark(lambda: calls.append(1), {key: 10**12, "flush_l2": False})
    assert caught.value.kind == "runtime" and calls == []
    with pytest.raises(ExecutionError, match=f"'{key}' must be at most 100000"):
        compare({"a": lambda: calls.append(1)}, {key: 100_001})
    assert calls == []


def test_a_budget_over_a_tiny_estimate_asks_for_at_most_the_call_cap() -> None:
    from kcoral.bench.config import MAX_CALLS, calls_for_budget

    assert calls_for_budget(1e12, 1e-9) == MAX_CALLS


def lower_call_cap(monkeypatch, cap: int) -> None:
    """The measurement's cap, not the configuration's limit (so a repeat above it passes)."""
    from kcoral.bench import report, rounds

    for module in (report, rounds):
        monkeypatch.setattr(module, "MAX_CALLS", cap)


def test_a_benchmark_round_is_cut_at_the_call_cap_and_the_result_warns(monkeypatch) -> None:
    clock = VirtualTime()
    install_gpu(monkeypatch, clock)
    lower_call_cap(monkeypatch, 95)
    # 100 calls in rounds of 10: the old code stopped only between rounds, at 100
    result = benchmark(clock.kernel(1.0), {"warmup": 1, "repeat": 100})
    assert (result["repeat"], result["sample_count"], result["stopped_by"]) == (95, 95, "max_calls")
    assert any("stopped at 95 calls" in w for w in result["warnings"])


def test_a_comparison_stops_exactly_at_the_call_cap_and_warns(monkeypatch) -> None:
    clock = VirtualTime()
    install_gpu(monkeypatch, clock)
    lower_call_cap(monkeypatch, 100)
    kernels = {name: clock.kernel(1.0) for name in ("a", "b", "c")}
    result = compare(kernels, {"repeat": 40, "warmup": 1, "seed": 1})
    counts = [entry["sample_count"] for entry in result["candidates"].values()]
    assert sum(counts) == 100 and result["stopped_by"] == "max_calls"
    assert any("max_calls" in w for w in result["warnings"])


def test_a_run_that_reaches_its_repeat_count_exactly_at_the_cap_stopped_by_repeat(
    monkeypatch,
) -> None:
    clock = VirtualTime()
    install_gpu(monkeypatch, clock)
    lower_call_cap(monkeypatch, 100)
    result = benchmark(clock.kernel(1.0), {"warmup": 1, "repeat": 100})
    assert (result["repeat"], result["stopped_by"]) == (100, "repeat")
    assert not any("max_calls" in w for w in result["warnings"])
