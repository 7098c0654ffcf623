"""``/execute`` request building and cache negotiation, without I/O (CLIENT_API.md §2.1).

Both clients drive the same state machine: ``ExecuteNegotiation.first_attempt()`` gives the
first request; each answer goes to ``handle_response``, which returns the next ``Attempt``
(after a ``CACHE_MISS``) or the final ``ProgramResult``, and raises ``KCoralError`` for a
non-200 answer and ``ProtocolError`` for a broken one. The clients only move bytes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kcoral.connection.transport import body_pieces
from kcoral.errors import ProtocolError
from kcoral.local_folder import FileBlob
from kcoral.program import Program
from kcoral.protocol.headers import (
    NODE_HEADER,
    SERIALIZATION_FORMATS,
    SERIALIZATION_HEADER,
    TIMEOUT_OUTPUT_HEADER,
    node_preference,
)
from kcoral.protocol.multipart import BodyChunk, encode_multipart
from kcoral.protocol.output_order import OUTPUT_ORDER_HEADER
from kcoral.protocol.selector import SELECT_HEADER, Selector, format_selector
from kcoral.protocol.strict_json import dumps_compact
from kcoral.response import CacheMiss, decode_execute_response, error_from_response
from kcoral.results import ProgramResult

_MAX_ATTEMPTS = 3
# Set per attempt by the negotiation; a caller-supplied value would break the request.
_OWN_HEADERS = frozenset(
    {
        "content-type",
        "content-length",
        NODE_HEADER.lower(),
        SELECT_HEADER.lower(),
        OUTPUT_ORDER_HEADER.lower(),
        TIMEOUT_OUTPUT_HEADER.lower(),
    }
)


@dataclass(frozen=True)
class Attempt:
    """One ``POST /execute``: headers (``Content-Type`` included) and the body in chunks."""

    number: int
    headers: dict[str, str]
    chunks: Sequence[BodyChunk]
    length: int

    def body(self) -> bytes:
        """The body as one ``bytes`` (for HTTP libraries that cannot take chunks)."""
        return b"".join(body_pieces(self.chunks))


def execute_body(
    program: Program,
    *,
    timeout_seconds: float | None = None,
    output_limit_bytes: int | None = None,
    gpu_count: int | None = None,
) -> bytes:
    """The program JSON of §2.1 steps 1–3, serialized once (``TypeError``/``ValueError``)."""
    if not isinstance(program, Program):
        raise TypeError(f"program must be a kcoral.Program, not {type(program).__name__}")
    if gpu_count is not None and (
        isinstance(gpu_count, bool) or not isinstance(gpu_count, int) or not 1 <= gpu_count <= 8
    ):
        raise ValueError(f"gpu_count must be an int from 1 to 8, not {gpu_count!r}")
    options = {
        name: value
        for name, value in (
            ("timeout_seconds", timeout_seconds),
            ("output_limit_bytes", output_limit_bytes),
            ("gpu_count", gpu_count),
        )
        if value is not None
    }
    for name, value in options.items():  # named: JSON's "Out of range float" said neither
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, not {value!r}")
    document: dict[str, Any] = {"instructions": program.instructions}
    if options:
        document["options"] = options
    try:
        return dumps_compact(document)
    except ValueError as exc:  # NaN/Infinity in an option
        raise ValueError(f"cannot encode the request: {exc}") from None


class ExecuteNegotiation:
    """The three-attempt cache negotiation of PROTOCOL.md §9.3 for one ``execute`` call."""

    def __init__(
        self,
        program: Program,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_seconds: float | None = None,
        output_limit_bytes: int | None = None,
        gpu_count: int | None = None,
        serialization: str | None = None,
        select: Selector | None = None,
    ) -> None:
        if serialization is not None and serialization not in SERIALIZATION_FORMATS:
            raise ValueError(
                f"serialization must be one of {list(SERIALIZATION_FORMATS)}, not {serialization!r}"
            )
        self._program_json = execute_body(
            program,
            timeout_seconds=timeout_seconds,
            output_limit_bytes=output_limit_bytes,
            gpu_count=gpu_count,
        )
        # Snapshot: the program may be changed by the caller while we wait for answers. A
        # folder's file stays a FileBlob, read only if an attempt sends it.
        self._blobs = dict(program.blob_sources)
        self._headers = dict(headers or {})
        if serialization is not None:
            self._headers = {
                k: v for k, v in self._headers.items() if k.lower() != SERIALIZATION_HEADER.lower()
            }
            self._headers[SERIALIZATION_HEADER] = serialization
        # Sent on every attempt: a cache-miss retry needs a node that fits as much as the
        # first attempt did (EXTENSIONS §14), whatever X-KCoral-Node it echoes.
        self._selector = format_selector(select or {})
        self._attempts = 0

    def first_attempt(self) -> Attempt:
        """The first request: the program without blobs."""
        if self._attempts:
            raise RuntimeError("first_attempt() was already called")
        return self._attempt([], node=None)

    def handle_response(
        self, status_code: int, headers: Mapping[str, str], content_type: str | None, body: Any
    ) -> ProgramResult | Attempt:
        """The final result, or the next attempt after a ``CACHE_MISS``."""
        if status_code != 200:
            raise error_from_response(status_code, headers, body)
        outcome = decode_execute_response(content_type, body, self._blobs)
        if not isinstance(outcome, CacheMiss):
            return dataclasses.replace(outcome, node=headers.get(NODE_HEADER))
        if self._attempts >= _MAX_ATTEMPTS:
            raise ProtocolError(
                f"server still reports missing blobs after {_MAX_ATTEMPTS} attempts "
                f"(request {outcome.request_id})"
            )
        # Attempt 2 sends exactly what was missing; attempt 3 sends everything (§9.3).
        wanted = set(outcome.missing_blobs) if self._attempts == 1 else set(self._blobs)
        blobs = [digest for digest in self._blobs if digest in wanted]
        return self._attempt(blobs, node=node_preference(headers.get(NODE_HEADER)))

    def _attempt(self, blobs: list[str], *, node: str | None) -> Attempt:
        self._attempts += 1
        parts: list[tuple[str, str, bytes | FileBlob]] = [
            ("program", "application/json", self._program_json)
        ]
        parts.extend((f"blob:{d}", "application/octet-stream", self._blobs[d]) for d in blobs)
        content_type, chunks, length = encode_multipart(parts)
        headers = {
            name: value for name, value in self._headers.items() if name.lower() not in _OWN_HEADERS
        }
        if node is not None:
            headers[NODE_HEADER] = node
        if self._selector:
            headers[SELECT_HEADER] = self._selector
        # the true order of the program's stdout and stderr (EXTENSIONS §16); a server
        # that does not know the header answers as it always did
        headers[OUTPUT_ORDER_HEADER] = "1"
        # what a program past its deadline printed, in its 504 (EXTENSIONS §15)
        headers[TIMEOUT_OUTPUT_HEADER] = "1"
        headers["Content-Type"] = content_type
        return Attempt(self._attempts, headers, chunks, length)
