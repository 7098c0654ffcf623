"""A token file is read strictly and boundedly (EXTENSIONS §6, ROUTER §3): a token is
printable ASCII without spaces, and a file over 1 MiB is refused after reading one byte
past the bound, on a server and on a router, at start and at a ``SIGHUP`` reload.

Before, a token holding a NUL (or any control character) was taken, though no client sends
it the same way; and a token file of any size was read whole into memory: at start (a path
pointed at a disk image, ``/dev/zero``) and at a reload, on the event loop, every request
(``/health`` included) waiting for it. A 5 MiB file of one line was even served as one bare
token, revoking every named identity.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from identity_support import TOKEN_A, TOKEN_B, TOKEN_LINES, request, token_file
from kcoral_server.front_door.callers import Identity, parse_tokens
from kcoral_server.settings.config import InvalidConfigError, ServerConfig
from server_process import start_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from router_helpers import start_router
from waiting import wait_for

NODE_ENV = {"KCORAL_NODE_TOKEN": "n0de-token"}
#: bob's token with a NUL in it: what a file written by a careless script may hold
WITH_NUL = "alice alice-token-0123456789abcdef\nbob bob-token\x00-0123456789abcdef\n"
NUL_PROBLEM = "line 2: the token of 'bob' is not printable ASCII"
#: one line of 5 MiB: a single bare token, as the old reader took it
HUGE = "h" * (5 << 20) + "\n"
HUGE_PROBLEM = "is larger than 1 MiB, the bound of a token file"
BAD_FILES = [(WITH_NUL, NUL_PROBLEM), (HUGE, HUGE_PROBLEM)]
#: a "NAME TOKEN" file cut to one word: a bare token, good at start but never at a reload
#: of named identities (it revoked them all, and the word became a valid token)
CUT_TO_A_NAME = "alice\n"
CUT_PROBLEM = "holds a bare token where it named identities: restart to change its form"
BAD_AT_RELOAD = [*BAD_FILES, (CUT_TO_A_NAME, CUT_PROBLEM)]
RELOAD_ENDS = ("token_reload_failed", "tokens_reloaded")


def _put(path: Path, text: str) -> Path:
    """Replace ``path`` at once with ``text`` (mode 0600), as an operator's tool would."""
    new = path.with_name(path.name + ".new")
    new.write_text(text, encoding="utf-8")
    new.chmod(0o600)
    os.replace(new, path)
    return path


def _refusal(start: Callable[[], Any], what: str) -> str:
    """What a process said when it refused to start (``start`` raises RuntimeError); one
    that started is stopped, then the test fails."""
    try:
        started = start()
    except RuntimeError as exc:
        return str(exc)
    started.stop()
    raise AssertionError(f"{what} started with a token file it must refuse")


def test_a_token_is_printable_ascii_and_whitespace_only_separates() -> None:
    for text in ("tok\x00en", "alice TA\x00", "alice TA\x1b[0m", "alice TA\x7f", "alice T\xe9A"):
        with pytest.raises(ValueError, match="is not printable ASCII"):
            parse_tokens(text)
    # whitespace of any kind (a no-break space pasted from a web page) separates fields
    assert parse_tokens("alice\u00a0TA\r\nbob  TB\tadmin\r\n# Zoë's\n") == {
        "TA": Identity("alice"),
        "TB": Identity("bob", admin=True),
    }


@pytest.mark.parametrize(("text", "problem"), BAD_FILES, ids=["nul", "huge"])
def test_a_server_and_a_router_refuse_to_start_with_a_bad_token_file(
    tmp_path: Path, text: str, problem: str
) -> None:
    tokens = _put(tmp_path / "tokens", text)
    said = _refusal(
        lambda: start_server(tmp_path / "server", ["--auth-token-file", str(tokens)]), "a server"
    )
    # the option, the file, the problem (after a comma where it names a line)
    refused = f"--auth-token-file {tokens}{',' if problem.startswith('line') else ''} {problem}"
    assert refused in said, said
    said = _refusal(
        lambda: start_router(tmp_path, "--auth-token-file", str(tokens), env=NODE_ENV), "a router"
    )
    assert refused in said, said
    assert "bob-token" not in said


def test_a_token_given_where_its_file_goes_is_refused_saying_so_without_showing_it(
    tmp_path: Path,
) -> None:
    # `--auth-token-file s3cret`: before, only "cannot be read: No such file or directory",
    # which did not say that the option takes a file and the variable the token
    pasted = "pasted-token-0123456789abcdef"
    expected = (
        "--auth-token-file cannot be read: No such file or directory (it names a file holding "
        "the token; KCORAL_AUTH_TOKEN takes the token itself)"
    )
    said = _refusal(
        lambda: start_server(tmp_path / "server", ["--auth-token-file", pasted]), "a server"
    )
    assert expected in said and pasted not in said, said
    said = _refusal(
        lambda: start_router(tmp_path, "--auth-token-file", pasted, env=NODE_ENV), "a router"
    )
    assert expected in said and pasted not in said, said


def test_a_router_refuses_a_node_token_file_over_the_bound(tmp_path: Path) -> None:
    nodes = _put(tmp_path / "nodes", "gpu-1 " + "n" * (2 << 20) + "\n")
    said = _refusal(lambda: start_router(tmp_path, "--node-token-file", str(nodes)), "a router")
    assert f"--node-token-file {HUGE_PROBLEM}" in said, said


