"""``kcoral run`` through a router that has no ready node: its ``/v1/info`` answers 503
``no_node`` (ROUTER §7), and the run ends there with that line. Before, the 503 was taken
for a server without jobs, the run was sent as ``/execute``, which waited in the router's
queue for minutes without a word, and an interrupt then said the remote tool was cancelled.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from stand_in_http import StandIn, serving

pytestmark = pytest.mark.timeout(120)

NO_NODE = "no node is ready (the router's /health says when one is, its log why not)"
SUBMITTED: list[str] = []


class RouterWithoutANode(StandIn):
    """Answers ``/v1/info`` as a router without a ready node does; records submissions."""

    def do_GET(self) -> None:
        error = {"kind": "no_node", "message": NO_NODE}
        self.send_json(
            {"status": "ERROR", "request_id": "r", "error": error}, 503, {"Retry-After": "1"}
        )

    def do_POST(self) -> None:
        SUBMITTED.append(self.path)
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_a_router_without_a_ready_node_ends_the_run_with_its_503(tmp_path: Path) -> None:
    with serving(RouterWithoutANode) as url:
        command = [sys.executable, "-m", "kcoral", "run", "python", "--url", url, "--",
                   "-c", "print(1)"]  # fmt: skip
        ran = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (ran.returncode, ran.stdout) == (1, "")
    assert ran.stderr == f"kcoral run: server error: HTTP 503: {NO_NODE}\n"
    assert SUBMITTED == []
