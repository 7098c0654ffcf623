"""``POST /execute`` request parsing: PROTOCOL.md §3.2 rows 2–11 and 13, in that order.

Row 1 (size), row 12 (``gpu_count`` capacity), row 14 (tensor lengths, after cache
resolution; see ``check_tensor_lengths``) and row 15 (cache misses) belong to the server.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from kcoral.protocol.dtypes import byte_length
from kcoral.protocol.errors import ValidationError
from kcoral.protocol.multipart import boundary_from_content_type, parse_multipart
from kcoral.protocol.schema import Program
from kcoral.protocol.strict_json import loads_strict
from kcoral.protocol.validate import is_blob_hash, parse_program

PROGRAM_PART = "program"
BLOB_PART_PREFIX = "blob:"
PROGRAM_CONTENT_TYPE = "application/json"
BLOB_CONTENT_TYPE = "application/octet-stream"


@dataclass(frozen=True)
class ParsedRequest:
    """A validated request: the program, its raw JSON bytes and supplied blobs by hash.

    ``blobs`` maps the 64-hex hash (without the ``blob:`` prefix) to a zero-copy slice of
    the body, in part order.
    """

    program: Program
    program_bytes: memoryview
    blobs: dict[str, memoryview]


def parse_execute_request(
    content_type: str | None, body: memoryview, *, verify_hashes: bool = True
) -> ParsedRequest:
    """Validate an ``/execute`` body; raises ``ValidationError`` (HTTP 400, kind ``parse``).

    With ``verify_hashes=False`` row 9 is skipped so the caller can run
    ``verify_blob_hashes`` in a thread pool before trusting the blobs.
    """
    boundary = boundary_from_content_type(content_type)  # row 2
    parts = parse_multipart(body, boundary)  # row 3
    for part in parts:  # row 4
        if part.name != PROGRAM_PART and not (
            part.name.startswith(BLOB_PART_PREFIX)
            and is_blob_hash(part.name[len(BLOB_PART_PREFIX) :])
        ):
            raise ValidationError(
                f"unexpected part name {part.name!r}; expected 'program' or "
                "'blob:' followed by 64 lowercase hex digits"
            )
    programs = [part for part in parts if part.name == PROGRAM_PART]
    if len(programs) != 1:  # row 5
        raise ValidationError(f"expected exactly one 'program' part, got {len(programs)}")
    program_part = programs[0]
    if program_part.content_type != PROGRAM_CONTENT_TYPE:  # row 6
        raise ValidationError(
            f"'program' part has type {program_part.content_type!r}; "
            f"expected {PROGRAM_CONTENT_TYPE}"
        )
    blob_parts = [part for part in parts if part.name != PROGRAM_PART]
    for part in blob_parts:  # row 7
        if part.content_type != BLOB_CONTENT_TYPE:
            raise ValidationError(
                f"part {part.name!r} has type {part.content_type!r}; expected {BLOB_CONTENT_TYPE}"
            )
    blobs: dict[str, memoryview] = {}
    for part in blob_parts:  # row 8
        digest = part.name[len(BLOB_PART_PREFIX) :]
        if digest in blobs:
            raise ValidationError(f"duplicate blob part {part.name!r}")
        blobs[digest] = part.data
    if verify_hashes:  # row 9
        verify_blob_hashes(blobs)
    try:  # row 10
        decoded = loads_strict(program_part.data)
    except ValidationError as exc:
        raise ValidationError(f"program: {exc}") from None
    if not isinstance(decoded, dict):
        raise ValidationError("program: top level must be a JSON object")
    program = parse_program(decoded)  # row 11
    check_blobs_referenced(program, blobs)  # row 13
    return ParsedRequest(program, program_part.data, blobs)


def verify_blob_hashes(blobs: Mapping[str, memoryview | bytes | bytearray]) -> None:
    """§3.2 row 9: every blob's SHA-256 equals its name. Safe to run in a worker thread."""
    for digest, data in blobs.items():
        actual = hashlib.sha256(data).hexdigest()
        if actual != digest:
            raise ValidationError(f"blob part 'blob:{digest}' has content with SHA-256 {actual}")


def check_blobs_referenced(program: Program, blobs: Mapping[str, object]) -> None:
    """§3.2 row 13: every supplied blob is referenced by some upload."""
    referenced = program.blob_kinds()
    for digest in blobs:
        if digest not in referenced:
            raise ValidationError(f"blob part 'blob:{digest}' is not referenced by any upload")


def check_tensor_lengths(
    program: Program, resolved: Mapping[str, bytes | bytearray | memoryview]
) -> None:
    """§3.2 row 14 for every tensor upload whose bytes are in ``resolved`` (hash -> bytes)."""
    for upload in program.tensor_uploads():
        assert upload.blob is not None and upload.dtype is not None and upload.shape is not None
        data = resolved.get(upload.blob)
        if data is None:
            continue
        actual = memoryview(data).nbytes
        expected = byte_length(upload.dtype, upload.shape)
        if actual != expected:
            raise ValidationError(
                f"instruction {upload.index}: tensor data is {actual} bytes; dtype "
                f"{upload.dtype} with shape {list(upload.shape)} needs {expected}"
            )
