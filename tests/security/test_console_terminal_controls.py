"""Attack: what a caller or a program chooses reaches the server's console with terminal
controls in it, and rewrites the operator's screen.

The console mirror escaped only line breaks, and Tornado's access line quotes the request
path as sent (its request line is read as Latin-1, so the bytes 0x80-0x9F arrive as C1
controls; 0x9B is CSI). A token holder's program failing with ``ESC[1A ESC[2K`` in its
message erased the console line before it and forged one, and anyone who can connect, with
no token, sent ``GET /v1/info<0x9B>8m``: its own 401 line went on hidden, with everything
after it, on a server's console (the access line) and on a router's (``request_finished``,
whose values were quoted only when they held a space). Control characters but tab are now
written ``\\xNN`` in all of them.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

from identity_support import TOKEN_B, token_file
from sandbox_default_support import execute, run_source
from server_process import start_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))
from router_helpers import start_router

FORGED = "2026-12-05T00:00:00.000Z ERROR   forged_event by=bob-7f3a"
# Cursor up and erase the line (the line before is gone from the operator's screen), set
# the window title, and C1's CSI.
TERMINAL_CONTROLS = "\x1b[1A\x1b[2K\x1b]0;owned\x07\x9b2K"
RAISE_WITH_CONTROLS = f"def main():\n    raise RuntimeError({TERMINAL_CONTROLS + FORGED!r})\n"


def _controls(console: str) -> list[str]:
    return [c for c in console if c not in "\t\n" and not c.isprintable()]


def test_a_programs_error_message_cannot_rewrite_lines_on_the_servers_console(
    tmp_path: Path,
) -> None:
    server = start_server(tmp_path / "server", ["--auth-token-file", str(token_file(tmp_path))])
    try:
        failed = execute(server.url, run_source(RAISE_WITH_CONTROLS), TOKEN_B)
    finally:
        server.stop()
    assert failed["status"] == "FAILED", failed
    assert TERMINAL_CONTROLS in failed["error"]["message"]  # the caller still gets it whole
    console = server.stderr()
    line = next(text for text in console.splitlines() if "error_message=" in text)
    assert "RuntimeError: \\x1b[1A\\x1b[2K\\x1b]0;owned\\x07\\x9b2K" in line, line
    assert _controls(console) == []


def test_a_caller_without_a_token_cannot_hide_its_refusal_on_the_servers_console(
    tmp_path: Path,
) -> None:
    server = start_server(tmp_path / "server", ["--auth-token-file", str(token_file(tmp_path))])
    try:
        with socket.create_connection((server.host, server.port), timeout=30) as caller:
            # conceal everything after it (SGR 8), then move up a line
            caller.sendall(b"GET /v1/info\x9b8m\x9b1A HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            answer = caller.recv(64)
    finally:
        server.stop()
    assert answer.startswith(b"HTTP/1.1 401 "), answer
    console = server.stderr()
    assert "401 GET /v1/info\\x9b8m\\x9b1A (127.0.0.1)" in console, console[-2000:]
    assert _controls(console) == []


def test_a_caller_without_a_token_cannot_hide_its_refusal_on_the_routers_console(
    tmp_path: Path,
) -> None:
    """The router's ``request_finished`` line names the path; its values were quoted (repr)
    only when they held a space, so a C1 control went to the terminal as sent."""
    router = start_router(
        tmp_path, env={"KCORAL_AUTH_TOKEN": TOKEN_B, "KCORAL_NODE_TOKEN": "node-" + TOKEN_B}
    )
    try:
        with socket.create_connection(("127.0.0.1", router.port), timeout=30) as caller:
            caller.sendall(b"GET /v1/info\x9b8m\x9b1A HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            answer = caller.recv(64)
    finally:
        router.stop()
    assert answer.startswith(b"HTTP/1.1 401 "), answer
    console = router.log_path.read_text(encoding="utf-8")
    assert "path=/v1/info\\x9b8m\\x9b1A " in console, console[-2000:]
    assert _controls(console) == []
