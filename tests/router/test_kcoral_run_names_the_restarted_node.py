"""``kcoral run`` whose job's node restarted its server says so (EXTENSIONS §7, ROUTER §13):
through a real router onto a real CPU node, the tool prints a line, the node's server is
killed (SIGKILL, as a crash) and its supervisor starts a new one; ``kcoral run`` ends with
status 1 and the router's cause, ``job lost: its node cpu-a restarted its server, which
held it; the remote tool's result is lost``. Before, it guessed: ``the server no longer has
this run's job (was it restarted?)``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from router_helpers import Node, start_router, stopping
from test_router_fleet_status import wait_until_its_seat_is_free

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
KCORAL_RUN = [sys.executable, "-m", "kcoral", "run", "shell"]


def test_kcoral_run_names_the_node_whose_restart_lost_its_job(tmp_path: Path) -> None:
    # past its restart grace, as a router that has run a while (ROUTER §13)
    router = start_router(
        tmp_path, "--status-check-interval-seconds", "0.3", "--reconnect-grace-seconds", "0"
    )
    node = Node(tmp_path, router, "cpu-a", None)
    with stopping(router, [node]):
        wait_until_its_seat_is_free(router)
        run = subprocess.Popen(
            [*KCORAL_RUN, "--url", router.url, "--", "sh", "-c", "echo started; exec sleep 120"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            env={**os.environ, "KCORAL_TOKEN": ""},
        )
        try:
            assert run.stdout is not None and run.stdout.readline() == "started\n"
            psutil.Process(node.server_pid()).send_signal(signal.SIGKILL)
            _out, err = run.communicate(timeout=120)
        finally:
            run.kill()
        assert run.returncode == 1, err
        assert err.strip().splitlines()[-1] == (
            "kcoral run: job lost: its node cpu-a restarted its server, which held it; "
            "the remote tool's result is lost"
        ), err
