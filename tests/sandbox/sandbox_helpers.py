"""Raw-HTTP helpers for the sandbox and limits tests."""

from __future__ import annotations

import hashlib
import http.client
import json
from typing import Any

from kcoral.protocol.multipart import boundary_from_content_type, encode_multipart, parse_multipart


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def execute(
    url: str, program: dict, blobs: dict[str, bytes] | None = None, timeout: float = 90.0
) -> tuple[int, Any, dict[str, bytes]]:
    """POST /execute; returns (status, decoded result JSON, binary parts)."""
    parts = [("program", "application/json", json.dumps(program).encode())]
    parts += [(f"blob:{h}", "application/octet-stream", b) for h, b in (blobs or {}).items()]
    content_type, chunks, _length = encode_multipart(parts)
    body = b"".join(bytes(c) for c in chunks)
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", "/execute", body, {"Content-Type": content_type})
        answer = conn.getresponse()
        raw = answer.read()
        kind = answer.headers.get("Content-Type", "")
    finally:
        conn.close()
    if kind.startswith("multipart/"):
        decoded = {
            p.name: bytes(p.data)
            for p in parse_multipart(memoryview(raw), boundary_from_content_type(kind))
        }
        return answer.status, json.loads(decoded.pop("result")), decoded
    return answer.status, json.loads(raw) if raw else None, {}


def run_source(source: str, function: str = "main", args: list | None = None) -> dict:
    """A program that uploads ``source``, runs ``function(*args)`` and returns its value."""
    return {
        "instructions": [
            {"op": "upload", "id": "m", "kind": "module", "source": source},
            {"op": "get_function", "id": "f", "module": {"$ref": "m"}, "name": function},
            {"op": "run", "id": "r", "fn": {"$ref": "f"}, "args": args or []},
            {"op": "return", "key": "value", "value": {"$ref": "r"}},
        ]
    }
