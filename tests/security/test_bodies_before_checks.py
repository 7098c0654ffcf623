"""Attack: a client without a token makes the server hold large bodies (audit F4).

Before the fix every endpoint but ``/execute`` and ``/v1/jobs`` (``/v1/sessions``,
``/health``, ``/metrics``, unknown paths) let Tornado read the whole body, up to
``--max-request-bytes``, into memory before the browser guard and the token check ran,
with no deadline: four connections without a token declaring 200 MiB each took the
front-end from 49 MB to 868 MB, and no 401 came until the body was complete. Now the checks
run on the request head, so the answer comes before any body byte is sent; an endpoint
that takes a body reads a small one (413 at once above it) within
``--body-timeout-seconds``.

Each answer is read before the body is sent: the server cannot have read it. The socket
timeouts only keep a broken server from hanging the test.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from identity_support import TOKEN_A, token_file
from server_process import RunningServer, start_server

HUGE = 200 * 1024 * 1024  # declared, never sent


@pytest.fixture
def server(tmp_path: Path):
    tokens = token_file(tmp_path / "secrets")
    running = start_server(
        tmp_path / "server", ["--auth-token-file", str(tokens), "--body-timeout-seconds", "2"]
    )
    yield running
    running.stop()


def _head(server: RunningServer, method: str, path: str, length: int, **headers: str) -> str:
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{server.port}"]
    lines += [f"Content-Length: {length}", "Content-Type: application/json"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return "\r\n".join(lines) + "\r\n\r\n"


def _answer_before_the_body(server: RunningServer, head: str) -> tuple[int, dict, bytes]:
    """Send only the head; the answer (status, JSON body, raw head) must come anyway."""
    with socket.create_connection((server.host, server.port), timeout=60) as sock:
        sock.sendall(head.encode())
        raw = b""
        while b"\r\n\r\n" not in raw or not _complete(raw):
            chunk = sock.recv(65536)
            assert chunk, f"connection closed without an answer: {raw!r}"
            raw += chunk
    header, body = raw.split(b"\r\n\r\n", 1)
    return int(header.split()[1]), json.loads(body), header


def _complete(raw: bytes) -> bool:
    header, body = raw.split(b"\r\n\r\n", 1)
    for line in header.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


@pytest.mark.parametrize(
    ("method", "path", "status", "kind"),
    [
        ("POST", "/v1/sessions", 401, "unauthorized"),
        ("GET", "/v1/sessions", 401, "unauthorized"),
        ("POST", "/health", 405, "method_not_allowed"),
        ("GET", "/health", 413, "request_too_large"),  # public: only its size refuses it
        ("GET", "/metrics", 401, "unauthorized"),
        ("POST", "/no/such/path", 401, "unauthorized"),
        ("PUT", "/v1/jobs/some-job", 401, "unauthorized"),
    ],
)
def test_a_client_without_a_token_is_answered_before_its_large_body_is_read(
    server: RunningServer, method: str, path: str, status: int, kind: str
) -> None:
    found, body, header = _answer_before_the_body(server, _head(server, method, path, HUGE))
    assert (found, body["error"]["kind"]) == (status, kind), body
    assert b"connection: close" in header.lower()  # the unread body ends the connection


def test_a_web_page_is_refused_before_its_large_body_is_read(server: RunningServer) -> None:
    for path in ("/v1/sessions", "/health", "/no/such/path"):
        head = _head(server, "POST", path, HUGE, Origin="https://evil.example")
        found, body, _header = _answer_before_the_body(server, head)
        assert (found, body["error"]["kind"]) == (403, "forbidden"), (path, body)


def test_a_token_holder_s_large_session_body_is_413_before_it_is_read(
    server: RunningServer,
) -> None:
    head = _head(server, "POST", "/v1/sessions", HUGE, Authorization=f"Bearer {TOKEN_A}")
    found, body, _header = _answer_before_the_body(server, head)
    assert (found, body["error"]["kind"]) == (413, "request_too_large"), body


def test_a_session_body_that_never_completes_is_dropped(server: RunningServer) -> None:
    """``--body-timeout-seconds`` (2 here) holds for small bodies too: the connection is
    closed, no session is made."""
    head = _head(server, "POST", "/v1/sessions", 100, Authorization=f"Bearer {TOKEN_A}")
    with socket.create_connection((server.host, server.port), timeout=60) as sock:
        sock.sendall(head.encode() + b'{"idle_')  # and then nothing
        assert sock.recv(65536) == b""  # closed by the server, no answer
    listed = _answer_before_the_body(
        server, _head(server, "GET", "/v1/sessions", 0, Authorization=f"Bearer {TOKEN_A}")
    )
    assert listed[:2] == (200, [])
