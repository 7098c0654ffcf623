"""Helpers of the secrets and sandbox-default attack tests: raw HTTP to a real server.

The attacker here is a *program*: it is uploaded like any other and reports what it could
read. Raw HTTP (with an optional bearer token) keeps the client library out of the way.
"""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any

from kcoral.protocol.multipart import boundary_from_content_type, encode_multipart, parse_multipart


def bwrap_problem() -> str | None:
    """Why bubblewrap cannot run here (None: it can)."""
    from kcoral_server.processes.sandbox import probe

    return probe()


def broken_bwrap(directory: Path) -> Path:
    """A directory holding a ``bwrap`` that always fails, to put first on ``PATH``."""
    directory.mkdir(parents=True, exist_ok=True)
    stub = directory / "bwrap"
    stub.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    stub.chmod(0o755)
    return directory


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


def request(
    url: str, method: str, path: str, token: str | None = None, timeout: float = 120.0
) -> tuple[int, Any]:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        connection.request(method, path, headers=headers)
        answer = connection.getresponse()
        raw = answer.read()
    finally:
        connection.close()
    return answer.status, json.loads(raw) if raw else None


def execute(
    url: str,
    program: dict,
    token: str | None = None,
    timeout: float = 180.0,
    status: int = 200,
) -> Any:
    """``POST /execute``; the decoded result JSON (asserts the answer's ``status``)."""
    content_type, chunks, _length = encode_multipart(
        [("program", "application/json", json.dumps(program).encode())]
    )
    body = b"".join(bytes(c) for c in chunks)
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    headers = {"Content-Type": content_type}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        connection.request("POST", "/execute", body, headers)
        answer = connection.getresponse()
        raw = answer.read()
        kind = answer.headers.get("Content-Type", "")
    finally:
        connection.close()
    assert answer.status == status, (answer.status, raw[:2000])
    if kind.startswith("multipart/"):
        parts = parse_multipart(memoryview(raw), boundary_from_content_type(kind))
        return json.loads(bytes(next(p.data for p in parts if p.name == "result")))
    return json.loads(raw)


def returned(result: dict) -> Any:
    """What a ``run_source`` program returned as ``json.dumps(...)`` text, decoded (asserts
    that it completed)."""
    assert result["status"] == "COMPLETED", result
    node = result["results"]["value"]
    assert node["type"] == "string", node
    return json.loads(node["value"])
