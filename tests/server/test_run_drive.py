"""ProgramDrive: how each end of a program maps onto the run's state (PROTOCOL §6–§7).

The worker runs uploaded code, so its ``ProgramFinished`` is checked, never trusted.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kcoral_server.execution.drive import CRASH_MESSAGE, ProgramDrive
from kcoral_server.pool.retirement import RunResult
from kcoral_server.processes import ipc
from kcoral_server.processes.channel import WorkerGone
from kcoral_server.storage.workspace import Workspace


@pytest.fixture
def drive() -> Iterator[ProgramDrive]:
    workspace = Workspace.create(None, None)
    try:
        yield ProgramDrive(workspace=workspace, limit=0)
    finally:
        workspace.remove()


def started(index: int) -> ipc.InstructionStarted:
    return ipc.InstructionStarted(index=index, op="call", id=f"c{index}")


def test_a_completed_program_is_finished_and_completed(drive: ProgramDrive) -> None:
    drive.finished(ipc.ProgramFinished(status="COMPLETED"))
    assert (drive.result, drive.status, drive.error, drive.reason) == (
        RunResult.FINISHED,
        "COMPLETED",
        None,
        "completed",
    )


@pytest.mark.parametrize(
    "message",
    [
        ipc.ProgramFinished(status="DONE"),  # a status the protocol does not have
        ipc.ProgramFinished(status="FAILED", error=None),  # FAILED without its error object
        ipc.ProgramFinished(status="FAILED", error="boom"),  # type: ignore[arg-type]
    ],
    ids=["unknown-status", "failed-without-error", "error-not-an-object"],
)
def test_a_rogue_worker_s_malformed_program_finished_is_refused(
    drive: ProgramDrive, message: ipc.ProgramFinished
) -> None:
    with pytest.raises(ValueError):
        drive.finished(message)
    assert drive.result is None


def test_left_background_processes_fail_a_completed_program_and_retire_its_worker(
    drive: ProgramDrive,
) -> None:
    drive.last_instruction = started(2)
    drive.finished(ipc.ProgramFinished(status="COMPLETED", left_processes=True))
    assert drive.status == "FAILED"
    assert drive.reason == "program_failed"
    assert drive.reason_retire == "request_limit"
    assert drive.error is not None and drive.error["instruction_index"] == 2


def test_a_poisoned_context_retires_the_worker(drive: ProgramDrive) -> None:
    drive.finished(ipc.ProgramFinished(status="COMPLETED", poisoned=True))
    assert drive.reason_retire == "poisoned_context"


def test_a_crash_during_an_instruction_fails_that_instruction(drive: ProgramDrive) -> None:
    drive.last_instruction = started(1)
    drive.worker_lost(WorkerGone("EOF"), quarantined=False)
    assert drive.result is RunResult.FINISHED
    assert drive.status == "FAILED"
    assert drive.reason == "crashed"
    assert drive.error is not None
    assert (drive.error["message"], drive.error["instruction_id"]) == (CRASH_MESSAGE, "c1")


def test_a_crash_before_any_instruction_is_a_crashed_run(drive: ProgramDrive) -> None:
    drive.worker_lost(WorkerGone("EOF"), quarantined=False)
    assert (drive.result, drive.reason, drive.reason_retire) == (
        RunResult.CRASHED,
        "crashed",
        "crashed",
    )


def test_garbage_from_the_worker_is_an_invalid_run(drive: ProgramDrive) -> None:
    drive.last_instruction = started(0)
    drive.worker_lost(WorkerGone("bad frame", invalid=True), quarantined=False)
    assert (drive.result, drive.reason) == (RunResult.INVALID, "server_error")


def test_a_worker_lost_with_its_gpu_quarantined_is_a_quarantined_run(
    drive: ProgramDrive,
) -> None:
    drive.last_instruction = started(0)
    drive.worker_lost(WorkerGone("EOF", invalid=True), quarantined=True)
    assert drive.result is RunResult.QUARANTINED


def test_a_timeout_and_a_cancel_retire_the_worker_with_their_reason(
    drive: ProgramDrive,
) -> None:
    drive.timed_out()
    assert (drive.result, drive.reason, drive.reason_retire) == (
        RunResult.TIMED_OUT,
        "timeout",
        "timeout",
    )
    drive.cancelled(None)
    assert (drive.result, drive.reason, drive.reason_retire) == (
        RunResult.CANCELLED,
        "cancelled",
        "cancelled",
    )
