"""``kcoral run`` first in line behind a running program says that it waits (EXTENSIONS §7).

A real one-worker server, a job holding its worker, and ``kcoral run`` as the user starts it
(a process of its own). Its job is first in the queue (position 0), so the "queued behind N
other requests" notice, which counts only the requests waiting ahead, never came: the run
printed nothing until the worker was free and looked hung, the case that notice was added
for.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from notice_then_go import said_until_notice_then_go
from server_process import running_server

import kcoral

pytestmark = pytest.mark.timeout(180)

NOTICE = "kcoral run: waiting for a free worker; the tool starts when one is free"


def holder() -> kcoral.Program:
    """A program that holds its worker until it is cancelled."""
    program = kcoral.Program()
    module = program.upload(kind="module", source="import time\ndef hold():\n    time.sleep(600)\n")
    program.run(fn=program.get_function(module=module, name="hold"))
    return program


def wait_until_it_holds_the_worker(held: kcoral.Job) -> None:
    """Follow ``holder()``'s job until its program runs: the worker is taken from then on."""
    for event in held.events():
        if event.kind == "phase" and event.data.get("op") == "run":
            return


def start_kcoral_run(url: str, cwd: Path) -> subprocess.Popen[str]:
    """``kcoral run python -c "print('ran')"`` against ``url``, as the user starts it."""
    command = ["run", "python", "--url", url, "--", "-c", "print('ran')"]
    return subprocess.Popen(
        [sys.executable, "-m", "kcoral", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )


def test_a_run_waiting_for_the_only_busy_worker_says_so_and_then_runs(tmp_path: Path) -> None:
    args = ["--num-workers", "1", "--log-dir", ""]
    with (
        running_server(tmp_path / "server", args) as server,
        kcoral.Client(server.url) as client,
    ):
        held = client.submit(holder(), timeout_seconds=600)
        wait_until_it_holds_the_worker(held)
        run = start_kcoral_run(server.url, tmp_path)
        said, out = said_until_notice_then_go(run, NOTICE, held.cancel)
    assert said.count(NOTICE) == 1, said
    assert run.returncode == 0, said
    assert out == "ran\n"


def test_ctrl_c_while_queued_says_the_tool_never_started(tmp_path: Path) -> None:
    # It said "interrupted; the remote tool was cancelled" of a tool that had never run.
    args = ["--num-workers", "1", "--log-dir", ""]
    with (
        running_server(tmp_path / "server", args) as server,
        kcoral.Client(server.url) as client,
    ):
        held = client.submit(holder(), timeout_seconds=600)
        try:
            wait_until_it_holds_the_worker(held)
            run = start_kcoral_run(server.url, tmp_path)
            try:
                assert run.stderr is not None
                assert run.stderr.readline().rstrip("\n") == NOTICE  # it waits in the queue
                run.send_signal(signal.SIGINT)
                out, err = run.communicate(timeout=120)
            finally:
                if run.poll() is None:
                    run.kill()
                    run.wait()
            (queued,) = [job for job in client.jobs() if job["job_id"] != held.id]
        finally:
            held.cancel()
    assert (run.returncode, out) == (130, "")
    assert err == "kcoral run: interrupted; the queued run was cancelled before a worker took it\n"
    assert (queued["status"], queued["started_at"]) == ("CANCELLED", None)
