"""``kcoral run`` sent to a server that is shutting down says so, and what to do.

The server refuses it with 503 ``busy`` and PROTOCOL §7.1's message, ``server saturated: the
server is shutting down``; ``kcoral run`` printed that under ``server error: HTTP 503:``,
which read as an overloaded server and said nothing of running again.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from server_process import start_server
from waiting import wait_for

pytestmark = pytest.mark.timeout(180)


def kcoral_run(url: str, code: str) -> list[str]:
    return [sys.executable, "-m", "kcoral", "run", "python", "--url", url, "--", "-c", code]


def test_a_run_sent_while_the_server_shuts_down_says_so_and_to_run_again(
    tmp_path: Path,
) -> None:
    server = start_server(tmp_path / "server", ["--num-workers", "1"])
    started, gate = tmp_path / "started", tmp_path / "gate"
    # A tool that holds the server's shutdown open until the test lets it end.
    holding = (
        "import os, time\n"
        f"open({str(started)!r}, 'w').close()\n"
        f"while not os.path.exists({str(gate)!r}): time.sleep(0.05)\n"
    )
    first = subprocess.Popen(
        kcoral_run(server.url, holding),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(started.exists, "the first tool to start", 60.0)
        server.process.send_signal(signal.SIGTERM)
        wait_for(
            lambda: "shutdown_started" in {e["event"] for e in server.events()}, "the drain", 60.0
        )
        second = subprocess.run(
            kcoral_run(server.url, "print(1)"),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (second.returncode, second.stdout) == (1, "")
        assert second.stderr == (
            "kcoral run: the server is shutting down and did not run the tool; run again "
            "once it is back\n"
        )
    finally:
        gate.touch()
        first.communicate(timeout=60)
        server.stop()
    assert first.returncode == 0  # the running one was let finish


def test_a_run_a_stopping_router_no_longer_takes_says_the_router_is_shutting_down() -> None:
    # A router that stops answers what it no longer queues 503 no_node "the router is
    # shutting down" (ROUTER §7, pinned by the router's tests); kcoral run printed it under
    # "server error: HTTP 503:", as if a server failed.
    from kcoral.errors import KCoralError
    from kcoral.run.command import server_error

    refused = KCoralError(503, "the router is shutting down", kind="no_node")
    assert server_error(refused, "http://router:9000") == (
        "the router is shutting down and did not run the tool; run again once it is back"
    )
