"""A ``SIGHUP`` whose token file is a FIFO never freezes a server or a router (EXTENSIONS
§6, token reload).

The reload reads the file on the event loop. Opening a FIFO that no writer holds open waits
for one, so an operator who pointed the path at a pipe (a secret helper's, or one left by a
script) and sent ``SIGHUP`` froze the whole process: every client's request, ``/health``
included, hung until something wrote to the pipe. A reload now reads only a regular file:
anything else keeps the old tokens, says why, and the process serves on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

from identity_support import TOKEN_B, request, token_file
from server_process import start_server
from waiting import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from router_helpers import start_router


def _pipe_for(tokens: Path) -> None:
    """Put a FIFO no writer holds open where the token file was."""
    tokens.unlink()
    os.mkfifo(tokens, 0o600)


def _release(tokens: Path) -> None:
    """Open the FIFO for writing if a reader waits on it (the old code's frozen loop), so
    that the process can stop; nothing when none waits."""
    with contextlib.suppress(OSError):
        os.close(os.open(tokens, os.O_WRONLY | os.O_NONBLOCK))


def test_a_server_given_a_fifo_at_a_reload_keeps_its_tokens_and_serves_on(
    tmp_path: Path,
) -> None:
    tokens = token_file(tmp_path / "secrets")
    server = start_server(tmp_path / "server", ["--auth-token-file", str(tokens)])
    try:
        _pipe_for(tokens)
        server.process.send_signal(signal.SIGHUP)
        failed: list[dict] = []

        def said_why() -> bool:
            failed[:] = [e for e in server.events() if e["event"] == "token_reload_failed"]
            return bool(failed)

        wait_for(said_why, "token_reload_failed", 60.0)
        assert failed[0]["message"] == "the token file is not a regular file; the old tokens stay"
        assert request(server.url, "GET", "/health", timeout=30).status == 200
        assert request(server.url, "GET", "/v1/info", TOKEN_B, timeout=30).json["identity"] == "bob"
    finally:
        _release(tokens)
        server.stop()


def test_a_router_given_a_fifo_at_a_reload_keeps_its_tokens_and_serves_on(
    tmp_path: Path,
) -> None:
    # A path longer than the 120 characters a router log value keeps (ROUTER §10): the
    # message named the path again first, so its problem was cut off.
    tokens = token_file(tmp_path / ("secrets-in-a-folder-with-a-long-name-" + "x" * 90))
    assert len(str(tokens)) > 120
    router = start_router(
        tmp_path, "--auth-token-file", str(tokens), env={"KCORAL_NODE_TOKEN": "n0de-token"}
    )
    try:
        _pipe_for(tokens)
        router.process.send_signal(signal.SIGHUP)
        wait_for(lambda: "token_reload_failed" in router.log(), "token_reload_failed", 60.0)
        assert "the token file is not a regular file; the old tokens stay" in router.log()
        # the router answers, and bob's token still opens it: an unknown path is 404 for
        # him, not 401 (it has no node, so a program would wait for one)
        assert request(router.url, "GET", "/no-such-path", TOKEN_B, timeout=30).status == 404
    finally:
        _release(tokens)
        router.stop()
