"""Uploaded code shared by the GPU suite (``test_gpu_server.py``) and its compile-only part
(``test_cuda_builds.py``): a CUDA-source module and the Python harness that builds it with
``nvcc`` and launches it on a torch stream through ``ctypes``."""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path

CUDA_SOURCE = r"""
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void scale_kernel(float* x, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) x[i] = 2.0f * x[i] + 1.0f;
}

extern "C" int launch_scale(float* x, int64_t n, void* stream) {
  int threads = 256;
  int blocks = (int)((n + threads - 1) / threads);
  scale_kernel<<<blocks, threads, 0, (cudaStream_t)stream>>>(x, n);
  return (int)cudaGetLastError();
}
"""

HARNESS = """
import ctypes
import os
import subprocess


def build(kernel, nvcc, arch):
    # a compile step: runs with cpu_only on GPU servers, touches no GPU
    with open("kernel.cu", "w") as handle:
        handle.write(kernel.source)
    command = [nvcc, "-shared", "-Xcompiler", "-fPIC", "-o", "kernel.so", "kernel.cu"]
    if arch:
        command.insert(1, f"-arch={arch}")
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError("nvcc failed: " + done.stderr[-2000:])
    return os.path.abspath("kernel.so")


def describe(path):
    data = open(path, "rb").read()
    return {"elf": data[:4] == b"\\x7fELF", "exports_launch": b"launch_scale" in data}


def launch(path, name, x):
    import torch

    function = getattr(ctypes.CDLL(path), "launch_" + name)
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    y = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    y.record_stream(stream)
    with torch.cuda.stream(stream):
        error = function(y.data_ptr(), y.numel(), stream.cuda_stream)
    torch.cuda.current_stream().wait_stream(stream)
    if error:
        raise RuntimeError(f"kernel launch failed with CUDA error {error}")
    return y
"""


LIB_DIRS = ("lib64", "lib", "targets/x86_64-linux/lib")


def cuda_home() -> Path | None:
    """The CUDA toolkit folder holding ``bin/nvcc`` and ``lib64/libcudart.so``."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc is not None:
        candidates += [str(Path(nvcc).resolve().parent.parent)]
    candidates += ["/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"), reverse=True)]
    for candidate in candidates:
        if candidate and (Path(candidate) / "bin" / "nvcc").exists():
            if any((Path(candidate) / lib / "libcudart.so").exists() for lib in LIB_DIRS):
                return Path(candidate)
    return None


def nvcc_path() -> str | None:
    home = cuda_home()
    return str(home / "bin" / "nvcc") if home is not None else shutil.which("nvcc")
