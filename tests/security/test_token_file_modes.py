"""A client-token file that others can read gets a warning at start (server and router).

Attacker: another user of the machine. Whoever can read the token file may act as any
identity it names (an admin one included); whoever can write it may add their own. The
docs' commands wrote such files 0644 under the default umask, and a server or router
started with them said nothing. Now both log a ``token_file_open`` WARNING naming the mode
and the fix; a file only its owner (and its group, for a Kubernetes Secret) reads is quiet.
A warning, not a refusal: a deployment that started before still starts.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from server_process import start_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from router_helpers import start_router

TOKENS = "alice alice-token-0123456789abcdef\n"


def _token_file(directory: Path, mode: int) -> Path:
    path = directory / "tokens"
    path.write_text(TOKENS)
    path.chmod(mode)
    return path


@pytest.mark.parametrize(("mode", "warned"), [(0o644, True), (0o660, True), (0o600, False)])
def test_a_server_warns_about_a_token_file_others_can_read_or_its_group_write(
    tmp_path: Path, mode: int, warned: bool
) -> None:
    tokens = _token_file(tmp_path, mode)
    server = start_server(tmp_path / "server", ["--auth-token-file", str(tokens)])
    try:
        found = [e for e in server.events() if e.get("event") == "token_file_open"]
    finally:
        server.stop()
    assert bool(found) == warned, found
    if warned:
        (record,) = found
        assert record["level"] == "WARNING"
        assert f"{mode:04o}" in record["message"] and "chmod 600" in record["message"]


@pytest.mark.parametrize(("mode", "warned"), [(0o644, True), (0o440, False)])
def test_a_router_warns_about_a_token_file_others_can_read(
    tmp_path: Path, mode: int, warned: bool
) -> None:
    """0440 is the Kubernetes Secret's mode (root-owned, read by the pod's fsGroup)."""
    tokens = _token_file(tmp_path, mode)
    router = start_router(
        tmp_path, "--auth-token-file", str(tokens), env={"KCORAL_NODE_TOKEN": "node-secret"}
    )
    try:
        router.wait_log("router_started")
    finally:
        router.stop()
    log = router.wait_log("router_stopped")  # everything it said at start is in by now
    assert ("token_file_open" in log) == warned, log
    if warned:
        assert "WARNING" in log and "0644" in log and "chmod 600" in log
        assert f"path={tokens}" in log  # which file, as the server's event names it
