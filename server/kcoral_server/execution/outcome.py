"""What a request answers for a program's end (PROTOCOL §6, §7.1; SERVER §8, §11).

A finished ``ProgramDrive`` becomes the request's ``ProgramOutcome``; every other end
becomes its ``RequestFailed`` with the documented status: 503 ``busy`` for a GPU
quarantined under the program, 504 ``timeout``, 500 ``engine`` for an invalid worker
response, a crash or a clean-up that could not be confirmed, the cancellation's own
failure for a cancel. A failure closes the return maps, which nobody will answer with.
"""

from __future__ import annotations

from kcoral_server.execution.control import Cancellation
from kcoral_server.execution.drive import ProgramDrive
from kcoral_server.execution.responses import (
    GPUS_QUARANTINED,
    ProgramOutcome,
    Refusal,
    RequestFailed,
    close_maps,
    saturated,
    too_large,
)
from kcoral_server.pool.retirement import RunResult
from kcoral_server.processes.handle import WorkerHandle, worker_frame_limit
from kcoral_server.processes.ipc import FRAME_ENVELOPE_BYTES
from kcoral_server.storage.workspace import CapturedOutput

__all__ = ["CLEANUP_MESSAGE", "confirm_cleanup", "program_outcome"]

#: PROTOCOL §7.1: the fixed message of a clean-up that could not be verified
CLEANUP_MESSAGE = "worker cleanup was not confirmed; affected devices unavailable"


def confirm_cleanup(handle: WorkerHandle) -> None:
    """500 ``engine`` when the worker's end could not be confirmed (the pool has
    quarantined its GPUs and stopped admitting)."""
    if handle.cleanup_unconfirmed is not None:
        raise RequestFailed(
            500,
            "engine",
            CLEANUP_MESSAGE,
            "server_error",
            error_detail=handle.cleanup_unconfirmed,
        )


#: The answer of a program that did not finish.
FAILED_ANSWERS: dict[RunResult, Refusal] = {
    RunResult.QUARANTINED: saturated(GPUS_QUARANTINED),
    RunResult.TIMED_OUT: Refusal(504, "timeout", "execution timed out", "timeout"),
    RunResult.INVALID: Refusal(500, "engine", "invalid worker response", "server_error"),
    RunResult.CRASHED: Refusal(500, "engine", "worker crashed", "crashed"),
}


def program_outcome(
    drive: ProgramDrive,
    handle: WorkerHandle,
    cancellation: Cancellation,
    output: CapturedOutput,
    *,
    elapsed: float,
    lease_wait: float,
    lease_held: float,
) -> ProgramOutcome:
    """The answer for ``drive``'s end: its outcome, or ``RequestFailed``."""
    if handle.cleanup_unconfirmed is not None:
        close_maps(drive.maps)
        confirm_cleanup(handle)
    if drive.too_large is not None and drive.result in (RunResult.FINISHED, RunResult.INVALID):
        close_maps(drive.maps)  # a return that no answer could carry: it is the answer
        raise too_large(drive.too_large, worker_frame_limit(handle.config) - FRAME_ENVELOPE_BYTES)
    refusal = FAILED_ANSWERS.get(drive.result) if drive.result is not None else None
    if refusal is not None:
        close_maps(drive.maps)
        message = refusal.message
        printed = None
        if drive.result is RunResult.TIMED_OUT:
            message = drive.timeout_message  # names the deadline and its setting
            printed = output  # what it printed before: the only trace of what it did
        elif drive.result is RunResult.CRASHED and drive.cause is not None:
            message = f"{message}: {drive.cause}"  # the limit it was killed at
        raise RequestFailed(refusal.status, refusal.kind, message, refusal.reason, output=printed)
    if drive.result is RunResult.CANCELLED:
        close_maps(drive.maps)
        raise cancellation.failure()
    return ProgramOutcome(
        status=drive.status,
        error=drive.error,
        returns=drive.returns,
        output=output,
        elapsed=elapsed,
        lease_wait=lease_wait,
        lease_held=lease_held,
        reason=drive.reason,
        maps=drive.maps,
    )
