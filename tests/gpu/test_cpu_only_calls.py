"""Which CUDA API calls count as GPU work under the cpu_only watch (PROTOCOL §6.2 note).

The call sequences below are written down from torch's sources (torch 2.x, CUDA 12/13),
not captured on a GPU: no GPU was lent to the session that wrote them. They list the
runtime (``cuda*``) and driver (``cu*``) API entries and exits that CUPTI's callback API
reports, with CUPTI's own spellings (``_v3020`` / ``_v2`` suffixes):

* a CPU backward pass: autograd's ``Engine::start_device_threads`` asks
  ``c10::cuda::device_count()`` (``cudaGetDeviceCount``, which asks the driver), then each
  device thread's ``thread_init`` sets its device through ``c10::cuda::SetDevice``
  (``cudaGetDevice``) and checks for a primary context (``cuDevicePrimaryCtxGetState``
  through the entry point ``cudaGetDriverEntryPoint`` hands out);
* ``torch.profiler.profile()`` on a GPU worker (CUDA activities by default): kineto reads
  the device count, properties and versions when it attaches CUPTI, and
  ``profile.__exit__`` calls ``torch.cuda.synchronize()`` (``cudaDeviceSynchronize`` →
  ``cuCtxSynchronize``);
* dishonest programs: ``torch.ones(1, device="cuda")`` (an allocation, then a kernel
  launch), ``tensor.cpu()`` of a CUDA tensor (a copy), ``torch.cuda.empty_cache()``.

``tests/gpu/test_gpu_server.py`` runs the honest ones for real on a GPU worker.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from kcoral_server.worker.cupti_guard import (
    ALLOWED_CALLS,
    CallJudge,
    base_name,
    first_violation,
    is_allowed_call,
)

PROTOCOL = Path(__file__).resolve().parents[2] / "docs" / "spec" / "PROTOCOL.md"


def call(name: str, *inner: tuple[str, str], thread: int = 0) -> list[tuple[str, str, int]]:
    """Entry and exit of ``name`` around the records ``inner`` (calls it makes itself)."""
    records = [("enter", name, thread)]
    for record in inner:
        records.append((record[0], record[1], thread))
    records.append(("exit", name, thread))
    return records


def driver(name: str) -> list[tuple[str, str]]:
    return [("enter", name), ("exit", name)]


CPU_BACKWARD = [
    # Engine::start_device_threads -> c10::cuda::device_count()
    *call("cudaGetDeviceCount_v3020", *driver("cuInit"), *driver("cuDeviceGetCount")),
    # device thread 1: thread_init -> set_device(0) -> c10::cuda::SetDevice
    *call("cudaGetDevice_v3020", thread=1),
    *call("cudaGetDriverEntryPoint_v11030", *driver("cuGetProcAddress_v2"), thread=1),
    *call("cuDevicePrimaryCtxGetState", thread=1),
    # the backward pass itself runs on the CPU: no more CUDA calls
]

TORCH_PROFILER = [
    # kineto attaching CUPTI: device properties and versions for the trace's metadata
    *call("cudaGetDeviceCount_v3020", *driver("cuDeviceGetCount")),
    *call(
        "cudaGetDeviceProperties_v2_v12000",
        *driver("cuDeviceGetName"),
        *driver("cuDeviceTotalMem_v2"),
        *driver("cuDeviceGetAttribute"),
        *driver("cuDeviceGetUuid_v2"),
    ),
    *call("cudaRuntimeGetVersion_v6000"),
    *call("cudaDriverGetVersion_v3020", *driver("cuDriverGetVersion")),
    *call("cuCtxGetCurrent"),
    *call("cudaGetDevice_v3020"),
    # profile.__exit__ -> torch.cuda.synchronize()
    *call("cudaGetDevice_v3020"),
    *call("cudaDeviceSynchronize_v3020", *driver("cuCtxSynchronize")),
    *call("cudaGetLastError_v3020"),
]

TORCH_ONES_ON_CUDA = [
    *call("cudaGetDevice_v3020"),
    *call("cudaStreamIsCapturing_v10000"),
    *call("cudaMalloc_v3020", *driver("cuMemAlloc_v2")),
    *call("cudaLaunchKernel_v7000", *driver("cuLaunchKernel")),
]

CUDA_TENSOR_TO_HOST = [
    *call("cudaGetDevice_v3020"),
    *call("cudaMemcpyAsync_v3020", *driver("cuMemcpyAsync")),
    *call("cudaStreamSynchronize_v3020"),
]

EMPTY_CACHE = [
    *call("cudaDeviceSynchronize_v3020", *driver("cuCtxSynchronize")),
    *call("cudaFree_v3020", *driver("cuMemFree_v2")),
]


def test_a_cpu_backward_pass_makes_no_call_that_counts_as_gpu_work() -> None:
    assert first_violation(CPU_BACKWARD) is None


def test_torch_profiler_attaching_cupti_and_synchronizing_is_not_gpu_work() -> None:
    assert first_violation(TORCH_PROFILER) is None


def test_a_cpu_backward_inside_the_profiler_is_still_honest() -> None:
    assert first_violation(TORCH_PROFILER[:-6] + CPU_BACKWARD + TORCH_PROFILER[-6:]) is None


@pytest.mark.parametrize(
    ("sequence", "culprit"),
    [
        (TORCH_ONES_ON_CUDA, "cudaMalloc"),
        (CUDA_TENSOR_TO_HOST, "cudaMemcpyAsync"),
        (EMPTY_CACHE, "cudaFree"),
        (CPU_BACKWARD + TORCH_ONES_ON_CUDA, "cudaMalloc"),
    ],
    ids=["torch.ones on cuda", "cuda tensor to host", "empty_cache", "backward then ones"],
)
def test_allocations_copies_and_launches_count_as_gpu_work(sequence, culprit) -> None:
    assert first_violation(sequence) == culprit


def test_a_kernel_launched_from_a_cached_block_is_caught_at_the_launch() -> None:
    cached = [*call("cudaGetDevice_v3020"), *call("cudaLaunchKernel_v7000")]
    assert first_violation(cached) == "cudaLaunchKernel"


def test_a_driver_launch_outside_any_runtime_call_is_gpu_work() -> None:
    assert first_violation([*call("cuCtxGetCurrent"), *call("cuLaunchKernel")]) == (
        "cuLaunchKernel"
    )


def test_driver_calls_inside_an_allowed_runtime_call_are_allowed_only_on_its_thread() -> None:
    judge = CallJudge()
    assert judge.enter("cudaGetDeviceCount_v3020", thread=1) is False
    assert judge.enter("cuDeviceGetCount", thread=1) is False
    # another thread launching meanwhile is not covered by thread 1's allowed call
    assert judge.enter("cuLaunchKernel", thread=2) is True
    judge.exit(thread=1)
    judge.exit(thread=1)
    assert judge.enter("cuMemAlloc_v2", thread=1) is True  # the allowed span is over


def test_an_exit_whose_entry_came_before_the_watch_is_ignored() -> None:
    judge = CallJudge()
    judge.exit(thread=0)  # the call started before CUPTI was subscribed
    assert judge.enter("cudaMalloc_v3020", thread=0) is True


@pytest.mark.parametrize(
    ("name", "base"),
    [
        ("cudaGetDeviceCount_v3020", "cudaGetDeviceCount"),
        ("cudaGetDeviceProperties_v2_v12000", "cudaGetDeviceProperties"),
        ("cuMemAlloc_v2", "cuMemAlloc"),
        ("cudaStreamSynchronize_ptsz", "cudaStreamSynchronize"),
        ("cudaMemcpyAsync_ptsz_v7000", "cudaMemcpyAsync"),
        ("cuDevicePrimaryCtxGetState", "cuDevicePrimaryCtxGetState"),
    ],
)
def test_variant_suffixes_are_ignored_when_judging(name: str, base: str) -> None:
    assert base_name(name) == base


def test_launches_allocations_copies_and_frees_are_never_allowed() -> None:
    for name in (
        "cudaLaunchKernel",
        "cuLaunchKernel",
        "cudaMalloc",
        "cudaMallocAsync",
        "cuMemAlloc_v2",
        "cudaMemcpy",
        "cudaMemcpyAsync",
        "cudaMemset",
        "cudaFree",
        "cuMemFree_v2",
        "cudaGraphLaunch",
        "cuModuleLoadData",
        "cudaStreamCreate",
        "cudaEventRecord",
        "cuDevicePrimaryCtxRetain",
        "cuCtxCreate_v2",
    ):
        assert not is_allowed_call(name), name


def test_the_allowed_calls_are_exactly_the_ones_protocol_6_2_names() -> None:
    text = PROTOCOL.read_text(encoding="utf-8")
    start = text.index("### 6.2 ")
    section = text[start : text.index("### 6.3 ", start)]
    note = section[section.index("Implementation note") :]
    named = set(re.findall(r"`(cu[A-Za-z]+)`", note))
    assert named == set(ALLOWED_CALLS)
