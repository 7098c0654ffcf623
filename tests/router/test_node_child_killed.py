"""A node's server killed by a signal is named by it in the supervisor's
``server_child_restarting`` line (ROUTER §12) and the status it reports: 'KCoral Server was
killed by SIGKILL'.

Before, the line read 'KCoral Server exited with status -9', Popen's code for a signal,
which reads as if the server had exited of itself with a negative status.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psutil
from router_helpers import RouterProcess, node_command
from waiting import wait_for


def test_a_child_killed_by_a_signal_is_named_by_the_signal(
    tmp_path: Path, router: RouterProcess
) -> None:
    log_path = tmp_path / "node.log"
    environment = {k: v for k, v in os.environ.items() if k != "KCORAL_NODE_TOKEN"}
    with open(log_path, "w") as log:
        supervisor = subprocess.Popen(
            node_command(tmp_path, router.url, "n1"),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environment,
        )
    try:
        wait_for(lambda: "server_child_started" in log_path.read_text(), "child start", 60.0)
        child = psutil.Process(supervisor.pid).children()[0]
        wait_for(lambda: "tunnel_started" in log_path.read_text(), "child serving", 60.0)
        child.send_signal(signal.SIGKILL)
        wait_for(lambda: "server_child_restarting" in log_path.read_text(), "restart line", 60.0)
        line = next(
            entry
            for entry in log_path.read_text().splitlines()
            if "server_child_restarting" in entry
        )
    finally:
        supervisor.send_signal(signal.SIGTERM)
        try:
            supervisor.wait(30)
        except subprocess.TimeoutExpired:
            supervisor.kill()
            supervisor.wait()
    assert "error='KCoral Server was killed by SIGKILL'" in line, line
