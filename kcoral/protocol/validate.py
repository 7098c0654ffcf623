"""Program schema validation (PROTOCOL.md §4–§5, §3.2 row 11): JSON object -> typed records.

Every rule is checked here, once, at the edge; the server and the client's builder work on the
frozen records of ``kcoral.protocol.schema``. Messages name the instruction
(``instruction 3: ...``); problems outside the instructions carry no prefix.
"""

from __future__ import annotations

import math
import re
import sys
from typing import Any, Literal, TypeGuard

from kcoral.protocol.dtypes import ITEMSIZE
from kcoral.protocol.errors import ValidationError
from kcoral.protocol.paths import conflicting_paths, normalize_workspace_path
from kcoral.protocol.schema import (
    GetFunction,
    Instruction,
    LiteralArg,
    Options,
    Program,
    Ref,
    Return,
    Run,
    Upload,
    UploadKind,
)

BLOB_RE = re.compile(r"[0-9a-f]{64}")
OPS = ("upload", "get_function", "run", "return")
UPLOAD_KINDS: tuple[UploadKind, ...] = ("module", "tensor", "bytes", "file", "library")
MODULE_LANGUAGES = ("python", "cuda")
MAX_GPU_COUNT = 8

# (required fields, optional fields) of one instruction form
_Fields = tuple[frozenset[str], frozenset[str]]
# upload kind -> its fields; PROTOCOL.md §5.1 field matrix.
_UPLOAD_FIELDS: dict[str, _Fields] = {
    "module": (frozenset({"op", "kind", "id", "source"}), frozenset({"language"})),
    "tensor": (frozenset({"op", "kind", "id", "blob", "dtype", "shape"}), frozenset()),
    "bytes": (frozenset({"op", "kind", "id", "blob"}), frozenset()),
    "file": (frozenset({"op", "kind", "blob", "path"}), frozenset({"id"})),
    "library": (frozenset({"op", "kind", "id", "blob"}), frozenset()),
}
_GET_FUNCTION_FIELDS: _Fields = (frozenset({"op", "id", "module", "name"}), frozenset({"cpu_only"}))
_RUN_FIELDS: _Fields = (frozenset({"op", "id", "fn"}), frozenset({"args"}))
_VALUE_RETURN_FIELDS: _Fields = (frozenset({"op", "key", "value"}), frozenset())
_PATH_RETURN_FIELDS: _Fields = (frozenset({"op", "key", "kind", "path"}), frozenset())
_OPTION_KEYS = ("timeout_seconds", "output_limit_bytes", "gpu_count")


def is_blob_hash(value: object) -> bool:
    """True for 64 lowercase hex digits (a blob name)."""
    return isinstance(value, str) and BLOB_RE.fullmatch(value) is not None


def is_reference(value: object) -> bool:
    """True when ``value`` has the shape of a reference: ``{"$ref": <non-empty str>}`` only."""
    return (
        isinstance(value, dict)
        and len(value) == 1
        and isinstance(value.get("$ref"), str)
        and value["$ref"] != ""
    )


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_upload_kind(value: object) -> TypeGuard[UploadKind]:
    return isinstance(value, str) and value in UPLOAD_KINDS


def _is_path_return_kind(value: object) -> TypeGuard[Literal["file", "folder"]]:
    return value in ("file", "folder")


def _type_name(value: object) -> str:
    names = {
        dict: "object",
        list: "array",
        str: "string",
        bool: "boolean",
        int: "integer",
        float: "number",
    }
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _show(value: object) -> str:
    """A short repr for messages (huge integers cannot even be printed in full)."""
    try:
        text = repr(value)
    except ValueError:
        return f"a {_type_name(value)} too large to print"
    return text if len(text) <= 80 else text[:77] + "..."


def _check_text(value: str, what: str) -> None:
    # Lone surrogates (legal as JSON escapes) cannot be written back as UTF-8.
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValidationError(f"{what} is not valid Unicode text") from None


