"""The jobs path of ``run_cell`` against a stand-in client (the real jobs client comes later)."""

from __future__ import annotations

import pytest
from kcoral_jupyter.cell_program import CellSpec, build_cell
from kcoral_jupyter.runner import (
    CellTimeoutError,
    ExecuteOptions,
    PickleRefusedError,
    RunRecord,
    event_fields,
    run_cell,
    translate_error,
)

from kcoral import KCoralError, ProgramResult

DONE = ProgramResult("COMPLETED", "r1", 1.0, 2.0, 0.0, 0.0, {}, "", "", False, False)


class Reporter:
    def __init__(self):
        self.lines, self.out, self.err = [], [], []

    def phase(self, text):
        self.lines.append(text)

    def stdout(self, text):
        self.out.append(text)

    def stderr(self, text):
        self.err.append(text)


class StandInJob:
    id = "job-1"

    def __init__(self, events, interrupt=False):
        self._events, self._interrupt, self.cancelled = events, interrupt, False

    def events(self):
        yield from self._events
        if self._interrupt:
            raise KeyboardInterrupt

    def result(self, timeout=None):
        return DONE

    def status(self):
        return {"status": "COMPLETED", "worker_id": "cpu/w1", "gpu_ids": []}

    def cancel(self):
        self.cancelled = True


class StandInClient:
    def __init__(self, job):
        self.job, self.submitted = job, []

    def submit(self, program, **options):
        self.submitted.append(options)
        return self.job


EVENTS = [
    {"event": "phase", "data": {"phase": "queued", "position": 2}},
    {"event": "phase", "data": '{"phase": "assigned", "worker_id": "cpu/w1"}'},
    {"event": "phase", "data": {"phase": "instruction", "index": 2, "op": "run", "id": "cell"}},
    {"event": "stdout", "data": {"text": "hello\n"}},
    {"event": "stderr", "data": "warn\n"},
    {"event": "phase", "data": {"phase": "finished", "status": "COMPLETED"}},
]


def test_a_job_streams_output_and_walks_the_status_line_through_its_phases() -> None:
    job = StandInJob(EVENTS)
    client = StandInClient(job)
    reporter, record = Reporter(), RunRecord(server="http://s")
    built = build_cell(CellSpec(source="print('hello')\n"))
    result = run_cell(
        client, built, ExecuteOptions(timeout_seconds=5), reporter, record=record, use_jobs=True
    )
    assert result is DONE
    assert reporter.lines == [
        "submitted",
        "queued #2",
        "worker cpu/w1",
        "instruction 2: running cell (cell)",
        "done (COMPLETED)",
    ]
    assert reporter.out == ["hello\n"] and reporter.err == ["warn\n"]
    assert record.job_id == "job-1" and record.worker_id == "cpu/w1" and record.streamed
    assert client.submitted == [
        {"timeout_seconds": 5, "output_limit_bytes": None, "gpu_count": None}
    ]


def test_interrupting_a_job_cancels_it_on_the_server() -> None:
    job = StandInJob(EVENTS[:2], interrupt=True)
    with pytest.raises(KeyboardInterrupt):
        run_cell(
            StandInClient(job),
            build_cell(CellSpec(source="x = 1\n")),
            ExecuteOptions(),
            Reporter(),
            record=RunRecord(server="http://s"),
            use_jobs=True,
        )
    assert job.cancelled


def test_event_objects_with_attributes_are_understood() -> None:
    class Event:
        event = "phase"
        data = '{"phase": "lease_wait"}'

    assert event_fields(Event()) == ("phase", {"phase": "lease_wait"})


def test_request_errors_become_actionable_exceptions() -> None:
    timeout = KCoralError(504, "execution timed out", kind="timeout", request_id="r")
    error = translate_error(timeout, ExecuteOptions(timeout_seconds=2), "http://s")
    assert isinstance(error, CellTimeoutError) and "--timeout 2 s" in str(error)
    refused = KCoralError(
        400,
        "Serialization format 'pickle' not allowed. Allowed formats: ['json']",
        kind="parse",
    )
    assert isinstance(translate_error(refused, ExecuteOptions(), "http://s"), PickleRefusedError)
