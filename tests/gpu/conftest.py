"""GPU test folder: ``gpu``-marked tests need CUDA and are skipped, with the reason, without it.

Also builds, once per session, a small CPU shared object exporting TVM-FFI functions
(with ``tvm_ffi.cpp.build_inline`` and the system C++ compiler) for the library tests, and
a CUDA one (with ``nvcc``; compile-only, so it builds wherever the CUDA toolkit is, GPU or
not), and starts the real ``kcoral server --device gpu`` of ``test_gpu_server.py``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import server_process
from cuda_programs import cuda_home
from server_process import RunningServer, start_server

LIBRARY_SOURCE = r"""
#include <tvm/ffi/function.h>
#include <tvm/ffi/error.h>

int64_t add_one(int64_t x) { return x + 1; }

int64_t scale_sum(int64_t a, int64_t b, int64_t factor) { return (a + b) * factor; }

int64_t fail_on_negative(int64_t x) {
  if (x < 0) TVM_FFI_THROW(ValueError) << "negative input " << x;
  return x;
}
"""

LIBRARY_EXPORTS = ["add_one", "scale_sum", "fail_on_negative"]


def cuda_missing_reason() -> str | None:
    """Why this machine cannot run ``gpu`` tests, or ``None`` when it can."""
    if importlib.util.find_spec("torch") is None:
        return "needs a CUDA GPU: torch is not installed"
    try:
        import torch

        if not torch.version.cuda:
            return f"needs a CUDA GPU: torch {torch.__version__} is a build without CUDA"
        if not torch.cuda.is_available():
            return "needs a CUDA GPU: torch.cuda.is_available() is false (no GPU or no driver)"
    except Exception as exc:
        return f"needs a CUDA GPU: torch failed to query CUDA ({type(exc).__name__}: {exc})"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip this folder's ``gpu`` tests, with the reason, where there is no CUDA GPU."""
    here = Path(__file__).resolve().parent
    marked = [
        item
        for item in items
        if item.get_closest_marker("gpu") is not None
        and here in Path(str(item.path)).resolve().parents
    ]
    if not marked:
        return
    reason = cuda_missing_reason()  # torch is imported only when a gpu test was collected
    if reason is None:
        return
    for item in marked:
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def cpu_library(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """Bytes of a CPU ``.so`` exporting ``add_one``, ``scale_sum`` and ``fail_on_negative``."""
    if importlib.util.find_spec("tvm_ffi") is None:
        pytest.skip("apache-tvm-ffi is not installed (pip install 'kcoral[gpu]')")
    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("no C++ compiler (g++) on PATH to build the test library")
    import tvm_ffi.cpp

    build = tmp_path_factory.mktemp("tvm-ffi-build")
    path = tvm_ffi.cpp.build_inline(
        "kcoral_test_library",
        cpp_sources=LIBRARY_SOURCE,
        functions=LIBRARY_EXPORTS,
        build_directory=str(build),
    )
    return Path(path).read_bytes()


CUDA_LIBRARY_SOURCE = r"""
#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

__global__ void add_one_kernel(const float* x, float* y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + 1.0f;
}

// y = x + 1 on the CUDA stream whose handle the caller passes (torch's cuda_stream)
void add_one(tvm::ffi::TensorView x, tvm::ffi::TensorView y, int64_t stream) {
  int64_t n = x.numel();
  TVM_FFI_ICHECK(y.numel() == n) << "x and y differ in size";
  int threads = 256;
  int blocks = (int)((n + threads - 1) / threads);
  add_one_kernel<<<blocks, threads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      static_cast<const float*>(x.data_ptr()), static_cast<float*>(y.data_ptr()), n);
  cudaError_t err = cudaGetLastError();
  TVM_FFI_ICHECK(err == cudaSuccess) << cudaGetErrorString(err);
}
"""

CUDA_ARCH_LIST = "9.0a"  # the H200 of the device check; override with TVM_FFI_CUDA_ARCH_LIST


@pytest.fixture(scope="session")
def cuda_library(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """Bytes of a CUDA ``.so`` exporting ``add_one(x, y, stream)`` through TVM-FFI."""
    if importlib.util.find_spec("tvm_ffi") is None:
        pytest.skip("apache-tvm-ffi is not installed (pip install 'kcoral[gpu]')")
    home = cuda_home()
    if home is None:
        pytest.skip("no CUDA toolkit (nvcc and libcudart.so) to build the CUDA test library")
    import tvm_ffi.cpp

    build = tmp_path_factory.mktemp("tvm-ffi-cuda-build")
    saved = {name: os.environ.get(name) for name in ("CUDA_HOME", "TVM_FFI_CUDA_ARCH_LIST")}
    os.environ["CUDA_HOME"] = str(home)
    os.environ.setdefault("TVM_FFI_CUDA_ARCH_LIST", CUDA_ARCH_LIST)
    try:
        path = tvm_ffi.cpp.build_inline(
            "kcoral_cuda_test_library",
            cuda_sources=CUDA_LIBRARY_SOURCE,
            functions=["add_one"],
            build_directory=str(build),
        )
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return Path(path).read_bytes()


GPU_SERVER_START_SECONDS = 300.0  # two workers import torch and initialize CUDA


@pytest.fixture(scope="module")
def gpu_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A real ``kcoral server --device gpu`` on GPU 0 with two reused workers."""
    reason = cuda_missing_reason()
    if reason is not None:
        pytest.skip(reason)
    saved = server_process.START_TIMEOUT_SECONDS
    server_process.START_TIMEOUT_SECONDS = max(saved, GPU_SERVER_START_SECONDS)
    try:
        server = start_server(
            tmp_path_factory.mktemp("gpu-server"),
            ["--device", "gpu", "--gpus", "0", "--workers-per-gpu", "2"],
        )
    finally:
        server_process.START_TIMEOUT_SECONDS = saved
    try:
        yield server
    finally:
        server.stop()
