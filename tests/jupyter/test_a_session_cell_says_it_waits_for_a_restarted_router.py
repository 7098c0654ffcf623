"""A session cell whose restarted router has not found the session yet says so on its
status line while it asks again (EXTENSIONS §11), not on the cell's stderr; a status read
after the cell writes to stderr again. ``run_cell`` over an in-memory transport; the real
restart under a real kernel is test_a_session_cell_after_a_router_restart.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from kcoral_jupyter.cell_program import CellSpec, build_cell
from kcoral_jupyter.runner import ExecuteOptions, RunRecord, run_cell

from kcoral import Client
from kcoral.client_sessions import NOT_FOUND_YET, Session
from kcoral.connection.transport import MockTransport, Request, Response

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client"))

from server_answers import completed

URL = "http://kcoral.test"
SESSION_ID = "6f1a2b3c-4d5e-4c53-9d0e-0b5c1f7e3a0d"
RECORD = {"session_id": SESSION_ID, "owner": "default", "state": "IDLE", "programs": 0}


class Reporter:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def phase(self, text: str) -> None:
        self.lines.append(text)

    finished = phase

    def stdout(self, text: str) -> None:
        pass

    def stderr(self, text: str) -> None:
        pass


def test_a_session_cell_says_on_its_status_line_that_it_waits_for_the_restarted_router(
    capsys: pytest.CaptureFixture[str],
) -> None:
    refusals = 2

    def answer(request: Request) -> Response:
        nonlocal refusals
        headers = {"Content-Type": "application/json"}
        if refusals:  # a restarted router, its node not back yet (ROUTER §13)
            refusals -= 1
            message = f"{NOT_FOUND_YET}: the router started 0 s ago, and the node that holds it"
            body = {"error": {"kind": "no_node", "message": message}, "request_id": "r"}
            return Response(503, {**headers, "Retry-After": "1"}, json.dumps(body).encode())
        document = completed() if request.path.endswith("/execute") else RECORD
        return Response(200, headers, json.dumps(document).encode())

    session = Session(Client(URL, transport=MockTransport(answer)), RECORD)
    reporter = Reporter()
    built = build_cell(CellSpec(source="x = 1\n"))
    record = RunRecord(server=URL)
    result = run_cell(session, built, ExecuteOptions(), reporter, record=record, use_jobs=False)
    assert result.status == "COMPLETED"
    assert (
        f"session {SESSION_ID[:8]}: the router just started and has not found it yet (its node "
        "may be reconnecting); asking again for up to 10 s"
    ) in reporter.lines
    assert capsys.readouterr().err == ""
    assert session.on_wait is None  # the cell's status line is not a later read's
