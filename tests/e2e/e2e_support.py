"""Raw-HTTP view of a real server for the end-to-end suite.

The suite drives servers with ``kcoral.Client``; these helpers exist only to look at what
the client hides (exact field sets, headers) and to send requests the client cannot
express (malformed bodies). The module name is unique across the test tree.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kcoral
from kcoral.protocol.multipart import boundary_from_content_type, encode_multipart, parse_multipart

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


@dataclass
class RawResponse:
    status: int
    headers: http.client.HTTPMessage
    raw: bytes
    body: Any = None  # decoded JSON (the ``result`` part of a multipart answer)
    parts: dict[str, bytes] = field(default_factory=dict)
    part_order: list[str] = field(default_factory=list)

    def header_values(self, name: str) -> list[str]:
        return self.headers.get_all(name) or []


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def is_canonical_uuid(value: object) -> bool:
    try:
        return isinstance(value, str) and str(uuid.UUID(value)) == value
    except ValueError:
        return False


def request(
    url: str,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: Mapping[str, str] | list[tuple[str, str]] | None = None,
    timeout: float = 120.0,
) -> RawResponse:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.putrequest(method, path)
        items = headers.items() if isinstance(headers, Mapping) else (headers or [])
        for name, value in items:
            conn.putheader(name, value)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        answer = conn.getresponse()
        raw = answer.read()
        return decode(answer.status, answer.headers, raw)
    finally:
        conn.close()


def decode(status: int, headers: http.client.HTTPMessage, raw: bytes) -> RawResponse:
    response = RawResponse(status, headers, raw)
    content_type = headers.get("Content-Type", "")
    if content_type.startswith("multipart/"):
        parts = parse_multipart(memoryview(raw), boundary_from_content_type(content_type))
        response.part_order = [p.name for p in parts]
        response.parts = {p.name: bytes(p.data) for p in parts}
        response.body = json.loads(response.parts.pop("result"))
    elif content_type.startswith("application/json"):
        response.body = json.loads(raw)
    return response


def execute_body(
    document: Mapping[str, Any] | bytes, blobs: Mapping[str, bytes] = {}
) -> tuple[str, bytes]:
    """(Content-Type, body) of a well-formed ``/execute`` request."""
    program = document if isinstance(document, bytes) else json.dumps(document).encode()
    parts = [("program", "application/json", program)]
    parts += [(f"blob:{key}", "application/octet-stream", data) for key, data in blobs.items()]
    content_type, chunks, _ = encode_multipart(parts)
    return content_type, b"".join(bytes(c) for c in chunks)


def execute_raw(
    url: str,
    document: Mapping[str, Any] | bytes,
    blobs: Mapping[str, bytes] = {},
    headers: Mapping[str, str] | None = None,
) -> RawResponse:
    content_type, body = execute_body(document, blobs)
    return request(url, "POST", "/execute", body, {"Content-Type": content_type, **(headers or {})})


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


def wait_for(condition: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    """Poll ``condition`` until it is truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


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
