"""Tensor inputs for ``upload(kind="tensor", value=...)`` (CLIENT_API.md §4).

Everything is turned into ``(data, dtype, shape)``: little-endian, C-order bytes copied at
call time, a protocol dtype name and a tuple of ints. torch is never imported here; a torch
tensor is recognised only when the caller already imported torch (``sys.modules``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from kcoral.protocol.dtypes import (
    DTYPES,
    byte_length,
    is_dtype,
    torch_tensor_problem,
)

TensorPayload = tuple[bytes, str, tuple[int, ...]]


def tensor_payload(value: Any, dtype: object = None, shape: object = None) -> TensorPayload:
    """Snapshot ``value`` as ``(bytes, dtype, shape)``; inputs are tried in §4 order.

    ``TypeError`` for unsupported values or a badly typed ``shape``; ``ValueError`` for an
    unknown dtype, a negative dimension, a mismatch with the given ``dtype``/``shape`` or a
    byte length that does not fit.
    """
    wanted_shape = None if shape is None else check_shape(shape)
    if dtype is not None and not is_dtype(dtype):
        raise ValueError(f"unknown tensor dtype {dtype!r}")

    if isinstance(value, (bytes, bytearray, memoryview)):
        if dtype is None or wanted_shape is None:
            raise TypeError("raw bytes tensor values need both dtype= and shape=")
        data = memoryview(value).tobytes()  # C order, copies: a snapshot
        assert isinstance(dtype, str)
        _check_length(data, dtype, wanted_shape)
        return data, dtype, wanted_shape

    data, found_dtype, found_shape = _array_like_payload(value)
    if not is_dtype(found_dtype):
        raise ValueError(not_a_wire_dtype(f"dtype {found_dtype!r}"))
    if dtype is not None and dtype != found_dtype:
        raise ValueError(f"dtype={dtype!r} does not match the value's dtype {found_dtype!r}")
    if wanted_shape is not None and wanted_shape != found_shape:
        raise ValueError(f"shape={list(wanted_shape)} does not match the value's shape")
    _check_length(data, found_dtype, found_shape)
    return data, found_dtype, found_shape


def not_a_wire_dtype(dtype: str) -> str:
    """Why a tensor of ``dtype`` cannot travel; it said only 'not one of the protocol
    dtypes', never which those are."""
    return f"{dtype} is not a wire dtype ({', '.join(DTYPES)})"


def check_shape(shape: object) -> tuple[int, ...]:
    """Validate a shape: a sequence of non-negative ints (bools refused)."""
    if isinstance(shape, (str, bytes, bytearray)) or not isinstance(shape, Sequence):
        raise TypeError(f"shape must be a sequence of ints, not {type(shape).__name__}")
    dims: list[int] = []
    for dim in shape:
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise TypeError(f"shape entries must be ints, not {type(dim).__name__}")
        if dim < 0:
            raise ValueError(f"shape entries must be >= 0, got {dim}")
        dims.append(int(dim))
    return tuple(dims)


def _check_length(data: bytes, dtype: str, shape: tuple[int, ...]) -> None:
    expected = byte_length(dtype, shape)
    if len(data) != expected:
        raise ValueError(
            f"tensor data has {len(data)} bytes; dtype {dtype} and shape {list(shape)} "
            f"need {expected}"
        )


def _array_like_payload(value: Any) -> tuple[bytes, str, tuple[int, ...]]:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return _torch_payload(torch, value)
    if isinstance(value, (np.ndarray, np.generic)):
        return _numpy_payload(np.asarray(value))
    if hasattr(value, "__dlpack__"):
        try:
            array = np.from_dlpack(value)
        except Exception as exc:
            # numpy cannot import every dtype (bfloat16) or device; the duck-typed
            # path below still works for objects that can serialize themselves.
            if not _is_duck_tensor(value):
                raise TypeError(f"cannot convert {type(value).__name__} via DLPack: {exc}") from exc
        else:
            return _numpy_payload(array)
    if _is_duck_tensor(value):
        raw = value.tobytes()
        if not isinstance(raw, (bytes, bytearray, memoryview)):
            raise TypeError(f"{type(value).__name__}.tobytes() did not return bytes")
        return memoryview(raw).tobytes(), str(value.dtype), check_shape(tuple(value.shape))
    raise TypeError(
        f"unsupported tensor value of type {type(value).__name__}; pass bytes with dtype= "
        "and shape=, a numpy array, a torch tensor or a DLPack object"
    )


def _is_duck_tensor(value: Any) -> bool:
    return all(hasattr(value, name) for name in ("dtype", "shape", "tobytes"))


def _numpy_payload(array: np.ndarray) -> tuple[bytes, str, tuple[int, ...]]:
    if array.dtype.byteorder == ">" or (
        array.dtype.byteorder == "=" and sys.byteorder == "big" and array.dtype.itemsize > 1
    ):
        array = array.astype(array.dtype.newbyteorder("<"))
    shape = tuple(int(dim) for dim in array.shape)
    # tobytes() writes any layout out in C order in one copy; ascontiguousarray first made
    # a strided view (a column slice, a transpose) a second whole copy before it
    return array.tobytes(), array.dtype.name, shape


def _torch_payload(torch: Any, tensor: Any) -> tuple[bytes, str, tuple[int, ...]]:
    problem = torch_tensor_problem(tensor)
    if problem is not None:
        raise TypeError(f"cannot send a tensor {problem}")
    name = str(tensor.dtype).removeprefix("torch.")
    if not is_dtype(name):
        raise ValueError(not_a_wire_dtype(f"torch dtype {tensor.dtype}"))
    shape = tuple(int(dim) for dim in tensor.shape)
    # An integer view of the same width (bfloat16 as int16, float8 as uint8: numpy has
    # neither) keeps the tensor's strides, which numpy's tobytes() writes out in C order
    # in one copy; contiguous() first made a strided tensor a second whole copy.
    same_width = _SAME_WIDTH_INTEGER[tensor.element_size()]
    host = tensor.detach().to("cpu").resolve_neg()
    return host.view(getattr(torch, same_width)).numpy().tobytes(), name, shape


#: The integer dtype (a name in torch and numpy) as wide as each wire dtype's item.
_SAME_WIDTH_INTEGER = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}
