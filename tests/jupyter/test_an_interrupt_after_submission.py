"""An interrupt that lands just after a cell's job was submitted, once the held-interrupt
window has closed and before the cell follows the job (``runner._run_as_job``): the job is
cancelled, as one in either window is. It escaped the cell's handler, and the job ran on
with nothing to cancel it by (a session's program: no interrupt sent, the session busy)."""

from __future__ import annotations

from typing import Any

import pytest
from kcoral_jupyter.runner import ExecuteOptions, RunRecord, _run_as_job


class StandInJob:
    id = "job-1"

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class StandInClient:
    def __init__(self, job: StandInJob) -> None:
        self.job = job

    def submit(self, program: Any, **_options: Any) -> StandInJob:
        return self.job


class InterruptedAtSubmitted:
    """A reporter at whose "submitted" phase the user's interrupt arrives."""

    def __init__(self) -> None:
        self.phases: list[str] = []

    def phase(self, text: str) -> None:
        self.phases.append(text)
        if text == "submitted":
            raise KeyboardInterrupt

    def finished(self, text: str) -> None:
        self.phases.append(text)

    def stdout(self, text: str) -> None: ...

    def stderr(self, text: str) -> None: ...


def test_an_interrupt_just_after_the_submission_cancels_the_job() -> None:
    job, reporter = StandInJob(), InterruptedAtSubmitted()
    record = RunRecord(server="http://127.0.0.1:9")
    with pytest.raises(KeyboardInterrupt):
        _run_as_job(StandInClient(job), object(), ExecuteOptions(), reporter, record)  # type: ignore[arg-type]
    assert job.cancelled and record.job_id == "job-1"
    assert reporter.phases[-1] == "cancelled job job-1 (kernel state kept)"
