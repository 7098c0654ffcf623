"""A client-token file that is not UTF-8 text says so, at start and at a reload (EXTENSIONS
§6), on a server and on a router.

An operator who saved the file in another encoding (or wrote a token with a stray Latin-1
byte) was told ``cannot be read: UnicodeDecodeError``: a Python class name, and untrue, since
the file was read. Now the message names the problem and where it is, never the bytes
around it (they may be a token).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from server_process import start_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from router_helpers import start_router

GOOD = "alice alice-token-0123456789abcdef\nbob bob-token-0123456789abcdef\n"
#: bob's token with a Latin-1 'é' (0xE9) at byte 40 of the file (from 0): not UTF-8
NOT_UTF8 = b"alice alice-token-0123456789abcdef\nbob b\xe9b-token-0123456789abcdef\n"


def _write(path: Path, data: bytes) -> Path:
    new = path.with_name(path.name + ".new")
    new.write_bytes(data)
    new.chmod(0o600)
    os.replace(new, path)
    return path


def test_a_server_names_a_token_file_that_is_not_utf8_at_start_and_at_a_reload(
    tmp_path: Path,
) -> None:
    tokens = _write(tmp_path / "tokens", NOT_UTF8)
    try:
        start_server(tmp_path / "refused", ["--auth-token-file", str(tokens)])
    except RuntimeError as exc:
        refused = str(exc)
    else:
        raise AssertionError("the server started with a token file that is not UTF-8")
    assert f"--auth-token-file {tokens} is not UTF-8 text (byte 40)" in refused, refused
    assert "UnicodeDecodeError" not in refused and "b\\xe9b" not in refused

    server = start_server(
        tmp_path / "server", ["--auth-token-file", str(_write(tokens, GOOD.encode()))]
    )
    try:
        _write(tokens, NOT_UTF8)
        server.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 60
        while not (failed := [e for e in server.events() if e["event"] == "token_reload_failed"]):
            assert time.monotonic() < deadline, "no token_reload_failed"
            time.sleep(0.05)
        said = failed[0]["message"]
        assert said == "the token file is not UTF-8 text (byte 40); the old tokens stay"
    finally:
        server.stop()


def test_a_router_names_a_token_file_that_is_not_utf8_at_start(tmp_path: Path) -> None:
    tokens = _write(tmp_path / "tokens", NOT_UTF8)
    try:
        start_router(tmp_path, "--auth-token-file", str(tokens), env={"KCORAL_NODE_TOKEN": "n0de"})
    except RuntimeError as exc:
        refused = str(exc)
    else:
        raise AssertionError("the router started with a token file that is not UTF-8")
    assert f"--auth-token-file {tokens} is not UTF-8 text (byte 40)" in refused, refused
    assert "UnicodeDecodeError" not in refused
