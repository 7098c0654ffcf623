"""An interrupt that lands as ``%kcoral session start``'s ``201`` is read (the server has
started the session and sent its record): before, the start raised out of the client, the
magic said 'no session was started (the server ends one whose start was left)', and the
session lived on, IDLE, holding a seat until its idle timeout, an id nobody knew. The server
ends only a session whose client left before its 201 (EXTENSIONS §11). Now the first
interrupt is held until the server answers; a session it started is ended, and the cell says
so. The real CPU server of the Jupyter tests; the interrupt is a real SIGINT."""

from __future__ import annotations

import os
import signal

import pytest
from kcoral_jupyter.cell_errors import CellCancelledError

import kcoral.client_sessions as client_sessions
from kcoral import Client


def live_sessions(url: str) -> list[dict]:
    with Client(url) as client:
        return [record for record in client.sessions() if record.get("state") != "ENDED"]


def test_an_interrupt_as_the_sessions_record_arrives_ends_the_session_it_started(
    shell, cpu_server_url, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert live_sessions(cpu_server_url) == []
    read_record = client_sessions._record

    def interrupted_as_it_reads(expected: int, response, what: str):
        if expected == 201:  # the session's record: the server has started it
            os.kill(os.getpid(), signal.SIGINT)
        return read_record(expected, response, what)

    monkeypatch.setattr(client_sessions, "_record", interrupted_as_it_reads)
    try:
        with pytest.raises(CellCancelledError) as interrupted:
            shell.run_line_magic("kcoral", "session start")
        monkeypatch.setattr(client_sessions, "_record", read_record)
        left = live_sessions(cpu_server_url)
    finally:
        monkeypatch.setattr(client_sessions, "_record", read_record)
        with Client(cpu_server_url) as client:  # the shared server's seat, for later tests
            for record in live_sessions(cpu_server_url):
                client.attach_session(record["session_id"]).close()
    assert left == []  # before: one IDLE session, holding a seat until its idle timeout
    assert interrupted.value.cause.startswith("interrupted: the session that had started on ")
    assert interrupted.value.cause.endswith(" was ended")
    assert "no session in this kernel" in shell_says(shell, "session status")


def shell_says(shell, line: str) -> str:
    from IPython.utils.capture import capture_output

    with capture_output() as seen:
        shell.run_line_magic("kcoral", line)
    return seen.stdout
