"""``kcoral run`` whose job an admin cancels on a team's server (EXTENSIONS §6: an admin
sees and cancels every identity's jobs): the one line says the tool was stopped and by
whom. Before, it read ``server error: HTTP 409: the job was cancelled by admin root``, as if
the server had failed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from server_process import client_token_file, running_server

from kcoral import Client

pytestmark = pytest.mark.timeout(120)

BOB = "token-bob-0123456789"
ADMIN = "token-root-0123456789"


def test_a_run_an_admin_cancels_says_the_tool_was_stopped_by_that_admin(tmp_path: Path) -> None:
    tokens = client_token_file(tmp_path, f"bob {BOB}\nroot {ADMIN} admin\n")
    args = ["--log-dir", "", "--auth-token-file", str(tokens)]
    with running_server(tmp_path / "server", args) as server:
        code = "import time\nprint('started', flush=True)\ntime.sleep(60)\n"
        run = subprocess.Popen(
            [sys.executable, "-m", "kcoral", "run", "python", "--url", server.url, "--",
             "-c", code],
            stderr=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "KCORAL_TOKEN": BOB},
        )  # fmt: skip
        try:
            assert run.stdout is not None
            assert run.stdout.readline() == "started\n"  # live output: the tool runs
            with Client(server.url, token=ADMIN) as admin:
                (running,) = [job for job in admin.jobs() if job["status"] == "RUNNING"]
                assert running["owner"] == "bob"
                admin.job(running["job_id"]).cancel()
            _out, err = run.communicate(timeout=60)
        finally:
            if run.poll() is None:
                run.kill()
        assert run.returncode == 1
        said = err.strip().splitlines()[-1]
        assert said == "kcoral run: the tool was stopped: the job was cancelled by admin root"
