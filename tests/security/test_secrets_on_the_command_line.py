"""A token typed on the command line is said at start (SERVER §2, ROUTER §11): every local
user reads a process's command line (``ps``), so ``--node-token`` and ``--metrics-token``
hand the token to all of them for as long as the process runs. The attack: another user
on the box lists the processes and finds the token.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from router_helpers import start_router
from server_process import start_server

TOKEN = "s3cr3t-scrape-token-0123456789"


def command_line_of(pid: int) -> str:
    """What any local user reads: the process's command line."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


@pytest.mark.slow
def test_a_server_given_a_metrics_token_flag_says_every_local_user_can_read_it(
    tmp_path: Path,
) -> None:
    server = start_server(tmp_path, ["--metrics-token", TOKEN])
    try:
        assert TOKEN in command_line_of(server.process.pid)  # the attack: ps shows it
    finally:
        server.stop()
    assert (
        "kcoral server: warning: --metrics-token on the command line can be read by every "
        "local user (ps) while kcoral server runs; give it in KCORAL_METRICS_TOKEN instead\n"
    ) in server.stderr()
    assert TOKEN not in server.stderr()


@pytest.mark.slow
def test_a_router_given_a_node_token_flag_says_every_local_user_can_read_it(
    tmp_path: Path,
) -> None:
    router = start_router(tmp_path, f"--node-token={TOKEN}", "--metrics-token", TOKEN + "x")
    try:
        assert TOKEN in command_line_of(router.process.pid)
    finally:
        router.stop()
    said = router.log()
    for flag, variable in [
        ("--node-token", "KCORAL_NODE_TOKEN"),
        ("--metrics-token", "KCORAL_METRICS_TOKEN"),
    ]:
        assert (
            f"kcoral router: warning: {flag} on the command line can be read by every local "
            f"user (ps) while kcoral router runs; give it in {variable} instead"
        ) in said, said
    assert TOKEN not in said


@pytest.mark.slow
def test_a_token_in_the_environment_draws_no_warning(tmp_path: Path) -> None:
    server = start_server(tmp_path, [], env={"KCORAL_METRICS_TOKEN": TOKEN})
    try:
        assert TOKEN not in command_line_of(server.process.pid)
    finally:
        server.stop()
    assert "warning: --metrics-token" not in server.stderr()
