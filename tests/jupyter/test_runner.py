"""``run_cell`` against a stand-in job and against ``Client`` over an in-memory transport."""

from __future__ import annotations

import os
import signal
import time

import pytest
from kcoral_jupyter.cell_errors import CellCancelledError, CellTimeoutError, PickleRefusedError
from kcoral_jupyter.cell_program import CellSpec, build_cell
from kcoral_jupyter.runner import (
    ExecuteOptions,
    RunRecord,
    describe_phase,
    run_cell,
    translate_error,
)

from kcoral import KCoralError, ProgramResult
from kcoral.connection.event_stream import JobEvent

DONE = ProgramResult("COMPLETED", "r1", 1.0, 2.0, 0.0, 0.0, {}, "", "", False, False)


class Reporter:
    def __init__(self):
        self.lines, self.out, self.err = [], [], []

    def phase(self, text):
        self.lines.append(text)

    finished = phase

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
    JobEvent(1, "phase", {"phase": "queued", "position": 2}),
    JobEvent(2, "phase", {"phase": "assigned", "worker_id": "cpu/w1"}),
    JobEvent(3, "phase", {"phase": "instruction", "index": 2, "op": "run", "id": "cell"}),
    JobEvent(4, "stdout", {"text": "hello\n"}),
    JobEvent(5, "stderr", {"text": "warn\n"}),
    JobEvent(6, "phase", {"phase": "finished", "status": "COMPLETED"}),
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
        "queued behind 2 · job job-1",  # which job, to cancel it from the panel
        "worker cpu/w1",
        # the cell's own words, not "instruction 2: running cell (cell)"; no "0 s"
        "running · job job-1",
        "done (COMPLETED)",
    ]
    assert reporter.out == ["hello\n"] and reporter.err == ["warn\n"]
    assert record.job_id == "job-1" and record.worker_id == "cpu/w1" and record.streamed
    assert client.submitted == [
        {"timeout_seconds": 5, "output_limit_bytes": None, "gpu_count": None, "serialization": None}
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


class InterruptedSubmission(StandInClient):
    """The kernel's interrupt (SIGINT) arrives ``interrupts`` times while the server takes
    the job, after it has it and before its id is back."""

    def __init__(self, job, interrupts):
        super().__init__(job)
        self.interrupts = interrupts

    def submit(self, program, **options):
        job = super().submit(program, **options)
        held = signal.getsignal(signal.SIGINT).__self__  # the cell's HeldInterrupt
        for count in range(1, self.interrupts + 1):
            os.kill(os.getpid(), signal.SIGINT)
            # The submission runs in a thread, the handler in the cell's: each interrupt is
            # taken before the next is sent, as a user's are (two at once are one to Python).
            while count < self.interrupts and not held.noted:
                time.sleep(0.01)
        return job


def _run_interrupted(client: StandInClient, reporter: Reporter, record: RunRecord) -> None:
    with pytest.raises(KeyboardInterrupt):
        run_cell(
            client,
            build_cell(CellSpec(source="x = 1\n")),
            ExecuteOptions(),
            reporter,
            record=record,
            use_jobs=True,
        )


def test_an_interrupt_while_the_job_is_submitted_cancels_it_once_its_id_is_known() -> None:
    # Before, it left the job running with no id to cancel it by, and the cell said the
    # remote work was cancelled.
    job = StandInJob(EVENTS)
    reporter, record = Reporter(), RunRecord(server="http://s")
    _run_interrupted(InterruptedSubmission(job, 1), reporter, record)
    assert job.cancelled and record.job_id == "job-1"
    assert "interrupted: cancelling the job on the server" in reporter.lines
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back


def test_a_second_interrupt_while_the_job_is_submitted_abandons_the_submission() -> None:
    job = StandInJob(EVENTS)
    reporter, record = Reporter(), RunRecord(server="http://s")
    _run_interrupted(InterruptedSubmission(job, 2), reporter, record)
    assert not job.cancelled and record.job_id is None  # what the cell then says
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_cell_with_pickled_inputs_is_submitted_as_a_job_with_its_serialization() -> None:
    job = StandInJob(EVENTS)
    client = StandInClient(job)
    reporter = Reporter()
    built = build_cell(CellSpec(source="print(len(obj))\n", inputs={"obj": {1, 2}}))
    assert built.serialization == "pickle"
    options = ExecuteOptions(serialization=built.serialization)
    run_cell(client, built, options, reporter, record=RunRecord(server="http://s"), use_jobs=True)
    assert client.submitted[0]["serialization"] == "pickle"
    assert reporter.out == ["hello\n"]  # streamed live, not at the end


def test_request_errors_become_actionable_exceptions() -> None:
    timeout = KCoralError(504, "execution timed out", kind="timeout", request_id="r")
    error = translate_error(timeout, ExecuteOptions(timeout_seconds=2), "http://s")
    assert isinstance(error, CellTimeoutError) and "--timeout 2 s" in str(error)
    refused = KCoralError(
        400,
        "Serialization format 'pickle' not allowed. Allowed formats: ['json']",
        kind="parse",
    )
    # Told apart by status and kind for a cell sent with pickle, whatever the wording.
    pickled = ExecuteOptions(serialization="pickle")
    assert isinstance(translate_error(refused, pickled, "http://s"), PickleRefusedError)
    reworded = KCoralError(400, "pickle is off here", kind="parse")
    assert isinstance(translate_error(reworded, pickled, "http://s"), PickleRefusedError)
    assert translate_error(refused, ExecuteOptions(), "http://s") is refused


def test_a_job_cancelled_by_an_admin_or_a_revocation_keeps_the_servers_who_and_why() -> None:
    def rendered(message: str) -> list[str]:
        cancel = KCoralError(409, message, kind="cancelled")
        error = translate_error(cancel, ExecuteOptions(), "http://s")
        assert isinstance(error, CellCancelledError)
        return error._render_traceback_()

    assert rendered("the job was cancelled by admin root") == [
        "CellCancelledError: the job was cancelled on http://s by admin root",
        "run the cell again",
    ]
    assert rendered("the job was cancelled: the token of identity bob was revoked") == [
        "CellCancelledError: the job was cancelled on http://s: the token of identity bob "
        "was revoked",
        "run the cell again",
    ]
    assert rendered("the job was cancelled")[0] == (
        "CellCancelledError: the job was cancelled on http://s, not by this cell"
    )


def test_a_job_next_in_line_says_it_waits_for_a_worker_not_queued_number_zero() -> None:
    record = RunRecord(server="http://s")
    assert describe_phase({"phase": "queued", "position": 0}, record) == "waiting for a worker"
    assert describe_phase({"phase": "queued"}, record) == "waiting for a worker"
    assert describe_phase({"phase": "queued", "position": 3}, record) == "queued behind 3"


def test_a_queued_job_says_the_kind_it_waits_for_when_known() -> None:
    record = RunRecord(server="http://router", waits_for="gpu=h100")
    assert describe_phase({"phase": "queued", "position": 0}, record) == "waiting for gpu=h100"
    assert describe_phase({"phase": "queued", "position": 2}, record) == (
        "queued behind 2, waiting for gpu=h100"
    )


def test_a_select_is_sent_only_when_given() -> None:
    assert "select" not in ExecuteOptions().as_kwargs()
    assert ExecuteOptions(select="gpu=h100").as_kwargs()["select"] == "gpu=h100"
