"""The twelve wire dtypes of PROTOCOL.md §11 and their NumPy equivalents."""

from __future__ import annotations

from functools import cache
from math import prod
from typing import TYPE_CHECKING

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

_ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def is_dtype(name: object) -> bool:
    """True when ``name`` is one of the twelve protocol dtype names."""
    return isinstance(name, str) and name in ITEMSIZE


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
