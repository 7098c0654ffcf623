"""An interrupted session cell whose program does not stop: the cell says the session ended.
An in-process IPython shell (the interrupt is SIGINT to its main thread, as Jupyter's Stop
sends the kernel) against a real CPU server."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from IPython.utils.capture import capture_output
from kcoral_jupyter.cell_errors import SessionEndedError
from kcoral_jupyter.extension import kernel_state_of
from kcoral_shell import kcoral_shell

import kcoral

pytestmark = pytest.mark.timeout(300)

STUBBORN_CELL = (
    "%%kcoral\nimport time\nwhile True:\n    try:\n        time.sleep(100)\n"
    "    except KeyboardInterrupt:\n        pass\n"
)


def interrupt_once_running(url: str, session_id: str) -> threading.Thread:
    """SIGINT to this (the shell's) thread once the session's program runs."""
    main = threading.get_ident()

    def wait_then_interrupt() -> None:
        with kcoral.Client(url) as client:
            deadline = time.monotonic() + 60
            while client.attach_session(session_id).record.get("state") != "RUNNING":
                if time.monotonic() > deadline:
                    return
                time.sleep(0.05)
        # RUNNING comes before the cell's first line: an interrupt in the few statements
        # before its try ends the program at once (a clean-clone CI under load saw that), so
        # give it a moment to reach the loop it is stubborn in
        time.sleep(1.0)
        signal.pthread_kill(main, signal.SIGINT)

    thread = threading.Thread(target=wait_then_interrupt)
    thread.start()
    return thread


def test_an_interrupted_session_cell_whose_program_ignores_it_says_the_session_ended(
    server_factory, monkeypatch
) -> None:
    # Before: "interrupted: KeyboardInterrupt raised in session ...'s program" and "the
    # session keeps its state if the program stopped within 5 s (else the next cell says it
    # ended)", after the cell had waited for the server to kill the worker, ending the session.
    server = server_factory("--num-workers", "1", "--max-sessions", "1")
    with kcoral_shell(server.url, monkeypatch, ()) as ip:
        sessions = kernel_state_of(ip).sessions
        try:
            with capture_output():
                ip.run_line_magic("kcoral", "session start")
            remote = sessions.current
            thread = interrupt_once_running(server.url, remote.id)
            with capture_output():
                result = ip.run_cell(STUBBORN_CELL)
            thread.join(60)
            error = result.error_in_exec
            assert isinstance(error, SessionEndedError), error
            lines = list(error._render_traceback_())
            assert lines[0].startswith(
                f"SessionEndedError: {remote.label} on {server.url} ended: job "
            )  # not "has ended: session ended: job ..."
            assert "did not stop within 5 s of an interrupt" in lines[0], lines
            assert "its variables are gone" in lines[1]
        finally:
            if sessions.current is not None:
                sessions.current.handle.close()
            sessions.current = None
