"""A client without a token (or any web client that reaches the router's port) sends a body
to a route that takes none: ``/health``, ``/metrics``, an unknown path.

Before, Tornado read such a body whole into the router's memory before any check ran, up to
the router's unbounded limit: one ``POST /health`` declaring 400 MiB got no answer until
400 MiB had arrived, and the router then held them. Now the head decides: a refused request
(401, 404) is answered at once and its body never read; a larger declared body than 64 KiB
is 413 at once; a chunked one is cut off past 64 KiB. A real router process, raw sockets.
"""

from __future__ import annotations

import http.client
import socket
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raw_http import read_until_closed
from router_helpers import RouterProcess, start_router

TOKEN = "client-token-for-body-tests"
DECLARED = 400 << 20
#: how long a test waits for an answer that must come from the head alone: a guard against
#: a hang (the old router waited for the whole body), not a measured time
GUARD_SECONDS = 20


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("router-bodies")
    tokens = tmp / "tokens"
    tokens.write_text(TOKEN + "\n")
    tokens.chmod(0o600)
    started = start_router(
        tmp, "--auth-token-file", str(tokens), env={"KCORAL_NODE_TOKEN": "node-token-x"}
    )
    yield started
    started.process.terminate()
    started.process.wait(30)


def health_status(router: RouterProcess) -> int:
    """The router's ``GET /health`` status (503 without nodes): it still serves."""
    connection = http.client.HTTPConnection("127.0.0.1", router.port, timeout=GUARD_SECONDS)
    try:
        connection.request("GET", "/health")
        return connection.getresponse().status
    finally:
        connection.close()


def head_only(router: RouterProcess, method: str, path: str, token: str | None) -> bytes:
    """Send a request head declaring a 400 MiB body and none of it; the whole answer."""
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    with socket.create_connection(("127.0.0.1", router.port), timeout=GUARD_SECONDS) as sock:
        sock.sendall(
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}"
            f"Content-Length: {DECLARED}\r\n\r\n".encode()
        )
        return read_until_closed(sock)


@pytest.mark.parametrize(
    ("method", "path", "token", "status"),
    [
        ("POST", "/health", None, b"405"),
        ("GET", "/health", None, b"413"),
        ("POST", "/metrics", TOKEN, b"405"),
        ("GET", "/metrics", TOKEN, b"413"),
        ("POST", "/metrics", None, b"401"),
        ("POST", "/no-such-path", None, b"401"),
        ("PUT", "/no-such-path", TOKEN, b"404"),
    ],
)
def test_a_large_body_on_a_route_without_one_is_answered_from_the_head_and_never_read(
    router: RouterProcess, method: str, path: str, token: str | None, status: bytes
) -> None:
    answer = head_only(router, method, path, token)
    assert answer.startswith(b"HTTP/1.1 " + status), answer[:300]
    assert b'"status":"ERROR"' in answer
    assert b"connection: close" in answer.lower()
    # and the router serves on
    assert health_status(router) in (200, 503)


def test_a_chunked_body_to_health_is_cut_off_past_64_kib(router: RouterProcess) -> None:
    sent = 0
    chunk = b"x" * (16 << 10)
    with socket.create_connection(("127.0.0.1", router.port), timeout=GUARD_SECONDS) as sock:
        sock.sendall(
            b"POST /health HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        try:
            while sent < DECLARED:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
    # the router stopped reading long before 400 MiB: its socket buffers hold a few MiB
    assert sent < 64 << 20
    assert health_status(router) in (200, 503)
