"""Raw-HTTP view of a real server for the end-to-end suite.

The suite drives servers with ``kcoral.Client``; these helpers exist only to look at what
the client hides (exact field sets, headers) and to send requests the client cannot
express (malformed bodies). The module name is unique across the test tree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import raw_http
from raw_http import Response as RawResponse
from raw_http import decode, execute_body, sha256

import kcoral
from kcoral.protocol.headers import is_canonical_uuid

__all__ = [
    "CACHE_MISS_FIELDS",
    "ERROR_FIELDS",
    "ERROR_OBJECT_FIELDS",
    "FAILED_FIELDS",
    "RESULT_FIELDS",
    "RawResponse",
    "decode",
    "execute_body",
    "execute_program",
    "execute_raw",
    "finished_events",
    "health",
    "is_canonical_uuid",
    "module_program",
    "request",
    "sha256",
]

# Exact field sets of PROTOCOL §7.2–§7.4 and §7.6.
RESULT_FIELDS = {
    "status",
    "request_id",
    "queue_ms",
    "elapsed_ms",
    "lease_wait_ms",
    "lease_held_ms",
    "results",
    "stdout",
    "stderr",
    "stdout_truncated",
    "stderr_truncated",
}
FAILED_FIELDS = RESULT_FIELDS | {"error"}
ERROR_OBJECT_FIELDS = {
    "kind",
    "message",
    "instruction_index",
    "instruction_op",
    "instruction_id",
    "traceback",
}
CACHE_MISS_FIELDS = {"status", "request_id", "missing_blobs"}
ERROR_FIELDS = {"status", "request_id", "error"}


def request(
    url: str,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: Mapping[str, str] | list[tuple[str, str]] | None = None,
    timeout: float = 120.0,
) -> RawResponse:
    return raw_http.request(url, method, path, body, headers, timeout)


def execute_raw(
    url: str,
    document: Mapping[str, Any] | bytes,
    blobs: Mapping[str, bytes] = {},
    headers: Mapping[str, str] | None = None,
) -> RawResponse:
    return raw_http.post_execute(url, document, blobs, headers, timeout=120.0)


def execute_program(
    url: str,
    program: kcoral.Program,
    options: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> RawResponse:
    """A ``kcoral.Program`` sent raw with all its blobs (no negotiation)."""
    document: dict[str, Any] = {"instructions": program.instructions}
    if options:
        document["options"] = dict(options)
    return execute_raw(url, document, dict(program.blobs), headers)


def health(url: str) -> dict[str, Any]:
    return request(url, "GET", "/health").body


def module_program(source: str, name: str, args: list[Any] | None = None) -> kcoral.Program:
    """A program that uploads ``source``, calls ``name(*args)`` and returns it as ``out``."""
    program = kcoral.Program()
    module = program.upload(kind="module", source=source, id="m")
    fn = program.get_function(module=module, name=name, id="f")
    result = program.run(fn=fn, args=args or [], id="out")
    program.return_(key="out", value=result)
    return program


def finished_events(server: Any, request_id: str | None = None) -> list[dict[str, Any]]:
    return [
        e
        for e in server.events()
        if e.get("event") == "request_finished"
        and (request_id is None or e.get("request_id") == request_id)
    ]