class _ProgramParser:
    """One pass over the instructions, tracking handles and return keys seen so far."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.keys: set[str] = set()
        self.file_paths: list[tuple[str, int]] = []

    # ---------------------------------------------------------------- field helpers

    def fields(self, obj: dict[str, Any], spec: _Fields, what: str) -> None:
        required, optional = spec
        for name in obj:
            if name not in required and name not in optional:
                raise ValidationError(f"unknown field {_show(name)} for {what}")
        for name in sorted(required):
            if name not in obj:
                raise ValidationError(f"missing field {_show(name)} for {what}")

    def string(self, obj: dict[str, Any], name: str) -> str:
        value = obj[name]
        if not isinstance(value, str):
            raise ValidationError(f"{_show(name)} must be a string, not {_type_name(value)}")
        if value == "":
            raise ValidationError(f"{_show(name)} must not be empty")
        _check_text(value, repr(name))
        return value

    def new_id(self, obj: dict[str, Any]) -> str:
        value = self.string(obj, "id")
        if value in self.ids:
            raise ValidationError(f"duplicate id {_show(value)}")
        return value

    def reference(self, value: object, name: str) -> Ref:
        if not isinstance(value, dict) or list(value) != ["$ref"]:
            raise ValidationError(f'{_show(name)} must be a reference {{"$ref": <id>}}')
        target = value["$ref"]
        if not isinstance(target, str) or target == "":
            raise ValidationError(f'{_show(name)}: "$ref" must be a non-empty string')
        return self.known(target)

    def known(self, target: str) -> Ref:
        if target not in self.ids:
            raise ValidationError(f"unknown or forward reference {_show(target)}")
        return Ref(target)

    # ------------------------------------------------------------------ instructions

    def instruction(self, obj: object, index: int) -> Instruction:
        if not isinstance(obj, dict):
            raise ValidationError(f"instruction must be an object, not {_type_name(obj)}")
        if "op" not in obj:
            raise ValidationError("missing field 'op'")
        op = obj["op"]
        if op not in OPS or not isinstance(op, str):
            raise ValidationError(f"unknown op {_show(op)}; expected one of {', '.join(OPS)}")
        parsed: Instruction
        if op == "upload":
            parsed = self.upload(obj, index)
        elif op == "get_function":
            parsed = self.get_function(obj, index)
        elif op == "run":
            parsed = self.run(obj, index)
        else:
            parsed = self.return_(obj, index)
        # Registered only now: an instruction cannot reference its own id.
        if not isinstance(parsed, Return) and parsed.id is not None:
            self.ids.add(parsed.id)
        return parsed

    def upload(self, obj: dict[str, Any], index: int) -> Upload:
        if "kind" not in obj:
            raise ValidationError("missing field 'kind' for upload")
        kind = obj["kind"]
        if not _is_upload_kind(kind):
            raise ValidationError(
                f"unknown upload kind {_show(kind)}; expected one of {', '.join(UPLOAD_KINDS)}"
            )
        self.fields(obj, _UPLOAD_FIELDS[kind], f"{kind} upload")
        handle = self.new_id(obj) if "id" in obj else None
        if kind == "module":
            source = obj["source"]
            if not isinstance(source, str):
                raise ValidationError(f"'source' must be a string, not {_type_name(source)}")
            _check_text(source, "'source'")
            language = obj.get("language", "python")
            if language not in MODULE_LANGUAGES or not isinstance(language, str):
                raise ValidationError(
                    f'\'language\' must be "python" or "cuda", not {_show(language)}'
                )
            return Upload(index, kind, handle, source=source, language=language)
        blob = obj["blob"]
        if not is_blob_hash(blob):
            raise ValidationError(f"'blob' must be 64 lowercase hex digits, not {_show(blob)}")
        if kind == "tensor":
            dtype = obj["dtype"]
            if not isinstance(dtype, str) or dtype not in ITEMSIZE:
                raise ValidationError(f"unknown dtype {_show(dtype)}")
            return Upload(index, kind, handle, blob=blob, dtype=dtype, shape=_shape(obj["shape"]))
        if kind == "file":
            path = _literal_path(obj["path"])
            self.file_paths.append((path, index))
            return Upload(index, kind, handle, blob=blob, path=path)
        return Upload(index, kind, handle, blob=blob)

    def get_function(self, obj: dict[str, Any], index: int) -> GetFunction:
        self.fields(obj, _GET_FUNCTION_FIELDS, "get_function")
        handle = self.new_id(obj)
        module = self.reference(obj["module"], "module")
        name = self.string(obj, "name")
        cpu_only = obj.get("cpu_only", False)
        if not isinstance(cpu_only, bool):
            raise ValidationError(f"'cpu_only' must be a boolean, not {_type_name(cpu_only)}")
        return GetFunction(index, handle, module, name, cpu_only)

    def run(self, obj: dict[str, Any], index: int) -> Run:
        self.fields(obj, _RUN_FIELDS, "run")
        handle = self.new_id(obj)
        fn = self.reference(obj["fn"], "fn")
        args = obj.get("args", [])
        if not isinstance(args, list):
            raise ValidationError(f"'args' must be an array, not {_type_name(args)}")
        # Top level only: nested reference-shaped objects are literals (§5.3).
        parsed = tuple(
            self.known(arg["$ref"]) if is_reference(arg) else LiteralArg(arg) for arg in args
        )
        return Run(index, handle, fn, parsed)

    def return_(self, obj: dict[str, Any], index: int) -> Return:
        if "kind" not in obj:
            self.fields(obj, _VALUE_RETURN_FIELDS, "value return")
            key = self.new_key(obj)
            return Return(index, key, "value", value=self.reference(obj["value"], "value"))
        kind = obj["kind"]
        if not _is_path_return_kind(kind):
            raise ValidationError(f'return kind must be "file" or "folder", not {_show(kind)}')
        self.fields(obj, _PATH_RETURN_FIELDS, f"{kind} return")
        key = self.new_key(obj)
        raw = obj["path"]
        path: str | Ref
        if isinstance(raw, str):
            path = _literal_path(raw)
        elif isinstance(raw, dict):
            path = self.reference(raw, "path")
        else:
            raise ValidationError(
                f"'path' must be a path string or a reference, not {_type_name(raw)}"
            )
        return Return(index, key, kind, path=path)

    def new_key(self, obj: dict[str, Any]) -> str:
        key = self.string(obj, "key")
        if key in self.keys:
            raise ValidationError(f"duplicate return key {_show(key)}")
        self.keys.add(key)
        return key


def _shape(value: object) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise ValidationError(f"'shape' must be an array, not {_type_name(value)}")
    for dim in value:
        if not _is_int(dim):
            raise ValidationError(f"'shape' entries must be integers, not {_type_name(dim)}")
        if dim < 0:
            raise ValidationError(f"'shape' entries must be >= 0, not {_show(dim)}")
    return tuple(value)


def _literal_path(value: object) -> str:
    try:
        return normalize_workspace_path(value)
    except ValidationError as exc:
        raise ValidationError(f"invalid path: {exc}") from None


def _options(value: object) -> Options:
    if not isinstance(value, dict):
        raise ValidationError(f"'options' must be an object, not {_type_name(value)}")
    for key in value:
        if key not in _OPTION_KEYS:
            raise ValidationError(f"unknown option {_show(key)}")
    timeout = value.get("timeout_seconds")
    if "timeout_seconds" in value:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise ValidationError(
                f"option 'timeout_seconds' must be a number, not {_type_name(timeout)}"
            )
        if not (timeout > 0 and (isinstance(timeout, int) or math.isfinite(timeout))):
            raise ValidationError(
                f"option 'timeout_seconds' must be finite and > 0, not {_show(timeout)}"
            )
        # A huge JSON integer is still a valid (to-be-clamped) timeout; keep it a finite float.
        timeout = float(timeout) if timeout <= sys.float_info.max else sys.float_info.max
    limit = value.get("output_limit_bytes")
    if "output_limit_bytes" in value:
        if not _is_int(limit):
            raise ValidationError(
                f"option 'output_limit_bytes' must be an integer, not {_type_name(limit)}"
            )
        if limit < 0:
            raise ValidationError(f"option 'output_limit_bytes' must be >= 0, not {_show(limit)}")
    gpu_count = value.get("gpu_count")
    if "gpu_count" in value:
        if not _is_int(gpu_count):
            raise ValidationError(
                f"option 'gpu_count' must be an integer, not {_type_name(gpu_count)}"
            )
        if not 1 <= gpu_count <= MAX_GPU_COUNT:
            raise ValidationError(
                f"option 'gpu_count' must be between 1 and {MAX_GPU_COUNT}, not {_show(gpu_count)}"
            )
    return Options(timeout, limit, gpu_count)


def parse_program(obj: object) -> Program:
    """Validate a decoded program object and return its typed form.

    Raises ``kcoral.errors.ValidationError`` for any schema violation of PROTOCOL.md §4–§5.
    """
    if not isinstance(obj, dict):
        raise ValidationError(f"program must be a JSON object, not {_type_name(obj)}")
    for name in obj:
        if name not in ("instructions", "options"):
            raise ValidationError(f"unknown top-level field {_show(name)}")
    if "instructions" not in obj:
        raise ValidationError("missing field 'instructions'")
    raw = obj["instructions"]
    if not isinstance(raw, list):
        raise ValidationError(f"'instructions' must be an array, not {_type_name(raw)}")
    if not raw:
        raise ValidationError("'instructions' must not be empty")
    options = _options(obj["options"]) if "options" in obj else Options()
    parser = _ProgramParser()
    instructions: list[Instruction] = []
    for index, item in enumerate(raw):
        try:
            instructions.append(parser.instruction(item, index))
        except ValidationError as exc:
            raise ValidationError(f"instruction {index}: {exc}") from None
    _check_file_paths(parser.file_paths)
    return Program(tuple(instructions), options)


def _check_file_paths(paths: list[tuple[str, int]]) -> None:
    conflict = conflicting_paths([path for path, _ in paths])
    if conflict is None:
        return
    first, second = conflict
    if first == second:
        index = [i for path, i in paths if path == first][1]
        raise ValidationError(f"instruction {index}: duplicate file upload path {_show(first)}")
    # Name the later of the two uploads: it is the one that breaks the rule.
    index = max(i for path, i in paths if path in (first, second))
    raise ValidationError(
        f"instruction {index}: file upload path {_show(second)} conflicts with {_show(first)} "
        "(a path cannot be both a file and a directory)"
    )
