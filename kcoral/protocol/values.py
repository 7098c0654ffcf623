"""Value encoding for ``return`` results (PROTOCOL.md §7.5, EXTENSIONS.md §2), server side.

``encode_value`` turns a Python value into a result node plus the binary parts it references,
numbered ``return:<i>`` depth-first. Tensors come from torch (only when the worker already
imported it; detected through ``sys.modules``), NumPy or any ``__dlpack__`` object.

Parts may share memory with the value (a contiguous CPU tensor, a ``bytearray``): callers
write them out before running more uploaded code, which is when a ``return`` snapshots.

Also here: the pure shape rules of nodes that the client's decoder shares (``NODE_FIELDS``,
``part_name``/``part_index``, ``folder_manifest_problem``).
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from itertools import pairwise
from typing import Any

from kcoral.protocol.dtypes import (
    ITEMSIZE,
    MAX_DIMENSIONS,
    numpy_can_hold,
    torch_byte_view,
    torch_tensor_problem,
)
from kcoral.protocol.errors import ValidationError
from kcoral.protocol.paths import normalize_workspace_path

Parts = list[bytes | memoryview]
#: One value node of PROTOCOL §7.5 as its decoded JSON object.
ValueNode = dict[str, Any]

#: node type -> its exact field set (§7.5).
NODE_FIELDS: dict[str, frozenset[str]] = {
    "null": frozenset({"type"}),
    "boolean": frozenset({"type", "value"}),
    "integer": frozenset({"type", "value"}),
    "number": frozenset({"type", "value"}),
    "string": frozenset({"type", "value"}),
    "array": frozenset({"type", "value"}),
    "object": frozenset({"type", "value"}),
    "bytes": frozenset({"type", "part", "sha256"}),
    "tensor": frozenset({"type", "dtype", "shape", "part", "sha256"}),
    "file": frozenset({"type", "size", "part", "sha256"}),
    "folder": frozenset({"type", "files", "directories"}),
}
BINARY_NODE_TYPES = frozenset({"bytes", "tensor", "file"})
PART_PREFIX = "return:"
_ML_FLOAT_NAMES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")
#: JSON integers longer than this are refused (PROTOCOL §3.2, Python's int_max_str_digits);
#: the worker's own JSON encoding failed on one, a FAILED kind ``engine``.
MAX_INTEGER_DIGITS = 4300
_INTEGER_BOUND = 10**MAX_INTEGER_DIGITS


class ValueEncodingError(Exception):
    """A return value that cannot be encoded (instruction error kind ``serialization``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# ------------------------------------------------------------------- shared shape rules


def part_name(index: int) -> str:
    """``return:<index>`` with a canonical decimal."""
    return f"{PART_PREFIX}{index}"


def part_index(name: object) -> int | None:
    """The index of a canonical ``return:<i>`` name (no sign, no leading zeros), else None."""
    if not isinstance(name, str) or not name.startswith(PART_PREFIX):
        return None
    digits = name[len(PART_PREFIX) :]
    if not digits.isascii() or not digits.isdigit() or (len(digits) > 1 and digits[0] == "0"):
        return None
    return int(digits)


def folder_directories(files: Iterable[str], empty_directories: Iterable[str] = ()) -> list[str]:
    """Sorted directory list of a folder node: every ancestor of every file, plus empty dirs."""
    directories: set[str] = set()
    for path in [*files, *(f"{d}/" for d in empty_directories)]:
        parts = path.split("/")
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            if prefix:
                directories.add(prefix)
    return sorted(directories)


def folder_manifest_problem(files: list[str], directories: list[str]) -> str | None:
    """What is wrong with a folder manifest (§7.5), or None when it is valid.

    Rules: canonical normalized paths, each list sorted and duplicate-free, no path both a
    file and a directory, every entry's parent directory listed.
    """
    for kind, paths in (("file", files), ("directory", directories)):
        for path in paths:
            try:
                canonical = normalize_workspace_path(path)
            except ValidationError as exc:
                return f"invalid {kind} path: {exc}"
            if canonical != path:
                return f"{kind} path {path!r} is not normalized"
        if any(a >= b for a, b in pairwise(paths)):
            return f"{kind} paths are not sorted and unique"
    listed = set(directories)
    for path in files:
        if path in listed:
            return f"{path!r} is both a file and a directory"
    for path in [*files, *directories]:
        parent = path.rpartition("/")[0]
        if parent and parent not in listed:
            return f"parent directory of {path!r} is not listed"
    return None


# ----------------------------------------------------------------------------- encoding


def _sha256(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def _binary_node(
    fields: dict[str, Any], data: bytes | memoryview, index: int, hashed: bool = True
) -> ValueNode:
    # Unhashed nodes get their digest later (``fill_part_hashes``), from the pass that also
    # writes the part out.
    return {**fields, "part": part_name(index), "sha256": _sha256(data) if hashed else ""}


def _check_text(value: str, what: str) -> None:
    # A lone surrogate cannot be written as UTF-8 JSON; fail the return, not the response.
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueEncodingError(f"{what} is not valid Unicode text") from None


#: Counts a binary part of so many bytes, described as a noun, before it is made.
Take = Callable[[int, str], None]


def _unbounded(_size: int, _what: str) -> None:
    pass


class _Encoder:
    def __init__(
        self, first_part_index: int, hash_parts: bool = True, part_budget: int | None = None
    ) -> None:
        self.left = part_budget
        self.parts: Parts = []
        self.first = first_part_index
        self.hash_parts = hash_parts
        self.active: set[int] = set()  # ids of containers on the current path (cycles)
        self.numpy = sys.modules.get("numpy")
        self.torch = sys.modules.get("torch")

    def take(self, size: int, what: str) -> None:
        """Count a part of ``size`` bytes against the budget before it is made: a view of a
        few bytes (``np.broadcast_to``, ``torch.expand``) can be gigabytes as a part."""
        if self.left is None:
            return
        if size > self.left:
            # the sizes and the flag, as a file return's and the 500 response_too_large say
            raise ValueEncodingError(
                f"return would exceed the response size limit: {what} of {size} bytes, "
                f"{self.left} bytes left (max_response_bytes; kcoral server "
                "--max-response-bytes)"
            )
        self.left -= size

    def add_part(self, fields: dict[str, Any], data: bytes | memoryview) -> ValueNode:
        node = _binary_node(fields, data, self.first + len(self.parts), self.hash_parts)
        self.parts.append(data)
        return node

    def encode(self, value: object) -> ValueNode:
        np = self.numpy
        if value is None:
            return {"type": "null"}
        if isinstance(value, bool) or (np is not None and isinstance(value, np.bool_)):
            return {"type": "boolean", "value": bool(value)}
        if isinstance(value, int) or (np is not None and isinstance(value, np.integer)):
            integer = int(value)
            if not -_INTEGER_BOUND < integer < _INTEGER_BOUND:
                raise ValueEncodingError(
                    f"cannot encode an integer of more than {MAX_INTEGER_DIGITS} digits"
                )
            return {"type": "integer", "value": integer}
        if isinstance(value, float) or (np is not None and _is_numpy_float_scalar(np, value)):
            number = float(value)  # type: ignore[arg-type]
            if not math.isfinite(number):
                raise ValueEncodingError(f"cannot encode non-finite number {number}")
            return {"type": "number", "value": number}
        if isinstance(value, str):
            _check_text(value, "string")
            return {"type": "string", "value": str(value)}
        if isinstance(value, (list, tuple)):
            with _Visit(self, value):
                return {"type": "array", "value": [self.encode(item) for item in value]}
        if isinstance(value, dict):
            with _Visit(self, value):
                encoded: dict[str, ValueNode] = {}
                for key, item in value.items():
                    if not isinstance(key, str):
                        raise ValueEncodingError(
                            f"cannot encode dict key of type {type(key).__name__!r}; "
                            "keys must be str"
                        )
                    _check_text(key, "dict key")
                    encoded[key] = self.encode(item)
                return {"type": "object", "value": encoded}
        if isinstance(value, (bytes, bytearray, memoryview)):
            self.take(memoryview(value).nbytes, "bytes")
            return self.add_part({"type": "bytes"}, _bytes_of(value))
        if self.torch is not None and isinstance(value, self.torch.Tensor):
            return self.tensor(*_torch_tensor(self.torch, value, self.take))
        if np is not None and isinstance(value, np.ndarray):
            return self.tensor(*_numpy_tensor(np, value, self.take))
        if hasattr(value, "__dlpack__") and not isinstance(value, type):
            return self.tensor(*self.dlpack(value))
        raise ValueEncodingError(f"cannot encode value of type {type(value).__name__!r}")

    def tensor(self, dtype: str, shape: list[int], data: memoryview) -> ValueNode:
        return self.add_part({"type": "tensor", "dtype": dtype, "shape": shape}, data)

    def dlpack(self, value: object) -> tuple[str, list[int], memoryview]:
        import numpy as np

        try:
            # any object with __dlpack__ (checked by the caller); NumPy raises for the rest
            array = np.from_dlpack(value)  # type: ignore[arg-type]
        except Exception as exc:
            # NumPy refuses bfloat16/float8 and device memory; torch takes both.
            torch = self.torch or sys.modules.get("torch")
            if torch is None:
                raise ValueEncodingError(
                    f"cannot encode {type(value).__name__!r} through DLPack: {exc}"
                ) from None
            try:
                tensor = torch.from_dlpack(value)
            except Exception as torch_exc:
                raise ValueEncodingError(
                    f"cannot encode {type(value).__name__!r} through DLPack: {torch_exc}"
                ) from None
            return _torch_tensor(torch, tensor, self.take)
        return _numpy_tensor(np, array, self.take)


class _Visit:
    """Marks a container as being encoded, so meeting it again below is a cycle."""

    def __init__(self, encoder: _Encoder, container: object) -> None:
        self.encoder = encoder
        self.key = id(container)

    def __enter__(self) -> None:
        if self.key in self.encoder.active:
            raise ValueEncodingError("cannot encode a self-referencing container")
        self.encoder.active.add(self.key)

    def __exit__(self, *exc: object) -> None:
        self.encoder.active.discard(self.key)


def _is_numpy_float_scalar(np: Any, value: object) -> bool:
    if isinstance(value, np.floating):
        return True
    # ml_dtypes scalars (bfloat16, float8_*) are np.generic but not np.floating.
    return isinstance(value, np.generic) and value.dtype.name in _ML_FLOAT_NAMES


def _bytes_of(value: bytes | bytearray | memoryview) -> bytes | memoryview:
    if isinstance(value, bytes):
        return value
    view = memoryview(value)
    if view.c_contiguous:
        return view.cast("B") if view.format != "B" or view.ndim != 1 else view
    return view.tobytes(order="C")


def _numpy_tensor(
    np: Any, array: Any, take: Take = _unbounded
) -> tuple[str, list[int], memoryview]:
    dtype = array.dtype
    name = dtype.name
    if name not in ITEMSIZE:
        raise ValueEncodingError(f"cannot encode an array of dtype {str(dtype)!r}")
    shape = [int(dim) for dim in array.shape]
    take(math.prod(shape) * ITEMSIZE[name], "a tensor")
    if dtype.byteorder == ">" or (dtype.byteorder == "=" and sys.byteorder == "big"):
        array = array.astype(dtype.newbyteorder("<"))
    # reshape(-1) is C-order (copies only when needed) and keeps 0-d arrays working;
    # viewing as uint8 gives a plain byte buffer even for ml_dtypes.
    flat = np.ascontiguousarray(array.reshape(-1))
    return name, shape, memoryview(flat.view(np.uint8))


def _torch_tensor(
    torch: Any, tensor: Any, take: Take = _unbounded
) -> tuple[str, list[int], memoryview]:
    try:
        name = str(tensor.dtype).removeprefix("torch.")
        if name not in ITEMSIZE:
            raise ValueEncodingError(f"cannot encode a tensor of dtype {str(tensor.dtype)!r}")
        problem = torch_tensor_problem(tensor)
        if problem is not None:
            raise ValueEncodingError(f"cannot encode a tensor {problem}")
        shape = [int(dim) for dim in tensor.shape]
        if not numpy_can_hold(shape, ITEMSIZE[name]):
            # torch makes such tensors (an empty one of 100 dimensions); the client refused
            # the whole answer for one (CLIENT_API §10 point 10)
            raise ValueEncodingError(
                f"cannot encode a tensor of shape {shape!r:.200}: a client's NumPy holds at "
                f"most {MAX_DIMENSIONS} dimensions and a size, zero dimensions left out, "
                "below 2**63 bytes"
            )
        take(math.prod(shape) * ITEMSIZE[name], "a tensor")  # before the copy to the host
        host = tensor.detach()
        if host.device.type != "cpu":
            host = host.cpu()
        # a uint8 view reads every dtype (bfloat16, float8) the same way
        return name, shape, memoryview(torch_byte_view(host, torch.uint8).numpy())
    except ValueEncodingError:
        raise
    except Exception as exc:
        raise ValueEncodingError(f"cannot encode tensor: {type(exc).__name__}: {exc}") from None


def encode_value(
    value: object,
    first_part_index: int,
    *,
    hash_parts: bool = True,
    part_budget: int | None = None,
) -> tuple[ValueNode, Parts]:
    """Encode a return value; parts are numbered from ``return:<first_part_index>``.

    Raises ``ValueEncodingError`` for values §7.5 cannot carry (kind ``serialization``),
    and for one whose parts would take more than ``part_budget`` bytes (None: no bound),
    before they are made. With ``hash_parts=False`` binary nodes carry an empty ``sha256``
    that the caller must set with ``fill_part_hashes``.
    """
    encoder = _Encoder(first_part_index, hash_parts, part_budget)
    try:
        node = encoder.encode(value)
    except RecursionError:
        raise ValueEncodingError("cannot encode a value nested this deeply") from None
    return node, encoder.parts


def file_node(
    data: bytes | bytearray | memoryview, part_index: int, *, hash_parts: bool = True
) -> tuple[ValueNode, bytes | memoryview]:
    """Node and part for a file return of ``data`` (``hash_parts`` as in ``encode_value``)."""
    content = _bytes_of(data)
    size = len(content) if isinstance(content, bytes) else content.nbytes
    node = _binary_node({"type": "file", "size": size}, content, part_index, hash_parts)
    return node, content


def fill_part_hashes(node: ValueNode, first_part_index: int, digests: Sequence[str]) -> None:
    """Set the ``sha256`` of every binary node under ``node`` from ``digests``, which are
    in part order starting at ``return:<first_part_index>``."""
    stack = [node]
    while stack:
        item = stack.pop()
        kind = item.get("type")
        if kind in BINARY_NODE_TYPES:
            index = part_index(item.get("part"))
            if index is None or not 0 <= index - first_part_index < len(digests):
                raise ValueError(f"node part {item.get('part')!r} has no digest")
            item["sha256"] = digests[index - first_part_index]
        elif kind in ("array", "object"):
            value = item["value"]
            stack.extend(value.values() if kind == "object" else value)
        elif kind == "folder":
            stack.extend(item["files"].values())


def folder_node(
    files: list[tuple[str, bytes | bytearray | memoryview]],
    directories: list[str],
    first_part_index: int,
) -> tuple[ValueNode, Parts]:
    """Node and parts for a folder return.

    ``files`` are (normalized relative path, content); ``directories`` may list only the empty
    ones, ancestors are added. Files are numbered depth-first in sorted path order.
    """
    ordered = sorted(files, key=lambda item: item[0])
    paths = [path for path, _ in ordered]
    all_directories = folder_directories(paths, directories)
    problem = folder_manifest_problem(paths, all_directories)
    if problem is not None:
        raise ValueEncodingError(f"invalid folder: {problem}")
    nodes: dict[str, ValueNode] = {}
    parts: Parts = []
    for offset, (path, data) in enumerate(ordered):
        node, part = file_node(data, first_part_index + offset)
        nodes[path] = node
        parts.append(part)
    return {"type": "folder", "files": nodes, "directories": all_directories}, parts
