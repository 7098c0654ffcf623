"""Typed records of a parsed program (PROTOCOL.md §4–§5).

``parse_program`` (in ``kcoral.protocol.validate``) turns a decoded JSON object into these
frozen records; everything past the HTTP edge works on them, never on raw dicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

UploadKind = Literal["module", "tensor", "bytes", "file", "library"]
ReturnKind = Literal["value", "file", "folder"]


@dataclass(frozen=True)
class Ref:
    """A ``{"$ref": id}`` naming a handle made by an earlier instruction."""

    id: str


@dataclass(frozen=True)
class LiteralArg:
    """A ``run`` argument passed as plain decoded JSON (never resolved)."""

    value: Any


@dataclass(frozen=True)
class Options:
    """``options`` as sent; ``None`` means absent (server defaults and clamps apply later)."""

    timeout_seconds: float | None = None
    output_limit_bytes: int | None = None
    gpu_count: int | None = None


@dataclass(frozen=True)
class Upload:
    index: int
    kind: UploadKind
    id: str | None
    source: str | None = None  # module only
    language: str = "python"  # module only: "python" or "cuda"
    blob: str | None = None  # tensor, bytes, file, library
    dtype: str | None = None  # tensor only
    shape: tuple[int, ...] | None = None  # tensor only
    path: str | None = None  # file only, normalized

    op: Literal["upload"] = field(default="upload", init=False)


@dataclass(frozen=True)
class GetFunction:
    index: int
    id: str
    module: Ref
    name: str
    cpu_only: bool = False

    op: Literal["get_function"] = field(default="get_function", init=False)


@dataclass(frozen=True)
class Run:
    index: int
    id: str
    fn: Ref
    args: tuple[Ref | LiteralArg, ...] = ()

    op: Literal["run"] = field(default="run", init=False)


@dataclass(frozen=True)
class Return:
    index: int
    key: str
    kind: ReturnKind
    value: Ref | None = None  # kind "value"
    path: str | Ref | None = None  # kind "file"/"folder": normalized literal or a reference

    op: Literal["return"] = field(default="return", init=False)


Instruction = Upload | GetFunction | Run | Return


@dataclass(frozen=True)
class Program:
    """A validated program: instructions in order, options, and the blobs they reference."""

    instructions: tuple[Instruction, ...]
    options: Options = Options()

    def blob_kinds(self) -> dict[str, frozenset[str]]:
        """Referenced blob hash -> upload kinds using it, in order of first reference."""
        kinds: dict[str, set[str]] = {}
        for instruction in self.instructions:
            if isinstance(instruction, Upload) and instruction.blob is not None:
                kinds.setdefault(instruction.blob, set()).add(instruction.kind)
        return {blob: frozenset(used) for blob, used in kinds.items()}

    def tensor_uploads(self) -> list[Upload]:
        return [i for i in self.instructions if isinstance(i, Upload) and i.kind == "tensor"]
