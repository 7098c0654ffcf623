"""A session that ends with its cell's program (its worker exits), or under a ``--noblock``
job: the cell, or the job's attach, says so. In-process IPython shells against a real CPU
server."""

from __future__ import annotations

import pytest
from IPython.utils.capture import capture_output
from kcoral_jupyter.cell_errors import SessionEndedError
from kcoral_jupyter.extension import kernel_state_of
from kcoral_jupyter.runner import RemoteCellError
from kcoral_shell import kcoral_shell

pytestmark = pytest.mark.timeout(300)


def test_a_session_cell_whose_worker_exits_says_the_session_ended_with_it(
    server_factory, monkeypatch
) -> None:
    # Before: only "worker exited while executing the instruction: it exited with status 3";
    # the session's end (its variables gone) was told by the next cell.
    server = server_factory("--num-workers", "1", "--max-sessions", "1")
    with kcoral_shell(server.url, monkeypatch, ()) as ip:
        sessions = kernel_state_of(ip).sessions
        try:
            with capture_output():
                ip.run_line_magic("kcoral", "session start")
                label = sessions.current.label
                failed = ip.run_cell("%%kcoral\nx = 1\n1 / 0\n").error_in_exec
                exited = ip.run_cell("%%kcoral\nimport os\nos._exit(3)\n").error_in_exec
        finally:
            sessions.current = None
    assert isinstance(failed, RemoteCellError) and "has ended" not in str(failed.hint)
    assert isinstance(exited, RemoteCellError), exited
    assert exited.hint == (
        f"hint: {label} ended with this cell: its worker exited during the cell (exit code 3); "
        "its variables are gone, %kcoral session start begins a new session"
    )


def test_attaching_to_a_session_job_that_its_sessions_stop_ended_says_the_session_ended(
    server_factory, monkeypatch
) -> None:
    # Before: "the job was cancelled on URL, not by this cell" and "a Cancel in the KCoral
    # panel, %kcoral cancel or another client of the server stopped it", after the user's
    # own %kcoral session stop.
    server = server_factory("--num-workers", "1", "--max-sessions", "1")
    with kcoral_shell(server.url, monkeypatch, ("job",)) as ip:
        sessions = kernel_state_of(ip).sessions
        try:
            with capture_output():
                ip.run_line_magic("kcoral", "session start")
                label = sessions.current.label
                ip.run_cell("%%kcoral --noblock -r job\nimport time\ntime.sleep(60)\n")
                job_id = ip.user_ns["job"].id
                ip.run_line_magic("kcoral", "session stop")
                error = ip.run_cell(f"%kcoral attach {job_id}").error_in_exec
        finally:
            sessions.current = None
    assert isinstance(error, SessionEndedError), error
    assert error._render_traceback_() == [
        f"SessionEndedError: job {job_id} on {server.url} was cancelled: {label} ended while "
        "it ran",
        "its result is gone: run the cell again (%kcoral session list says why the session "
        "ended; %kcoral session start begins a new one)",
    ]
