"""Helpers of the identity attack tests: a server with named client tokens and raw HTTP.

The attacker (another token holder) speaks raw HTTP, as an attacker would, so that nothing in
our client filters what the server answers; the victim uses the real client.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kcoral

TOKEN_A = "alice-token-0123456789abcdef"
TOKEN_B = "bob-token-0123456789abcdef"
TOKEN_R = "root-token-0123456789abcdef"
TOKEN_LINES = f"alice {TOKEN_A}\nbob {TOKEN_B}\nroot {TOKEN_R} admin\n"
BOUNDARY = "kcoral-identity-test"


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    raw: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.raw)

    def error_without_request_id(self) -> tuple[int, Any]:
        """Status and JSON body with the per-request id removed (what must not differ)."""
        body = self.json
        body.pop("request_id", None)
        return self.status, body


def token_file(directory: Path, text: str = TOKEN_LINES) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tokens"
    path.write_text(text, encoding="utf-8")
    os.chmod(path, 0o600)
    return path


def request(
    url: str,
    method: str,
    path: str,
    token: str | None = None,
    body: bytes | None = None,
    content_type: str | None = None,
    timeout: float = 120.0,
    *,
    stream: bool = False,
) -> Answer:
    """One request on a fresh connection. ``stream``: a 200 answer's body is not read (an
    event stream of a running job would not end)."""
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    headers = {}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if content_type is not None:
        headers["Content-Type"] = content_type
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        raw = b"" if stream and response.status == 200 else response.read()
        return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, raw)
    finally:
        connection.close()


def execute(url: str, program: dict, token: str, blobs: dict[str, bytes] | None = None) -> Answer:
    """``POST /execute`` with the program and exactly the blob parts given (none: by hash)."""
    parts = [("program", "application/json", json.dumps(program).encode())]
    parts += [
        (f"blob:{sha}", "application/octet-stream", data) for sha, data in (blobs or {}).items()
    ]
    body = b""
    for name, kind, data in parts:
        head = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n'
        body += f"{head}Content-Type: {kind}\r\n\r\n".encode() + data + b"\r\n"
    body += f"--{BOUNDARY}--\r\n".encode()
    return request(
        url, "POST", "/execute", token, body, f"multipart/form-data; boundary={BOUNDARY}"
    )


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


READ_FILE = "def f(path):\n    with open(path, 'rb') as handle:\n        return handle.read()\n"
ECHO = "def f(value):\n    return value\n"


def file_program(blob: str) -> dict:
    """Upload ``blob`` as the file ``in.bin`` (by hash) and return the file's bytes."""
    return {
        "instructions": [
            {"op": "upload", "kind": "file", "blob": blob, "path": "in.bin"},
            {"op": "upload", "kind": "module", "id": "m", "source": READ_FILE},
            {"op": "get_function", "id": "f", "module": {"$ref": "m"}, "name": "f"},
            {"op": "run", "id": "r", "fn": {"$ref": "f"}, "args": ["in.bin"]},
            {"op": "return", "key": "r", "value": {"$ref": "r"}},
        ]
    }


def bytes_program(blob: str) -> dict:
    """Upload ``blob`` as a ``bytes`` value (memory cache, by hash) and return it."""
    return {
        "instructions": [
            {"op": "upload", "kind": "bytes", "id": "b", "blob": blob},
            {"op": "upload", "kind": "module", "id": "m", "source": ECHO},
            {"op": "get_function", "id": "f", "module": {"$ref": "m"}, "name": "f"},
            {"op": "run", "id": "r", "fn": {"$ref": "f"}, "args": [{"$ref": "b"}]},
            {"op": "return", "key": "r", "value": {"$ref": "r"}},
        ]
    }


def module_program(source: str, *args: object) -> kcoral.Program:
    """The victim's program: ``f(*args)`` of the module ``source``, its value as ``r``."""
    program = kcoral.Program()
    module = program.upload(kind="module", source=source, id="m")
    fn = program.get_function(module=module, name="f", id="fn")
    program.return_(key="r", value=program.run(fn=fn, args=list(args), id="r"))
    return program