def test_a_server_keeps_its_tokens_and_serves_on_when_a_reload_finds_a_bad_file(
    tmp_path: Path,
) -> None:
    tokens = token_file(tmp_path / "secrets")
    server = start_server(tmp_path / "server", ["--auth-token-file", str(tokens)])

    def reload_outcomes() -> list[dict]:
        return [e for e in server.events() if e["event"] in RELOAD_ENDS]

    try:
        for number, (text, problem) in enumerate(BAD_AT_RELOAD, start=1):
            _put(tokens, text)
            server.process.send_signal(signal.SIGHUP)
            wait_for(lambda n=number: len(reload_outcomes()) >= n, "end of the reload", 60.0)
            last = reload_outcomes()[-1]
            assert last["event"] == "token_reload_failed", last
            assert last["message"] == f"the token file {problem}; the old tokens stay"
            assert request(server.url, "GET", "/health", timeout=30).status == 200
            info = request(server.url, "GET", "/v1/info", TOKEN_B, timeout=30)
            assert info.json["identity"] == "bob"
            assert request(server.url, "GET", "/v1/info", "alice", timeout=30).status == 401
    finally:
        server.stop()


def test_a_reload_to_one_identity_named_default_is_a_named_file_not_a_bare_token(
    tmp_path: Path,
) -> None:
    # 'default TOKEN' names an identity (the one a bare token's caller has): a reload that
    # keeps only it was refused as 'holds a bare token where it named identities', and the
    # operator could not revoke the others without a restart.
    tokens = token_file(tmp_path / "secrets")
    server = start_server(tmp_path / "server", ["--auth-token-file", str(tokens)])
    try:
        _put(tokens, f"default {TOKEN_B}\n")
        server.process.send_signal(signal.SIGHUP)
        wait_for(lambda: any(e["event"] in RELOAD_ENDS for e in server.events()), "reload", 60.0)
        last = [e for e in server.events() if e["event"] in RELOAD_ENDS][-1]
        assert last["event"] == "tokens_reloaded", last
        info = request(server.url, "GET", "/v1/info", TOKEN_B, timeout=30)
        assert info.json["identity"] == "default"
        assert request(server.url, "GET", "/v1/info", TOKEN_A, timeout=30).status == 401
    finally:
        server.stop()


def test_a_router_keeps_its_tokens_and_serves_on_when_a_reload_finds_a_bad_file(
    tmp_path: Path,
) -> None:
    # A short path: the router's log line cuts a value at 120 characters (ROUTER §10).
    with tempfile.TemporaryDirectory(prefix="kc") as short:
        tokens = token_file(Path(short))
        router = start_router(tmp_path, "--auth-token-file", str(tokens), env=NODE_ENV)

        def reload_outcomes() -> int:
            return sum(router.log().count(end) for end in RELOAD_ENDS)

        try:
            for number, (text, problem) in enumerate(BAD_AT_RELOAD, start=1):
                _put(tokens, text)
                router.process.send_signal(signal.SIGHUP)
                wait_for(lambda n=number: reload_outcomes() >= n, "end of the reload", 60.0)
                assert "tokens_reloaded" not in router.log()
                assert f"the token file {problem}; the old tokens stay" in router.log()
                # it answers /health: 503, as a router without a node does
                assert request(router.url, "GET", "/health", timeout=30).status == 503
                # bob's token still opens it: an unknown path is 404 for him, not 401
                answer = request(router.url, "GET", "/no-such-path", TOKEN_B, timeout=30)
                assert answer.status == 404
                answer = request(router.url, "GET", "/no-such-path", "alice", timeout=30)
                assert answer.status == 401
        finally:
            router.stop()


def test_a_token_file_saved_with_a_byte_order_mark_is_read_as_its_text(tmp_path: Path) -> None:
    # Notepad saves UTF-8 with a BOM: the first token (or name) was refused, or served with
    # an invisible character in front that no client sends, so every request got 401.
    tokens = _put(tmp_path / "tokens", "\ufeff" + TOKEN_LINES)
    server = start_server(tmp_path / "server", ["--auth-token-file", str(tokens)])
    try:
        info = request(server.url, "GET", "/v1/info", TOKEN_A, timeout=30)
        assert (info.status, info.json.get("identity")) == (200, "alice")
    finally:
        server.stop()
    router = start_router(tmp_path, "--auth-token-file", str(tokens), env=NODE_ENV)
    try:
        assert request(router.url, "GET", "/no-such-path", TOKEN_A, timeout=30).status == 404
    finally:
        router.stop()


def test_a_server_config_refuses_a_token_text_it_cannot_serve_naming_auth_token() -> None:
    # Python callers (``kcoral.ServerConfig``, CLIENT_API §1.1) get the rules of the file at
    # construction; before, the config was built and ``create_app`` raised a bare ValueError
    # ('line 1: the token is not printable ASCII') that named no setting.
    for text, problem in [
        ("tok\x00en", "line 1: the token is not printable ASCII"),
        ("alice TA\nalice TB", "line 2: identity 'alice' is listed twice"),
        (" \n", "is empty"),
    ]:
        with pytest.raises(InvalidConfigError) as refused:
            ServerConfig(auth_token=text)
        assert str(refused.value) == f"auth_token {problem}"
