"""Device runtimes of a worker: ``cpu``, ``gpu`` (CUDA via torch) and ``fake-gpu``.

A runtime knows how to start (target, versions, device UUID), how to materialize tensors
(the tensor uploads at the end: wire bytes -> torch tensor, or NumPy without torch),
and how to drain and check the device. The engine owns instruction semantics and leasing;
``uses_lease`` tells it whether to lease at all.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from importlib.metadata import files as metadata_files
from typing import Any

from kcoral.protocol.dtypes import ITEMSIZE, byte_length, numpy_dtype
from kcoral_server.processes.ipc import Configure
from kcoral_server.processes.rank_variables import is_rank_variable
from kcoral_server.worker.cupti_guard import cupti_missing_reason
from kcoral_server.worker.failures import InstructionFailure
from kcoral_server.worker.leasing import Lease

# versions key -> (distribution names to ask, module to import as a last resort)
_GPU_TOOLCHAIN = {
    "tvm": (("apache-tvm", "tvm"), "tvm"),
    "tvm_ffi": (("apache-tvm-ffi", "tvm-ffi", "tvm_ffi"), "tvm_ffi"),
    "triton": (("triton", "pytorch-triton"), "triton"),
    "cutlass": (("nvidia-cutlass-dsl",), None),
    "flashinfer": (("flashinfer-python",), None),
    # the CUPTI clock and the cpu_only watch (EXTENSIONS §1 lists it among the optional pieces)
    "cupti": (("cupti-python",), None),
}


GPU_EXTRA = "pip install 'kcoral[gpu]'"
LIBRARY_NEEDS_TVM_FFI = (
    f"library uploads need apache-tvm-ffi, which this worker cannot import ({GPU_EXTRA})"
)


@functools.cache
def installed_version(*distributions: str) -> str | None:
    """Version of the first installed distribution, without importing it.

    Asked once per process: each lookup scans ``sys.path`` (~5 ms in a freshly forked
    worker, where it also copies the pages it touches), and a fork server asks before it
    forks (``remember_installed_versions``), so its workers report what was installed when
    it started, as they run the torch it preloaded then."""
    for name in distributions:
        with contextlib.suppress(PackageNotFoundError, ValueError):
            return version(name)
    return None


def remember_installed_versions() -> None:
    """Look up every version a worker reports (``installed_version``) in this process,
    so that the processes forked from it inherit the answers."""
    installed_version("torch")
    for distributions, _module in _GPU_TOOLCHAIN.values():
        installed_version(*distributions)


@dataclass
class ReadyReport:
    """What ``WorkerReady`` reports."""

    target: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    device_uuid: str | None = None


@dataclass(frozen=True)
class CudaFault:
    """A CUDA error found while draining; ``sticky`` means the context is unusable."""

    message: str
    sticky: bool


class CpuRuntime:
    device = "cpu"
    uses_lease = False
    non_module_function_kind = "unavailable"
    library_unavailable = "library uploads require a GPU worker"

    def __init__(self, configure: Configure) -> None:
        self.configure = configure

    def start(self, lease: Lease) -> ReadyReport:
        versions: dict[str, str] = {}
        for key, dists in (("tvm_ffi", _GPU_TOOLCHAIN["tvm_ffi"][0]), ("torch", ("torch",))):
            found = installed_version(*dists)
            if found is not None:
                versions[key] = found
        return ReadyReport(target={}, versions=versions)

    def tensor(self, data: memoryview, dtype: str, shape: tuple[int, ...]) -> Any:
        return host_tensor(data, dtype, shape)

    def drain(self) -> CudaFault | None:
        return None

    def check_context(self) -> CudaFault | None:
        return None

    def after_program(self) -> None:
        pass

    def cpu_only_unavailable(self) -> str | None:
        return None  # the cpu_only watch is a no-op off the GPU


class FakeGpuRuntime(CpuRuntime):
    """Leases like a GPU worker, computes like a CPU worker (tests of lease behaviour)."""

    device = "fake-gpu"
    uses_lease = True
    non_module_function_kind = "runtime"
    library_unavailable = LIBRARY_NEEDS_TVM_FFI

    def start(self, lease: Lease) -> ReadyReport:
        identity = super().start(lease)
        lease.acquire()  # "CUDA initialization" happens under the lease, as on a real GPU
        lease.release()
        identity.target = {"arch": "sm_90a"}
        uuids = self.configure.gpu_uuids
        identity.device_uuid = uuids[0] if uuids else None
        return identity


class GpuRuntime:
    device = "gpu"
    uses_lease = True
    non_module_function_kind = "runtime"
    library_unavailable = LIBRARY_NEEDS_TVM_FFI

    def __init__(self, configure: Configure) -> None:
        self.configure = configure
        self.torch: Any = None

    def start(self, lease: Lease) -> ReadyReport:
        self._prepare_environment()
        import torch  # host-only preparation, off the lease

        self.torch = torch
        # tvm_ffi and cupti-python are optional (kcoral[gpu]): library uploads, the cpu_only
        # watch and the CUPTI benchmark clock say what is missing when they are used.
        _preload_cute_dsl_runtime()
        lease.acquire()
        try:
            identity = self._initialize_cuda()
            fault = self.drain()
            if fault is not None:
                raise RuntimeError(f"CUDA initialization failed: {fault.message}")
        finally:
            lease.release()
        return identity

    def _prepare_environment(self) -> None:
        uuids, ids = self.configure.gpu_uuids, self.configure.gpu_ids
        if uuids or ids:
            visible = ",".join(uuids) if uuids else ",".join(str(i) for i in ids)
            os.environ["CUDA_VISIBLE_DEVICES"] = visible
        for name in list(os.environ):
            if is_rank_variable(name):  # SERVER §6 step 2
                del os.environ[name]

    def _initialize_cuda(self) -> ReadyReport:
        torch = self.torch
        if not torch.cuda.is_available():
            raise RuntimeError("torch reports no usable CUDA device")
        torch.cuda.init()
        torch.cuda.set_device(0)
        props = torch.cuda.get_device_properties(0)
        major, minor = props.major, props.minor
        suffix = "a" if major >= 9 else ""
        # lets later TVM-FFI compiles skip the driver query (SERVER §6 step 4)
        os.environ.setdefault("TVM_FFI_CUDA_ARCH_LIST", f"{major}.{minor}{suffix}")
        torch.zeros(1, device="cuda")  # creates the context now, under the lease
        versions = {"torch": str(torch.__version__)}
        if torch.version.cuda:
            versions["cuda"] = str(torch.version.cuda)
        for key, (dists, module) in _GPU_TOOLCHAIN.items():
            found = installed_version(*dists)
            if found is None and module is not None and importlib.util.find_spec(module):
                with contextlib.suppress(Exception):
                    found = str(getattr(importlib.import_module(module), "__version__", ""))
            if found:
                versions[key] = found
        uuid = getattr(props, "uuid", None)
        device_uuid = None
        if uuid is not None:
            device_uuid = str(uuid)
            if not device_uuid.startswith(("GPU-", "MIG-")):
                device_uuid = f"GPU-{device_uuid}"
        return ReadyReport({"arch": f"sm_{major}{minor}{suffix}"}, versions, device_uuid)

    def tensor(self, data: memoryview, dtype: str, shape: tuple[int, ...]) -> Any:
        return torch_tensor(self.torch, data, dtype, shape, device="cuda")

    def _synchronize_all(self) -> None:
        for index in range(self.torch.cuda.device_count()):
            self.torch.cuda.synchronize(index)

    def drain(self) -> CudaFault | None:
        """Synchronize every device and read (thereby clearing) a pending CUDA error."""
        try:
            self._synchronize_all()
        except Exception as exc:  # torch raises RuntimeError/AcceleratorError for CUDA faults
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            sticky = self.check_context() is not None
            return CudaFault(message, sticky)
        return None

    def check_context(self) -> CudaFault | None:
        """Is the context still usable? A sticky error fails every later CUDA call."""
        try:
            self._synchronize_all()
            probe = self.torch.ones(1, device="cuda")
            probe.add_(1)
            self._synchronize_all()
        except Exception as exc:
            return CudaFault(str(exc).strip().splitlines()[0] if str(exc) else repr(exc), True)
        return None

    def after_program(self) -> None:
        with contextlib.suppress(Exception):
            self.torch.cuda.empty_cache()

    def cpu_only_unavailable(self) -> str | None:
        return cupti_missing_reason()


def _preload_cute_dsl_runtime() -> None:
    """Make ``libcute_dsl_runtime.so`` globally visible for CuTe DSL exports (§5.1)."""
    try:
        files = metadata_files("nvidia-cutlass-dsl") or []
    except PackageNotFoundError:
        return
    for entry in files:
        if entry.name == "libcute_dsl_runtime.so":
            with contextlib.suppress(OSError):
                ctypes.CDLL(str(entry.locate()), mode=ctypes.RTLD_GLOBAL)
            return


def make_runtime(configure: Configure) -> CpuRuntime | GpuRuntime:
    if configure.device == "cpu":
        return CpuRuntime(configure)
    if configure.device == "fake-gpu":
        return FakeGpuRuntime(configure)
    if configure.device == "gpu":
        return GpuRuntime(configure)
    raise ValueError(f"unknown device mode {configure.device!r}")


# ---------------------------------------------------------------------- tensor uploads
# Wire bytes -> torch tensor (or a read-only NumPy array without torch).

_torch_missing = False


def import_torch() -> Any | None:
    """torch when it can be imported (imported lazily, once), else None."""
    global _torch_missing
    if "torch" in sys.modules:
        return sys.modules["torch"]
    if _torch_missing:
        return None
    try:
        return importlib.import_module("torch")
    except ImportError:
        _torch_missing = True
        return None


def _check_length(data: memoryview, dtype: str, shape: tuple[int, ...]) -> None:
    if dtype not in ITEMSIZE:
        raise InstructionFailure("runtime", f"malformed tensor: unknown dtype {dtype!r}")
    expected = byte_length(dtype, shape)
    if len(data) != expected:
        raise InstructionFailure(
            "runtime",
            f"malformed tensor: {dtype}{list(shape)} needs {expected} bytes, got {len(data)}",
        )


def private_copy(data: memoryview) -> Any:
    """A writable NumPy ``uint8`` copy of ``data``. NumPy asks the kernel for transparent
    huge pages for large arrays (``madvise``), which a ``bytearray`` does not get: a 64 MiB
    copy into fresh memory measured ~6 ms this way against ~33 ms (4 KiB page faults)."""
    import numpy as np

    copy = np.empty(len(data), dtype=np.uint8)
    copy[:] = np.frombuffer(data, dtype=np.uint8)
    return copy


def torch_tensor(
    torch: Any, data: memoryview, dtype: str, shape: tuple[int, ...], device: str | None = None
) -> Any:
    """A torch tensor owning a private copy of ``data`` (blob memory is read-only)."""
    _check_length(data, dtype, shape)
    try:
        torch_dtype = getattr(torch, dtype)
        if len(data) == 0:
            tensor = torch.empty(shape, dtype=torch_dtype)
        else:
            raw = torch.from_numpy(private_copy(data))
            tensor = raw.view(torch_dtype).reshape(shape)
        if device is not None:
            tensor = tensor.to(device)
    except (RuntimeError, TypeError, ValueError, AttributeError) as exc:
        raise InstructionFailure("runtime", f"malformed tensor: {first_line(exc)}") from None
    return tensor


def first_line(exc: BaseException) -> str:
    """An exception's message without what follows its first line: torch's C++ errors can
    carry their whole C++ backtrace (dozens of lines) after it (conformance audit)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def numpy_array(data: memoryview, dtype: str, shape: tuple[int, ...]) -> Any:
    """A read-only NumPy view of ``data`` (zero copy)."""
    _check_length(data, dtype, shape)
    import numpy as np

    try:
        array = np.frombuffer(data, dtype=numpy_dtype(dtype)).reshape(shape)
    except (ValueError, TypeError) as exc:
        raise InstructionFailure("runtime", f"malformed tensor: {exc}") from None
    array.flags.writeable = False
    return array


def host_tensor(data: memoryview, dtype: str, shape: tuple[int, ...]) -> Any:
    """EXTENSIONS §2: a CPU ``torch.Tensor`` when torch imports, else a read-only array."""
    torch = import_torch()
    if torch is not None:
        return torch_tensor(torch, data, dtype, shape)
    return numpy_array(data, dtype, shape)
