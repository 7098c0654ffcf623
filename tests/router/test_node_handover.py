"""The supervisor → child hand-over of the node token, the router secret and the slot key
(ROUTER §12)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from kcoral_server.node.handover import (
    SECRETS_FD_ENV,
    HandoverError,
    NodeSecrets,
    child_environment,
    read_secrets,
    write_secrets,
)


def test_secrets_cross_a_pipe_once_and_leave_no_trace_in_the_environment() -> None:
    fd = write_secrets(NodeSecrets("node-token", "router-secret", "slot-key"))
    environ = {SECRETS_FD_ENV: str(fd), "PATH": "/bin"}
    secrets = read_secrets(environ)
    assert (secrets.node_token, secrets.router_secret, secrets.slot_key) == (
        "node-token",
        "router-secret",
        "slot-key",
    )
    assert environ == {"PATH": "/bin"}
    for secret in ("node-token", "router-secret", "slot-key"):
        assert secret not in repr(secrets)
    with pytest.raises(OSError):
        os.fstat(fd)  # read once, then closed: nothing for a worker to inherit


def test_a_child_without_handed_over_secrets_is_refused() -> None:
    with pytest.raises(HandoverError, match="node supervisor"):
        read_secrets({})
    fd = write_secrets(NodeSecrets(None, ""))
    with pytest.raises(HandoverError, match="router secret"):
        read_secrets({SECRETS_FD_ENV: str(fd)})


def test_the_childs_environment_holds_no_kcoral_credential() -> None:
    environ = {
        "PATH": "/bin",
        "KCORAL_NODE_ID": "n1",
        "KCORAL_NODE_TOKEN": "n",
        "KCORAL_AUTH_TOKEN": "a",
        "KCORAL_TOKEN": "c",
        "KCORAL_OTHER_SECRET": "s",
        SECRETS_FD_ENV: "9",
    }
    assert child_environment(environ) == {"PATH": "/bin", "KCORAL_NODE_ID": "n1"}


def test_a_node_child_started_by_hand_exits_2() -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("KCORAL_")}
    finished = subprocess.run(
        [
            sys.executable,
            "-m",
            "kcoral",
            "server",
            "--node-child",
            "--router",
            "http://127.0.0.1:9",
            "--node-id",
            "n1",
        ],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert finished.returncode == 2
    assert "supervisor" in finished.stderr


def test_a_node_whose_server_would_refuse_its_settings_stops_before_supervising(
    tmp_path,
) -> None:
    """`--sandbox bubblewrap` where bwrap cannot run: the child would exit 2, so the
    supervisor says why and exits 2 at once instead of restarting it forever."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    bwrap = stubs / "bwrap"
    bwrap.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    bwrap.chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}"}
    env.pop("KCORAL_NODE_TOKEN", None)
    command = [sys.executable, "-m", "kcoral", "server", "--router", "http://127.0.0.1:9"]
    command += ["--node-id", "n1", "--sandbox", "bubblewrap", "--log-dir", ""]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "bubblewrap" in done.stderr and "Permission denied" in done.stderr
    assert "server_child_started" not in done.stderr


SUPERVISE_A_REFUSING_CHILD = """
import asyncio, sys
from kcoral_server.settings.command_line import parse_server_args
from kcoral_server.node.supervisor import Supervisor

argv = ["--router", "http://127.0.0.1:9", "--node-id", "n1", "--log-dir", "",
        "--restart-min-delay-seconds", "0.05", "--startup-grace-seconds", "0"]
settings = parse_server_args(argv, {})
supervisor = Supervisor(settings, argv, {"PATH": "/usr/bin:/bin"})
supervisor.child_command = (sys.executable, "-c",
    "import sys; open(sys.argv[1], 'a').write('x'); "
    "sys.stderr.write('kcoral server: refused for a test\\\\n'); sys.exit(2)",
    sys.argv[1])
sys.exit(asyncio.run(supervisor.run()))
"""


def test_a_child_that_exits_with_a_usage_error_is_not_restarted(tmp_path) -> None:
    starts = tmp_path / "starts"
    done = subprocess.run(
        [sys.executable, "-c", SUPERVISE_A_REFUSING_CHILD, str(starts)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "kcoral server: refused for a test" in done.stderr
    assert "server_child_refused_settings" in done.stderr
    assert starts.read_text() == "x"  # started once, never restarted
