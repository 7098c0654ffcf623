"""``compare`` and the GPU state of EXTENSIONS §12 on a real CUDA GPU, in this process (no
server): two spellings of one cuBLAS matmul, a wrong kernel caught by the reference check,
and NVML readings of the current GPU. Skipped, with the reason, without CUDA."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.gpu


def test_compare_on_the_gpu_times_two_matmuls_and_catches_a_wrong_one() -> None:
    import torch

    from kcoral.builtins import compare

    torch.cuda.init()  # the helpers choose a GPU clock once CUDA is initialized
    a = torch.randn(2048, 2048, device="cuda")
    b = torch.randn(2048, 2048, device="cuda")
    result = compare(
        {"a @ b": lambda x, y: x @ y, "torch.mm": torch.mm, "wrong": lambda x, y: x @ y + 1},
        a,
        b,
        {"reference": a @ b, "rtol": 1e-3, "atol": 1e-2, "repeat": 40, "seed": 0},
    )
    assert result["clock"] in ("cupti", "cuda_events")
    assert result["candidates"]["wrong"]["status"] == "mismatch"
    speedup = result["candidates"]["torch.mm"]["speedup"]
    assert 0.8 < speedup["value"] < 1.25  # one kernel spelled twice


@pytest.mark.skipif(
    importlib.util.find_spec("pynvml") is None,
    reason="nvidia-ml-py is not installed (pip install 'kcoral[gpu]')",
)
def test_a_gpu_benchmark_carries_nvml_readings_of_its_own_gpu() -> None:
    import torch

    from kcoral.builtins import benchmark

    torch.cuda.init()
    x = torch.randn(1024, 1024, device="cuda")
    result = benchmark(lambda: x @ x, {"warmup": 5, "repeat": 20})
    state = result["gpu_state"]
    assert state["available"] is True, state
    sample = state["samples"][0]
    assert sample["sm_clock_mhz"] and sample["temperature_c"] is not None
