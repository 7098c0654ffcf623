"""The client-side program builder (CLIENT_API.md §3, §5).

Every builder call validates everything first and only then commits, so a call that raises
leaves the program unchanged and consumes no generated id. Bytes, arrays and JSON literals
are copied at call time; later mutation of the caller's objects changes nothing here. A
folder's files are hashed at call time and its large ones read again only as a request
sends them (``kcoral.local_folder.FileBlob``): one changed meanwhile fails that request,
never sends other bytes; a small one is sent as it was hashed.
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from kcoral.local_folder import FileBlob, check_utf8_name, hash_folder
from kcoral.protocol.errors import ValidationError
from kcoral.protocol.paths import UploadedPaths, normalize_workspace_path, shown_path
from kcoral.protocol.utf8_text import check_text
from kcoral.tensors import tensor_payload

_UPLOAD_KINDS = ("module", "tensor", "bytes", "library")
_LANGUAGES = ("python", "cuda")
# From this many bytes on, a mutable upload is hashed in a second thread while its snapshot
# is copied (hashlib releases the GIL); below it the thread costs more than it saves.
_PARALLEL_HASH_BYTES = 1 << 20


@dataclass(frozen=True)
class Register:
    """Names a value produced by an instruction, inside one request only."""

    id: str

    def __post_init__(self) -> None:
        if not isinstance(self.id, str):
            raise TypeError(f"Register id must be a str, not {type(self.id).__name__}")


class Program:
    """An ordered list of instructions plus the blobs they reference. Not thread-safe."""

    def __init__(self) -> None:
        self._instructions: list[dict[str, Any]] = []
        self._ids: set[str] = set()
        self._return_keys: set[str] = set()
        self._file_paths = UploadedPaths()
        # insertion order == order of first reference
        self._blobs: dict[str, bytes | FileBlob] = {}
        self._counter = 0

    # -- read access ---------------------------------------------------------------------

    @property
    def instructions(self) -> list[dict[str, Any]]:
        """Shallow copy of the wire instruction list; treat the dicts as read-only."""
        return list(self._instructions)

    @property
    def blobs(self) -> Mapping[str, bytes]:
        """Read-only ``sha256 -> bytes`` of every blob, in order of first reference (a
        folder's file is read when looked up)."""
        return _BlobBytes(self._blobs)

    @property
    def blob_sources(self) -> Mapping[str, bytes | FileBlob]:
        """Read-only ``sha256 -> bytes``, or the ``FileBlob`` whose bytes stay in a local file
        until a request sends them; what a request body is built from."""
        return MappingProxyType(self._blobs)

    def __repr__(self) -> str:
        return f"<Program: {len(self._instructions)} instructions, {len(self._blobs)} blobs>"

    # -- uploads -------------------------------------------------------------------------

    def upload(
        self,
        *,
        id: str | None = None,
        kind: str,
        source: str | None = None,
        language: str = "python",
        value: object = None,
        dtype: str | None = None,
        shape: Sequence[int] | None = None,
    ) -> Register:
        """Upload a module, tensor, bytes or library value and name it."""
        if kind == "file":
            raise ValueError("kind='file' is not accepted here; use upload_file")
        if kind not in _UPLOAD_KINDS:
            raise ValueError(f"unknown upload kind {kind!r}; expected one of {_UPLOAD_KINDS}")
        new_id, counter = self._claim_id(id, "upload")
        instruction: dict[str, Any] = {"op": "upload", "id": new_id, "kind": kind}
        blob: bytes | None = None

        if kind == "module":
            _require_unset(kind, value=value, dtype=dtype, shape=shape)
            if not isinstance(source, str):
                raise TypeError(f"module source must be a str, not {type(source).__name__}")
            check_text(source, "module source")
            if language not in _LANGUAGES:
                raise ValueError(f"unknown module language {language!r}; expected {_LANGUAGES}")
            instruction["source"] = source
            if language == "cuda":
                instruction["language"] = "cuda"
        else:
            _require_unset(kind, source=source)
            if language != "python":
                raise TypeError(f"language= applies to module uploads only, not {kind!r}")
            if kind == "tensor":
                if value is None:
                    raise TypeError("a tensor upload needs value=")
                blob, wire_dtype, wire_shape = tensor_payload(value, dtype, shape)
                instruction["blob"] = _sha256(blob)
                instruction["dtype"] = wire_dtype
                instruction["shape"] = list(wire_shape)
            else:
                _require_unset(kind, dtype=dtype, shape=shape)
                blob, instruction["blob"] = _hashed_snapshot(value, f"{kind} upload value")

        self._commit(instruction, counter, blobs=[] if blob is None else [blob])
        return Register(new_id)

    def upload_file(self, *, blob: object, path: str, id: str | None = None) -> Register:
        """Place ``blob`` at workspace ``path``; the register's value is the normalized path.
        A ``kcoral.local_folder.FileBlob`` stays in its local file until a request sends it."""
        normalized = normalize_workspace_path(path)
        data: bytes | FileBlob
        if isinstance(blob, FileBlob):
            data, digest = blob, blob.sha256
        else:
            data, digest = _hashed_snapshot(blob, "upload_file blob")
        self._check_new_file_paths([normalized])
        new_id, counter = self._claim_id(id, "upload")
        instruction = {
            "op": "upload",
            "id": new_id,
            "kind": "file",
            "path": normalized,
            "blob": digest,
        }
        self._commit(instruction, counter, blobs=[data], file_paths=[normalized])
        return Register(new_id)

    def upload_folder(self, folder: str | os.PathLike[str], *, path: str) -> None:
        """Upload every regular file below local ``folder`` under workspace ``path``
        (``"."``: the workspace itself, its files at the top).

        All or nothing; symlinks, special files, a directory reached twice and files that
        change while read are refused (``ValueError``).
        """
        # "." places the folder's contents at the workspace's top, as a copy into "."
        # would; each file is still one upload with its own path (no protocol change)
        prefix = "" if path in (".", "./") else normalize_workspace_path(path) + "/"

        def check(relative: str, local: str) -> None:
            check_destination(prefix + relative, local)

        # hashed, and only small files kept: the rest are read again as a request sends them
        files = hash_folder(folder, check=check)
        destinations = [(prefix + file.path, file) for file in files]
        destinations.sort(key=lambda item: item[0])
        self._check_new_file_paths([destination for destination, _ in destinations])

        counter = self._counter
        taken = set(self._ids)
        instructions = []
        for destination, file in destinations:
            new_id, counter = _generate_id("upload", counter, taken)
            taken.add(new_id)
            instructions.append(
                {
                    "op": "upload",
                    "id": new_id,
                    "kind": "file",
                    "path": destination,
                    "blob": file.sha256,
                }
            )
        for instruction, (destination, file) in zip(instructions, destinations, strict=True):
            self._commit(instruction, counter, blobs=[file], file_paths=[destination])

    # -- functions and calls -------------------------------------------------------------

    def get_function(
        self,
        *,
        id: str | None = None,
        module: Register | dict[str, str],
        name: str,
        cpu_only: bool = False,
    ) -> Register:
        """Select ``name`` from an uploaded module or library."""
        module_ref = self._reference(module, "module", allow_dict=True)
        if not isinstance(name, str) or not name:
            raise ValueError("get_function name must be a non-empty str")
        check_text(name, "get_function name")
        if not isinstance(cpu_only, bool):
            raise TypeError(f"cpu_only must be a bool, not {type(cpu_only).__name__}")
        new_id, counter = self._claim_id(id, "get_function")
        instruction: dict[str, Any] = {
            "op": "get_function",
            "id": new_id,
            "module": module_ref,
            "name": name,
        }
        if cpu_only:
            instruction["cpu_only"] = True
        self._commit(instruction, counter)
        return Register(new_id)

    def run(
        self, *, id: str | None = None, fn: Register, args: Sequence[object] | None = None
    ) -> Register:
        """Call ``fn(*args)``; top-level Registers and ``{"$ref": id}`` are resolved."""
        if not isinstance(fn, Register):
            raise TypeError(f"fn must be a Register, not {type(fn).__name__}")
        fn_ref = self._reference(fn, "fn", allow_dict=False)
        if args is None:
            args = []
        if not isinstance(args, (list, tuple)):
            raise TypeError(f"args must be a list or tuple, not {type(args).__name__}")
        wire_args = [self._run_argument(arg, index) for index, arg in enumerate(args)]
        new_id, counter = self._claim_id(id, "run")
        instruction: dict[str, Any] = {"op": "run", "id": new_id, "fn": fn_ref}
        if wire_args:
            instruction["args"] = wire_args
        self._commit(instruction, counter)
        return Register(new_id)

    # -- returns -------------------------------------------------------------------------

    def return_(self, *, key: str, value: Register | dict[str, str]) -> None:
        """Return the value of a register under ``key``."""
        self._check_key(key)
        ref = self._reference(value, "value", allow_dict=True)
        self._commit({"op": "return", "key": key, "value": ref}, self._counter, key=key)

    def return_file(self, *, key: str, path: str | Register) -> None:
        """Return a workspace file (a literal path, or a Register holding one)."""
        self._return_path(key, path, "file")

    def return_folder(self, *, key: str, path: str | Register) -> None:
        """Return a workspace folder (a literal path, or a Register holding one)."""
        self._return_path(key, path, "folder")

    # -- internals -----------------------------------------------------------------------

    def _return_path(self, key: str, path: str | Register, kind: str) -> None:
        self._check_key(key)
        if isinstance(path, Register):
            wire_path: str | dict[str, str] = self._reference(path, "path", allow_dict=False)
        else:
            wire_path = normalize_workspace_path(path)
        instruction = {"op": "return", "key": key, "kind": kind, "path": wire_path}
        self._commit(instruction, self._counter, key=key)

    def _claim_id(self, explicit: str | None, op: str) -> tuple[str, int]:
        """The id to use and the counter value after committing (nothing changes yet)."""
        if explicit is None:
            return _generate_id(op, self._counter, self._ids)
        if not isinstance(explicit, str) or not explicit:
            raise ValueError("id must be a non-empty str")
        check_text(explicit, "id")
        if explicit in self._ids:
            raise ValueError(f"id {explicit!r} is already used in this program")
        return explicit, self._counter

    def _check_key(self, key: object) -> None:
        if not isinstance(key, str) or not key:
            raise ValueError("return key must be a non-empty str")
        check_text(key, "return key")
        if key in self._return_keys:
            raise ValueError(f"return key {key!r} is already used in this program")

    def _check_new_file_paths(self, paths: list[str]) -> None:
        conflict = self._file_paths.conflict(paths)
        if conflict is not None:
            first, second = conflict
            if first == second:
                raise ValueError(f"file path {first!r} is uploaded twice")
            raise ValueError(f"file path {first!r} conflicts with {second!r}")

    def _reference(self, value: object, what: str, *, allow_dict: bool) -> dict[str, str]:
        if isinstance(value, Register):
            ref_id = value.id
        elif (
            allow_dict
            and isinstance(value, dict)
            and len(value) == 1
            and isinstance(value.get("$ref"), str)
        ):
            ref_id = value["$ref"]
        else:
            expected = 'a Register or {"$ref": id}' if allow_dict else "a Register"
            raise TypeError(f"{what} must be {expected}, not {type(value).__name__}")
        if ref_id not in self._ids:
            raise ValueError(f"{what} refers to unknown id {ref_id!r}")
        return {"$ref": ref_id}

    def _run_argument(self, arg: Any, index: int) -> Any:
        if isinstance(arg, Register):
            return self._reference(arg, f"args[{index}]", allow_dict=False)
        if isinstance(arg, dict) and len(arg) == 1 and "$ref" in arg:
            target = arg["$ref"]
            if isinstance(target, str) and target:
                return self._reference(arg, f"args[{index}]", allow_dict=True)
        try:
            return copy_literal(arg, set())
        except RecursionError:
            raise ValueError(f"args[{index}] is nested too deeply") from None

    def _commit(
        self,
        instruction: dict[str, Any],
        counter: int,
        *,
        blobs: Sequence[bytes | FileBlob] = (),
        file_paths: Sequence[str] = (),
        key: str | None = None,
    ) -> None:
        self._instructions.append(instruction)
        if "id" in instruction:
            self._ids.add(instruction["id"])
        if key is not None:
            self._return_keys.add(key)
        for data in blobs:
            self._blobs.setdefault(instruction["blob"], data)
        self._file_paths.add(file_paths)
        self._counter = counter


class _BlobBytes(Mapping[str, bytes]):
    """``Program.blobs``: every blob as bytes, a folder's file read (and checked) when
    looked up; nothing is read to list or count them."""

    def __init__(self, blobs: Mapping[str, bytes | FileBlob]) -> None:
        self._blobs = blobs

    def __getitem__(self, digest: str) -> bytes:
        blob = self._blobs[digest]
        return blob if isinstance(blob, bytes) else blob.read()

    def __iter__(self) -> Iterator[str]:
        return iter(self._blobs)

    def __len__(self) -> int:
        return len(self._blobs)


#: Exact types a literal list may hold as they are (immutable; a float if it is finite).
_SCALARS = frozenset({type(None), bool, int, float, str})


def plain_scalars(items: list[Any]) -> bool:
    """Whether ``items`` are JSON scalars a request carries as they are, with no check one
    by one (a list of a million floats took ~0.4 s of those): finite floats, and strs
    without a lone surrogate, which UTF-8 refuses (else the slow path names the item)."""
    kinds = set(map(type, items))
    return (
        kinds <= _SCALARS
        and (float not in kinds or all_finite(items, kinds))
        and (str not in kinds or _utf8_texts(items))
    )


def _utf8_texts(items: list[Any]) -> bool:
    """The strs among ``items`` hold no lone surrogate (UTF-8 refuses each one, joined or
    not, so one encode of them all tells)."""
    try:
        "".join(x for x in items if type(x) is str).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def all_finite(items: list[Any], kinds: set[type]) -> bool:
    """The floats among ``items`` are finite (``map`` over a list of floats only: 4x faster)."""
    if kinds == {float}:
        return all(map(math.isfinite, items))
    return all(math.isfinite(x) for x in items if type(x) is float)


def copy_literal(value: Any, active: set[int]) -> Any:
    """Deep-copy a JSON literal, refusing non-JSON types, non-finite floats and cycles.

    ``active`` holds the ids of the containers on the current path (cycle detection; a
    container shared by two branches is fine and copied twice).
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"non-finite float {value!r} cannot be sent as JSON")
        return float(value)
    if isinstance(value, str):
        check_text(value, "a str argument")
        return str(value)
    if isinstance(value, Register):
        raise TypeError("a Register nested inside a container is not resolved; pass it top-level")
    if type(value) is list and plain_scalars(value):
        return list(value)  # nothing deeper to copy: a million items took ~0.4 s one by one
    if isinstance(value, (list, tuple, dict)):
        if id(value) in active:
            raise ValueError("literal arguments must not contain cycles")
        active.add(id(value))
        try:
            if isinstance(value, dict):
                copied: dict[str, Any] = {}
                for key, item in value.items():
                    if not isinstance(key, str):
                        raise TypeError(f"object keys must be str, not {type(key).__name__}")
                    check_text(key, "an object key")
                    copied[str(key)] = copy_literal(item, active)
                return copied
            return [copy_literal(item, active) for item in value]
        finally:
            active.discard(id(value))
    raise TypeError(f"{type(value).__name__} is not a JSON literal")


def _generate_id(op: str, counter: int, taken: set[str]) -> tuple[str, int]:
    while True:
        candidate = f"{op}_{counter}"
        counter += 1
        if candidate not in taken:
            return candidate, counter


def _require_unset(kind: str, **fields: Any) -> None:
    for name, value in fields.items():
        if value is not None:
            raise TypeError(f"{name}= is not allowed for a {kind!r} upload")


def _hashed_snapshot(value: Any, what: str) -> tuple[bytes, str]:
    """An immutable copy of a bytes-like ``value`` and the SHA-256 hex digest of that copy."""
    if type(value) is bytes:
        return value, _sha256(value)  # immutable already: a copy would be a pass for nothing
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"{what} must be bytes-like, not {type(value).__name__}")
    # Only a bytearray has a memcmp comparison with bytes (a memoryview's is per item).
    if type(value) is not bytearray or len(value) < _PARALLEL_HASH_BYTES:
        data = memoryview(value).tobytes()
        return data, _sha256(data)
    source = value
    digests: list[str] = []
    hasher = threading.Thread(
        target=lambda: digests.append(_sha256(source)), name="kcoral-upload-hash", daemon=True
    )
    hasher.start()  # it releases the GIL inside hashlib at once; the copy below holds it
    try:
        data = bytes(source)
    finally:
        hasher.join()
    # The hash was taken from the caller's buffer, not the copy. Equal contents (one
    # memcmp, ~10 ms for 64 MiB against ~55 ms for a second hash) mean it names the copy; a
    # buffer another thread changed meanwhile is hashed again from the copy.
    if digests and source == data:
        return data, digests[0]
    return data, _sha256(data)


def check_destination(destination: str, local: str) -> None:
    """Whether the local file ``local`` can go to workspace path ``destination``, checked
    while ``upload_folder`` walks, before the file is read: a huge tree with one path over
    the limit read every file first, and the message did not say which path."""
    check_utf8_name(destination, local, "upload")
    try:
        normalize_workspace_path(destination)  # length, backslash
    except ValidationError as exc:
        raise ValidationError(f"{shown_path(local)!r} cannot be uploaded: {exc}") from None


def _sha256(data: bytes | bytearray) -> str:
    return hashlib.sha256(data).hexdigest()
