"""A node (``kcoral server --router``) whose ``--port`` another process holds: every start of
its child failed alike, and the supervisor restarted it with back-off for ever (a Slurm node
job held its allocation serving nothing; the router listed the node as unhealthy). Now the
supervisor says so and exits 1 before it starts anything (ROUTER §12)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)


def test_a_node_whose_port_is_taken_exits_saying_so_instead_of_restarting_for_ever(
    tmp_path: Path,
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        try:
            node = subprocess.run(
                [sys.executable, "-m", "kcoral", "server", "--router", "http://127.0.0.1:9",
                 "--node-id", "slurm-7-gpu01", "--port", str(port),
                 "--device", "cpu", "--sandbox", "none", "--log-dir", "",
                 "--disk-cache-dir", ""],
                capture_output=True, text=True, timeout=60, cwd=tmp_path,
                env={**os.environ, "KCORAL_NODE_TOKEN": "t0k"},
            )  # fmt: skip
        except subprocess.TimeoutExpired as running:
            raise AssertionError(f"it kept restarting its child: {running.stderr!r}") from None
    assert node.returncode == 1, node.stderr
    said = node.stderr.strip().splitlines()[-1]
    assert said.startswith(f"kcoral server: cannot listen on 127.0.0.1:{port}: "), said
    assert "choose another --port (0 picks a free one)" in said
    assert "server_child_started" not in node.stderr
