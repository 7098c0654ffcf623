"""The twelve wire dtypes of PROTOCOL.md §11 and their NumPy equivalents."""

from __future__ import annotations

import sys
from functools import cache
from math import prod
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

#: dtype name -> itemsize in bytes, in the order of PROTOCOL.md §11.
ITEMSIZE: dict[str, int] = {
    "bool": 1,
    "uint8": 1,
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "float16": 2,
    "float32": 4,
    "float64": 8,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}

DTYPES: tuple[str, ...] = tuple(ITEMSIZE)

#: NumPy 2's limit on an array's dimensions
MAX_DIMENSIONS = 64

_ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def is_dtype(name: object) -> bool:
    """True when ``name`` is one of the twelve protocol dtype names."""
    return isinstance(name, str) and name in ITEMSIZE


def numpy_can_hold(shape: list[int] | tuple[int, ...], itemsize: int) -> bool:
    """True when NumPy can make an array of ``shape`` and ``itemsize``: at most 64 dimensions,
    and the size without its zero dimensions, in bytes, an ``intp`` (NumPy refuses a zero-size
    shape such as ``[2**62, 0, 2**62]`` too). The client decodes only such tensors (CLIENT_API
    §10), so the server encodes only such tensors (PROTOCOL §7.5)."""
    if len(shape) > MAX_DIMENSIONS:
        return False
    most = sys.maxsize  # NumPy's intp is the C ssize_t, as Python's own sizes
    size = itemsize
    for dimension in shape:
        size *= max(dimension, 1)
        if dimension > most or size > most:
            return False
    return True


def byte_length(dtype: str, shape: tuple[int, ...] | list[int]) -> int:
    """Exact byte length of a C-contiguous tensor of ``dtype`` and ``shape``."""
    return prod(shape) * ITEMSIZE[dtype]


@cache
def numpy_dtype(name: str) -> np.dtype:
    """Little-endian NumPy dtype for a protocol dtype name (``ml_dtypes`` for the exotic ones)."""
    import numpy as np

    if name in _ML_DTYPES:
        import ml_dtypes

        exotic: np.dtype = np.dtype(getattr(ml_dtypes, name))
        return exotic
    if name not in ITEMSIZE:
        raise ValueError(f"unknown dtype {name!r}")
    return np.dtype(name).newbyteorder("<") if ITEMSIZE[name] > 1 else np.dtype(name)


def dtype_name_of_numpy(dtype: np.dtype) -> str | None:
    """Protocol name of a NumPy dtype, or None when it has none (complex, strings, ...)."""
    name = dtype.name
    return name if name in ITEMSIZE else None


def torch_tensor_problem(tensor: Any) -> str | None:
    """Why the torch ``tensor`` has no bytes to travel, as the end of a sentence that begins
    "cannot send a tensor", or None. torch's own words were no help: a sparse one failed
    with 'unsupported memory format option Contiguous', a nested one with 'Internal error:
    NestedTensorImpl doesn't support sizes. Please file an issue.'"""
    if tensor.is_nested:
        return "that is nested (it has no single shape; tensor.unbind() gives its tensors)"
    if str(tensor.layout) != "torch.strided":
        return f"of layout {tensor.layout} (tensor.to_dense() makes it dense)"
    if tensor.device.type == "meta":
        return "on the meta device (it holds no data)"
    return None


def torch_byte_view(tensor: Any, uint8: Any) -> Any:
    """The C-order bytes of the CPU torch ``tensor`` as a flat tensor of dtype ``uint8``
    (``torch.uint8``: torch is imported by the caller only), a view where torch allows one.

    ``contiguous()`` keeps a tensor of at most one element as it is, whatever its stride
    (``x[0:1, 2]`` of a 4x4 matrix has stride 4, so has ``x[:0, 1]``), and a byte view of a
    wider dtype refuses a last stride other than 1: such a tensor failed its upload with
    torch's RuntimeError and its return as ``serialization``. A negative view
    (``.conj().imag`` of a complex tensor) refused the byte view too; its signs are
    resolved first."""
    flat = tensor.resolve_neg().contiguous().reshape(-1)
    if flat.numel() <= 1:
        flat = flat.as_strided((flat.numel(),), (1,))  # same element, same storage offset
    return flat.view(uint8)
