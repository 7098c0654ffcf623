"""A script following its job across a restart of the server (EXTENSIONS §5): jobs live in
the server's memory, so the new server does not know the job, and its ``404`` says when it
started. Before, ``job.result()``, ``job.status()`` and ``job.events()`` raised ``HTTP 404:
job not found`` of the job the script had just watched run, naming no cause.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from job_helpers import module_program
from server_process import start_server

import kcoral
from kcoral.errors import KCoralError

TOKEN = "restart-probe-token-0123456789"

SLEEPS = """
import time
def f():
    print("started", flush=True)
    time.sleep(60)
"""


def test_a_job_polled_across_a_server_restart_says_the_server_started_since(
    tmp_path: Path,
) -> None:
    env = {"KCORAL_AUTH_TOKEN": TOKEN}
    first = start_server(tmp_path / "first", env=env)
    try:
        with kcoral.Client(first.url, token=TOKEN) as client:
            job = client.submit(module_program(SLEEPS, "f", returns=False))
            for event in job.events():
                if event.kind == "stdout":
                    break
            first.stop(signal.SIGKILL)
            second = start_server(tmp_path / "second", ["--port", str(first.port)], env=env)
            try:
                started = client.health()["started_at"].split(".")[0] + "Z"
                for read in (job.status, job.result, lambda: list(job.events())):
                    with pytest.raises(KCoralError) as lost:
                        read()
                    assert (lost.value.status_code, lost.value.kind) == (404, "not_found")
                    assert lost.value.message == (
                        f"job not found (this server started at {started}; "
                        "jobs do not outlive a restart)"
                    )
            finally:
                second.stop()
    finally:
        first.stop(signal.SIGKILL)
