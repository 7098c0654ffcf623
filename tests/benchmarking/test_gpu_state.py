"""The GPU's state with every measurement (EXTENSIONS §12.4), through a fake ``pynvml`` and a
fake CUDA-events GPU: opened by UUID, clocks locked or not, throttled rounds seen and
dropped, and the honest report when NVML is missing."""

from __future__ import annotations

import subprocess
import sys

import pytest
from bench_fakes import GPU_UUID, FakeNvml, VirtualTime, install_gpu, install_nvml

from kcoral.builtins import benchmark, compare

LOCKED = {"application_clock": 1755, "default_application_clock": 1980}
SW_THERMAL = 0x20
IDLE = 0x1


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> VirtualTime:
    clock = VirtualTime()
    install_gpu(monkeypatch, clock)
    return clock


def test_importing_kcoral_or_the_builtins_never_loads_nvml() -> None:
    code = "import kcoral, kcoral.builtins, sys; print('pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_worker_gpu_is_opened_by_its_uuid_and_read_around_every_round(gpu, monkeypatch) -> None:
    nvml = install_nvml(monkeypatch, FakeNvml(**LOCKED))
    result = compare({"a": gpu.kernel(1.0), "b": gpu.kernel(1.0)}, {"repeat": 12, "seed": 0})
    assert nvml.opened == [GPU_UUID] and nvml.shut_down
    state = result["gpu_state"]
    assert state["available"] is True and state["uuid"] == GPU_UUID
    assert state["name"] == "NVIDIA H200"
    assert state["sample_count"] == 13  # before the first round and after each of 12
    first = state["samples"][0]
    assert first == {
        "sm_clock_mhz": 1980,
        "memory_clock_mhz": 2619,
        "temperature_c": 45,
        "power_w": 250.0,
        "throttle_reasons": [],
    }
    assert state["clocks_locked"] is True
    assert not [w for w in result["warnings"] if "clock" in w or "throttl" in w]


def test_without_application_clocks_the_result_warns_that_clocks_are_not_locked(
    gpu, monkeypatch
) -> None:
    install_nvml(monkeypatch, FakeNvml())  # application clock == its default: nobody set it
    result = benchmark(gpu.kernel(1.0), {"warmup": 1, "repeat": 10})
    assert result["gpu_state"]["clocks_locked"] is False
    assert any("clocks are not locked: no application clocks" in w for w in result["warnings"])


def test_an_sm_clock_that_moves_more_than_two_percent_counts_as_unlocked(gpu, monkeypatch) -> None:
    install_nvml(monkeypatch, FakeNvml(sm_clocks=[1755, 1755, 1600, 1755], **LOCKED))
    result = benchmark(gpu.kernel(1.0), {"warmup": 1, "repeat": 10})
    state = result["gpu_state"]
    assert (state["sm_clock_mhz_min"], state["sm_clock_mhz_max"]) == (1600, 1755)
    assert state["clocks_locked"] is False
    assert any("moved from 1600 to 1755 MHz" in w for w in result["warnings"])


def test_throttled_rounds_are_reported_and_kept_unless_asked(gpu, monkeypatch) -> None:
    # readings: 0 before round 1, then one after each round; round 3 ends throttled
    install_nvml(monkeypatch, FakeNvml(throttle=[0, 0, 0, SW_THERMAL, 0, 0], **LOCKED))
    result = compare({"a": gpu.kernel(1.0), "b": gpu.kernel(2.0)}, {"repeat": 8, "seed": 1})
    assert result["gpu_state"]["throttled_rounds"] == 2  # rounds 3 and 4 touch that reading
    assert result["discarded_rounds"] == 0
    assert result["candidates"]["a"]["sample_count"] == 8
    assert any(
        "throttled during 2 of 8 rounds (sw_thermal_slowdown)" in w for w in result["warnings"]
    )


def test_discard_throttled_drops_the_rounds_taken_while_throttled_and_says_how_many(
    gpu, monkeypatch
) -> None:
    install_nvml(monkeypatch, FakeNvml(throttle=[0, 0, 0, SW_THERMAL, 0, 0], **LOCKED))
    result = compare(
        {"a": gpu.kernel(1.0), "b": gpu.kernel(2.0)},
        {"repeat": 8, "seed": 1, "discard_throttled": True},
    )
    assert result["discarded_rounds"] == 2 == result["gpu_state"]["discarded_rounds"]
    assert result["candidates"]["a"]["sample_count"] == 6
    assert result["candidates"]["b"]["sample_count"] == 6
    assert any("2 throttled rounds were dropped" in w for w in result["warnings"])


def test_an_idle_gpu_is_not_throttling(gpu, monkeypatch) -> None:
    install_nvml(monkeypatch, FakeNvml(throttle=[IDLE], **LOCKED))
    result = benchmark(gpu.kernel(1.0), {"warmup": 1, "repeat": 10, "discard_throttled": True})
    assert result["gpu_state"]["throttled_rounds"] == 0 and result["discarded_rounds"] == 0


def test_when_every_round_throttled_none_is_dropped_and_the_result_says_so(
    gpu, monkeypatch
) -> None:
    install_nvml(monkeypatch, FakeNvml(throttle=[SW_THERMAL], **LOCKED))
    result = benchmark(gpu.kernel(1.0), {"warmup": 1, "repeat": 10, "discard_throttled": True})
    assert result["sample_count"] == 10 and result["discarded_rounds"] == 0
    assert any("every round was throttled" in w for w in result["warnings"])


def test_without_nvidia_ml_py_the_result_says_the_gpu_state_was_not_read(gpu, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    result = benchmark(gpu.kernel(1.0), {"warmup": 1, "repeat": 5})
    assert result["gpu_state"]["available"] is False
    assert "nvidia-ml-py is not installed" in result["gpu_state"]["reason"]
    assert any("GPU state not read" in w for w in result["warnings"])


def test_a_gpu_nvml_cannot_open_is_reported_not_fatal(gpu, monkeypatch) -> None:
    install_nvml(monkeypatch, FakeNvml())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-00000000-0000-0000-0000-000000000000")
    result = benchmark(gpu.kernel(1.0), {"warmup": 1, "repeat": 5})
    assert result["gpu_state"]["available"] is False
    assert "NVML cannot open GPU-00000000" in result["gpu_state"]["reason"]
    assert result["latency_ms_median"] == pytest.approx(1.0)


def test_a_cpu_worker_reports_its_governor_and_load_instead(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())  # present, but no GPU clock here
    result = benchmark(lambda: None, {"warmup": 1, "repeat": 5})
    assert result["clock"] == "cpu" and result["gpu_state"] is None
    machine = result["machine"]
    assert set(machine) == {
        "cpu_model",
        "governor",
        "load_average",
        "cpu_count",
        "usable_cpus",
        "others_busy_cpus",
    }
    assert machine["cpu_count"] >= 1 and len(machine["load_average"]) == 3
