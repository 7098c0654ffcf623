"""A router refuses a client token that is also a node token, at start and at a reload
(ROUTER §3).

Node tokens exist so that only a node can receive the clients' programs. A client token file
that repeats the node token (one secret copied everywhere), or a per-node token, let every
holder of that client token connect as a node and be sent the other identities' programs and
data; the router took it without a word, at start and at a ``SIGHUP``.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from identity_support import TOKEN_A, TOKEN_B, TOKEN_LINES, request, token_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from router_helpers import start_router

NODE_TOKEN = "n0de-token-0123456789abcdef"
CLASHING = f"alice {NODE_TOKEN}\nbob {TOKEN_B}\n"


def _refused(tmp_path: Path, *args: str, env: dict[str, str]) -> str:
    try:
        router = start_router(tmp_path, *args, env=env)
    except RuntimeError as exc:
        return str(exc)
    router.stop()
    raise AssertionError("the router started with a client token that is a node token")


def test_a_router_refuses_to_start_with_a_client_token_that_is_a_node_token(
    tmp_path: Path,
) -> None:
    tokens = token_file(tmp_path / "secrets", CLASHING)
    shared = {"KCORAL_NODE_TOKEN": NODE_TOKEN}
    said = _refused(tmp_path, "--auth-token-file", str(tokens), env=shared)
    assert "--auth-token-file the token of 'alice' is also a node token" in said, said
    assert NODE_TOKEN not in said
    per_node = token_file(tmp_path / "nodes", f"gpu-1 {TOKEN_B}\n")  # mode 0600
    said = _refused(
        tmp_path,
        "--node-token-file",
        str(per_node),
        env={"KCORAL_AUTH_TOKEN": TOKEN_LINES},
    )
    assert "KCORAL_AUTH_TOKEN: the token of 'bob' is also a node token" in said, said


def test_a_router_keeps_its_tokens_when_a_reload_makes_a_client_token_a_node_token(
    tmp_path: Path,
) -> None:
    # A short path: the router's log line cuts a value at 120 characters (ROUTER §10).
    with tempfile.TemporaryDirectory(prefix="kc") as short:
        tokens = token_file(Path(short))
        router = start_router(
            tmp_path, "--auth-token-file", str(tokens), env={"KCORAL_NODE_TOKEN": NODE_TOKEN}
        )
        try:
            new = tokens.with_name("tokens.new")
            new.write_text(CLASHING)
            new.chmod(0o600)
            os.replace(new, tokens)
            router.process.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 60  # a hang guard, not a timing check
            while "token_reload_failed" not in router.log():
                assert "tokens_reloaded" not in router.log(), router.log()
                assert time.monotonic() < deadline, "no token_reload_failed"
                time.sleep(0.05)
            problem = "the token of 'alice' is also a node token; the old tokens stay"
            assert f"the token file {problem}" in router.log()
            # the old tokens stay: alice's old one opens the router, the node token does not
            assert request(router.url, "GET", "/no-such-path", TOKEN_A, timeout=30).status == 404
            assert request(router.url, "GET", "/no-such-path", NODE_TOKEN, timeout=30).status == 401
        finally:
            router.stop()
