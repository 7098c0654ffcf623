"""GPU test folder: ``gpu``-marked tests need CUDA and are skipped cleanly without it.

Also builds, once per session, a small CPU shared object exporting TVM-FFI functions
(with ``tvm_ffi.cpp.build_inline`` and the system C++ compiler) for the library tests.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

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


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    marked = [
        item
        for item in items
        if item.get_closest_marker("gpu") is not None and here in Path(item.path).parents
    ]
    if not marked or _cuda_available():  # torch is imported only when it matters
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is false)")
    for item in marked:
        item.add_marker(skip)


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
