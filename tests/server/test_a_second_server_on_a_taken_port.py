"""The first-hour mistake of starting a second server (or a router) on the port a real
``kcoral server`` already holds: the refusal says what to do. Before, it ended with the
system's words alone (``[Errno 98] Address already in use``), and the router's did not say
which address."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from server_process import running_server

pytestmark = pytest.mark.timeout(120)

WHAT_TO_DO = (
    "another process listens there (a server already running?): stop it, or choose another "
    "--port (0 picks a free one)"
)


def test_a_server_or_router_on_a_taken_port_says_to_stop_the_other_or_choose_another_port(
    tmp_path: Path,
) -> None:
    with running_server(tmp_path / "first", ["--log-dir", ""]) as first:
        port = first.port
        second = subprocess.run(
            [sys.executable, "-m", "kcoral", "server", "--device", "cpu", "--port", str(port),
             "--log-dir", "", "--disk-cache-dir", ""],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        router = subprocess.run(
            [sys.executable, "-m", "kcoral", "router", "--port", str(port)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert second.returncode == 1, second.stderr
    said = second.stderr.strip().splitlines()[-1]
    assert said.startswith(f"kcoral server: cannot listen on 127.0.0.1:{port}: "), said
    assert said.endswith(f"Address already in use; {WHAT_TO_DO}"), said
    assert router.returncode == 1, router.stderr
    said = router.stderr.strip().splitlines()[-1]
    assert said.startswith(f"kcoral router: error: cannot listen on 127.0.0.1:{port}: "), said
    assert said.endswith(f"Address already in use; {WHAT_TO_DO}"), said
