"""Tensor uploads: wire bytes -> torch tensor (or a read-only NumPy array without torch)."""

from __future__ import annotations

import importlib
import sys
from typing import Any

from kcoral.protocol.dtypes import ITEMSIZE, byte_length, numpy_dtype
from kcoral_server.worker.failures import InstructionFailure

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
        raise InstructionFailure("runtime", f"malformed tensor: {exc}") from None
    return tensor


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
