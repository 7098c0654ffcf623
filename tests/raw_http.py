"""Raw HTTP to a real server, for the suites that must see what ``kcoral.Client`` hides.

One request/decode implementation shared by the front-end (``tests/server/http_helpers``),
end-to-end (``tests/e2e/e2e_support``), sandbox (``tests/sandbox/sandbox_helpers``) and
reliability (``tests/reliability/reliability_support``) helpers, which keep only what is
their own. The module name is unique across the test tree so that plain ``import`` finds it
from any folder (as ``server_process`` is found).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kcoral.protocol.multipart import boundary_from_content_type, encode_multipart, parse_multipart


@dataclass
class Response:
    status: int
    headers: http.client.HTTPMessage
    raw: bytes
    body: Any = None  # decoded JSON (the ``result`` part of a multipart answer)
    parts: dict[str, bytes] = field(default_factory=dict)
    part_order: list[str] = field(default_factory=list)

    def header_values(self, name: str) -> list[str]:
        return self.headers.get_all(name) or []


@dataclass
class DecodedBody:
    """A response body as JSON plus the binary parts of a multipart answer."""

    body: Any = None
    parts: dict[str, bytes] = field(default_factory=dict)
    part_order: list[str] = field(default_factory=list)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def decode_body(content_type: str, raw: bytes) -> DecodedBody:
    """JSON body (the ``result`` part of multipart) and parts; nothing for other types."""
    decoded = DecodedBody()
    if content_type.startswith("multipart/"):
        parts = parse_multipart(memoryview(raw), boundary_from_content_type(content_type))
        decoded.part_order = [p.name for p in parts]
        decoded.parts = {p.name: bytes(p.data) for p in parts}
        decoded.body = json.loads(decoded.parts.pop("result"))
    elif content_type.startswith("application/json"):
        decoded.body = json.loads(raw)
    return decoded


def decode(status: int, headers: http.client.HTTPMessage, raw: bytes) -> Response:
    decoded = decode_body(headers.get("Content-Type", ""), raw)
    return Response(status, headers, raw, decoded.body, decoded.parts, decoded.part_order)


def connection(url: str, timeout: float = 60.0) -> http.client.HTTPConnection:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    return http.client.HTTPConnection(host, int(port), timeout=timeout)


def request(
    url: str,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: Mapping[str, str] | list[tuple[str, str]] | None = None,
    timeout: float = 60.0,
) -> Response:
    conn = connection(url, timeout)
    try:
        conn.putrequest(method, path)
        items = headers.items() if isinstance(headers, Mapping) else (headers or [])
        for name, value in items:
            conn.putheader(name, value)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        answer = conn.getresponse()
        return decode(answer.status, answer.headers, answer.read())
    finally:
        conn.close()


def execute_body(
    document: Mapping[str, Any] | bytes, blobs: Mapping[str, bytes] | None = None
) -> tuple[str, bytes]:
    """(Content-Type, body) of a well-formed ``/execute`` request."""
    program = document if isinstance(document, bytes) else json.dumps(document).encode()
    parts = [("program", "application/json", program)]
    parts += [
        (f"blob:{key}", "application/octet-stream", data) for key, data in (blobs or {}).items()
    ]
    content_type, chunks, _length = encode_multipart(parts)
    return content_type, b"".join(bytes(c) for c in chunks)


def post_execute(
    url: str,
    document: Mapping[str, Any] | bytes,
    blobs: Mapping[str, bytes] | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> Response:
    content_type, body = execute_body(document, blobs)
    all_headers = {"Content-Type": content_type, **(headers or {})}
    return request(url, "POST", "/execute", body, all_headers, timeout=timeout)


def call_program(
    source: str, function: str = "main", args: list | None = None, **options: Any
) -> dict[str, Any]:
    """Upload ``source``, call ``function(*args)`` and return the value under ``"value"``."""
    program: dict[str, Any] = {
        "instructions": [
            {"op": "upload", "id": "m", "kind": "module", "source": source},
            {"op": "get_function", "id": "f", "module": {"$ref": "m"}, "name": function},
            {"op": "run", "id": "r", "fn": {"$ref": "f"}, "args": args or []},
            {"op": "return", "key": "value", "value": {"$ref": "r"}},
        ]
    }
    if options:
        program["options"] = options
    return program


def read_until_closed(sock: socket.socket, timeout: float | None = None) -> bytes:
    """All the peer sends until it closes (a reset counts as closing); raises
    ``TimeoutError`` if it never does within ``timeout`` (None: the socket's own)."""
    if timeout is not None:
        sock.settimeout(timeout)
    received = b""
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return received
        if not data:
            return received
        received += data
