"""Raw-HTTP helpers for the front-end tests (no dependency on ``kcoral.Client``)."""

from __future__ import annotations

import hashlib
import http.client
import json
from dataclasses import dataclass, field
from typing import Any

from kcoral.protocol.multipart import boundary_from_content_type, encode_multipart, parse_multipart


@dataclass
class Response:
    status: int
    headers: http.client.HTTPMessage
    raw: bytes
    body: Any = None  # decoded JSON (the ``result`` part for multipart answers)
    parts: dict[str, bytes] = field(default_factory=dict)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def connection(url: str, timeout: float = 60.0) -> http.client.HTTPConnection:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    return http.client.HTTPConnection(host, int(port), timeout=timeout)


def decode(status: int, headers: http.client.HTTPMessage, raw: bytes) -> Response:
    response = Response(status, headers, raw)
    content_type = headers.get("Content-Type", "")
    if content_type.startswith("multipart/"):
        parts = parse_multipart(memoryview(raw), boundary_from_content_type(content_type))
        response.parts = {p.name: bytes(p.data) for p in parts}
        response.body = json.loads(response.parts.pop("result"))
    elif content_type.startswith("application/json"):
        response.body = json.loads(raw)
    return response


def request(
    url: str,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | list[tuple[str, str]] | None = None,
    timeout: float = 60.0,
) -> Response:
    conn = connection(url, timeout)
    try:
        conn.putrequest(method, path)
        items = headers.items() if isinstance(headers, dict) else (headers or [])
        for name, value in items:
            conn.putheader(name, value)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        answer = conn.getresponse()
        return decode(answer.status, answer.headers, answer.read())
    finally:
        conn.close()


def get(url: str, path: str, headers: dict[str, str] | None = None) -> Response:
    return request(url, "GET", path, headers=headers)


def execute_body(program: dict, blobs: dict[str, bytes] | None = None) -> tuple[str, bytes]:
    parts = [("program", "application/json", json.dumps(program).encode())]
    parts += [(f"blob:{h}", "application/octet-stream", b) for h, b in (blobs or {}).items()]
    content_type, chunks, _length = encode_multipart(parts)
    return content_type, b"".join(bytes(c) for c in chunks)


def execute(
    url: str,
    program: dict,
    blobs: dict[str, bytes] | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> Response:
    content_type, body = execute_body(program, blobs)
    return request(
        url,
        "POST",
        "/execute",
        body,
        {"Content-Type": content_type, **(headers or {})},
        timeout=timeout,
    )


def module_program(source: str, calls: list[tuple[str, list]], **options: Any) -> dict:
    """Upload ``source``, call each ``(function, args)`` and return its value under the
    function's name (``cpu_only`` when the name ends in ``_cpu``)."""
    instructions: list[dict] = [{"op": "upload", "id": "m", "kind": "module", "source": source}]
    for i, (name, args) in enumerate(calls):
        instructions.append(
            {
                "op": "get_function",
                "id": f"f{i}",
                "module": {"$ref": "m"},
                "name": name,
                **({"cpu_only": True} if name.endswith("_cpu") else {}),
            }
        )
        instructions.append({"op": "run", "id": f"r{i}", "fn": {"$ref": f"f{i}"}, "args": args})
        instructions.append({"op": "return", "key": f"{name}#{i}", "value": {"$ref": f"r{i}"}})
    program: dict[str, Any] = {"instructions": instructions}
    if options:
        program["options"] = options
    return program
