"""``GpuRuntime`` starts from the README's install: without ``tvm_ffi`` and ``cupti-python``
(the ``kcoral[gpu]`` extra) a GPU worker starts, and the optional pieces fail where they are
used, naming the extra. Driven with a stand-in for torch (no GPU here); real starts are in
``tests/gpu/test_gpu_server.py``."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
from kcoral_server.processes.ipc import Configure
from kcoral_server.worker import cupti_guard
from kcoral_server.worker import runtime as runtime_module
from kcoral_server.worker.cupti_guard import MISSING_CUPTI, watch_cpu_only
from kcoral_server.worker.failures import InstructionFailure
from kcoral_server.worker.libraries import Libraries
from kcoral_server.worker.runtime import LIBRARY_NEEDS_TVM_FFI, GpuRuntime

UUID = "GPU-8a1b2c3d-0000-1111-2222-333344445555"


class RecordingLease:
    def __init__(self) -> None:
        self.events: list[str] = []

    def acquire(self) -> None:
        self.events.append("acquire")

    def release(self) -> None:
        self.events.append("release")


def fake_torch() -> SimpleNamespace:
    props = SimpleNamespace(major=9, minor=0, uuid=UUID[4:], L2_cache_size=60 * 1024**2)
    cuda = SimpleNamespace(
        is_available=lambda: True,
        init=lambda: None,
        set_device=lambda index: None,
        get_device_properties=lambda index: props,
        device_count=lambda: 1,
        synchronize=lambda index=None: None,
        empty_cache=lambda: None,
    )
    return SimpleNamespace(
        __version__="2.11.0+cu130",
        version=SimpleNamespace(cuda="13.0"),
        cuda=cuda,
        zeros=lambda *a, **k: None,
        ones=lambda *a, **k: SimpleNamespace(add_=lambda v: None),
    )


@pytest.fixture
def without_gpu_extra(monkeypatch) -> None:
    """torch (a stand-in) is there; tvm_ffi and cupti-python are not."""
    monkeypatch.setitem(sys.modules, "torch", fake_torch())
    for name in ("tvm_ffi", "cupti", "cupti.cupti"):
        monkeypatch.setitem(sys.modules, name, None)
    real = runtime_module.installed_version
    missing = {"apache-tvm-ffi", "tvm-ffi", "tvm_ffi", "cupti-python"}
    monkeypatch.setattr(
        runtime_module,
        "installed_version",
        lambda *names: None if set(names) & missing else real(*names),
    )
    monkeypatch.setattr(runtime_module.importlib.util, "find_spec", lambda name: None)
    monkeypatch.delenv("TVM_FFI_CUDA_ARCH_LIST", raising=False)


def configure() -> Configure:
    return Configure(worker_id="gpu0/w0", generation=1, device="gpu", gpu_ids=[0],
                     gpu_uuids=[UUID])  # fmt: skip


def test_a_gpu_worker_starts_without_tvm_ffi_and_cupti_python(without_gpu_extra) -> None:
    lease = RecordingLease()
    identity = GpuRuntime(configure()).start(lease)
    assert identity.target == {"arch": "sm_90a"}
    assert identity.device_uuid == UUID
    assert (identity.versions["torch"], identity.versions["cuda"]) == ("2.11.0+cu130", "13.0")
    assert "tvm_ffi" not in identity.versions and "cupti" not in identity.versions
    assert lease.events == ["acquire", "release"]  # CUDA initialization under the lease


def test_a_gpu_worker_reports_cupti_python_when_it_is_installed(
    without_gpu_extra, monkeypatch
) -> None:
    real = runtime_module.installed_version
    monkeypatch.setattr(
        runtime_module,
        "installed_version",
        lambda *names: "13.0.1" if "cupti-python" in names else real(*names),
    )
    identity = GpuRuntime(configure()).start(RecordingLease())
    assert identity.versions["cupti"] == "13.0.1"
    assert "tvm_ffi" not in identity.versions


def test_a_library_upload_without_tvm_ffi_names_the_gpu_extra(without_gpu_extra) -> None:
    libraries = Libraries(GpuRuntime.library_unavailable)
    with pytest.raises(InstructionFailure) as info:
        libraries.load("ab" * 32, b"\x7fELF")
    assert info.value.kind == "unavailable"
    assert info.value.message == LIBRARY_NEEDS_TVM_FFI
    assert "pip install 'kcoral[gpu]'" in info.value.message


def test_a_cpu_only_run_without_cupti_python_names_the_gpu_extra(without_gpu_extra) -> None:
    assert GpuRuntime(configure()).cpu_only_unavailable() == MISSING_CUPTI
    with pytest.raises(InstructionFailure) as info, watch_cpu_only("gpu"):
        pass
    assert info.value.kind == "unavailable"
    assert "pip install 'kcoral[gpu]'" in info.value.message


def test_a_cupti_whose_library_fails_to_load_makes_cpu_only_runs_unavailable(
    monkeypatch,
) -> None:
    class Broken:
        def __getattr__(self, name):
            raise OSError("libcupti.so.13: version `CUPTI_13.4' not found")

    monkeypatch.setitem(sys.modules, "cupti", SimpleNamespace(cupti=Broken()))
    monkeypatch.setitem(sys.modules, "cupti.cupti", Broken())
    with pytest.raises(InstructionFailure) as info, watch_cpu_only("gpu"):
        pass
    assert info.value.kind == "unavailable"
    assert "CUPTI_13.4" in info.value.message


def test_a_cupti_python_missing_a_dependency_says_so_for_cpu_only_runs(monkeypatch) -> None:
    monkeypatch.delitem(sys.modules, "cupti.cupti", raising=False)
    real_import = cupti_guard.importlib.import_module

    def missing_dependency(name: str, *args):
        if name == "cupti.cupti":
            raise ModuleNotFoundError("No module named 'cuda'", name="cuda")
        return real_import(name, *args)

    monkeypatch.setattr(cupti_guard.importlib, "import_module", missing_dependency)
    with pytest.raises(InstructionFailure) as info, watch_cpu_only("gpu"):
        pass
    assert info.value.kind == "unavailable"
    assert info.value.message == (
        "CUPTI (cupti-python) failed to load: ModuleNotFoundError: No module named 'cuda'"
    )
