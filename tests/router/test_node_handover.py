"""The supervisor → child hand-over of the node token and the router secret (ROUTER §12)."""

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
    fd = write_secrets(NodeSecrets("node-token", "router-secret"))
    environ = {SECRETS_FD_ENV: str(fd), "PATH": "/bin"}
    secrets = read_secrets(environ)
    assert (secrets.node_token, secrets.router_secret) == ("node-token", "router-secret")
    assert environ == {"PATH": "/bin"}
    assert "node-token" not in repr(secrets) and "router-secret" not in repr(secrets)
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
