"""The compile-only parts of the GPU suite: they need the CUDA toolkit (``nvcc``), not a GPU,
so they run wherever it is installed (and skip, saying so, where it is not)."""

from __future__ import annotations

import subprocess

import pytest
from cuda_programs import CUDA_SOURCE, HARNESS, nvcc_path

import kcoral


def test_a_cuda_tvm_ffi_library_builds_with_nvcc(cuda_library: bytes) -> None:
    assert cuda_library[:4] == b"\x7fELF"
    assert b"__tvm_ffi_add_one" in cuda_library


def test_a_cuda_source_module_compiles_in_a_cpu_only_step_on_a_cpu_server(
    kcoral_server,
) -> None:
    nvcc = nvcc_path()
    if nvcc is None:
        pytest.skip("no CUDA toolkit: nvcc is not installed")
    program = kcoral.Program()
    kernel_module = program.upload(kind="module", source=CUDA_SOURCE, language="cuda")
    kernel = program.get_function(module=kernel_module, name="scale")
    harness = program.upload(kind="module", source=HARNESS)
    build = program.get_function(module=harness, name="build", cpu_only=True)
    describe = program.get_function(module=harness, name="describe")
    built = program.run(fn=build, args=[kernel, nvcc, ""])
    program.return_(key="library", value=program.run(fn=describe, args=[built]))
    with kcoral.Client(kcoral_server.url) as client:
        result = client.execute(program, timeout_seconds=300)
    assert result.status == "COMPLETED", result.error
    assert result.results["library"] == {"elf": True, "exports_launch": True}


def test_the_cuda_source_compiles_for_the_h200_arch() -> None:
    nvcc = nvcc_path()
    if nvcc is None:
        pytest.skip("no CUDA toolkit: nvcc is not installed")
    done = subprocess.run(
        [nvcc, "-arch=sm_90a", "--ptx", "-x", "cu", "-", "-o", "-"],
        input=CUDA_SOURCE,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert ".entry" in done.stdout and "scale_kernel" in done.stdout
