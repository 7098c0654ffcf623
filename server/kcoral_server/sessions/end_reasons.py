"""Why a session ended, as its record says it (EXTENSIONS §11): the ``end_reason`` the pool's
retire reason becomes, and the one-line ``end_message`` that names the program and the
setting behind it (the next program gets it as ``410 session_ended``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kcoral_server.execution.responses import RequestFailed
from kcoral_server.processes import ipc

if TYPE_CHECKING:
    from kcoral_server.execution.pipeline import ExecuteRequest
    from kcoral_server.processes.handle import WorkerHandle

#: how long an interrupted program has to stop before its worker is killed (EXTENSIONS §11)
INTERRUPT_GRACE_SECONDS = 5.0
#: what a program sent to a session answers when an interrupt comes before it started
#: (while it waited for the worker's clean-up, or for an interrupted program to stop)
NOT_STARTED = "interrupted before it started: the program never ran; the session keeps its state"
#: how the pool's retire reason becomes a session's end reason (EXTENSIONS §11)
END_REASONS = {
    "timeout": "timeout",
    "crashed": "worker_exited",
    "request_limit": "leftover_work",  # its program left child processes (SERVER §6)
    ipc.SANDBOX_CLEANUP: "leftover_work",
    "cancelled": "interrupt_grace",
}


def retired_end(
    retire_reason: str | None, program: str | None, interrupted: bool, worker: WorkerHandle | None
) -> tuple[str, str]:
    """The end reason and message of a session whose worker the pool retired after
    ``program`` (``retire_reason``; None for a worker found gone); ``interrupted``: an
    interrupt hit that program."""
    reason = END_REASONS.get(retire_reason or "crashed", "worker_exited")
    if reason == "worker_exited":
        # a worker found dead before the program's first instruction (its progress slot
        # untouched since the program was sent) died between programs: the program
        # never ran, so the message does not blame it
        slot = worker.progress if worker is not None else None
        started = slot is None or slot.any_started()
        return reason, exited_message(worker, program if started else None)
    if reason == "timeout":
        return reason, f"session ended: {program} passed its deadline and its worker was killed"
    if reason == "interrupt_grace" and interrupted:
        return reason, not_stopped_message(program)
    if reason == "interrupt_grace":
        return reason, f"session ended: {program} was cancelled and its worker was killed"
    return reason, f"session ended: {program} left threads or processes running"


def exited_message(worker: WorkerHandle | None, program: str | None) -> str:
    """The end message of a session whose worker exited (during ``program``, if one ran)."""
    code = worker.returncode if worker is not None else None
    how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
    during = f" during {program}" if program else ""
    return f"session ended: its worker exited{during} ({how}); its state is lost"


def idle_message(timeout: float, asked: bool, server_default: float) -> str:
    """Why the idle timeout ended a session, naming the setting that set it: the session's
    own ``idle_timeout_seconds`` (a client's ``idle_timeout``, ``--idle``) or the server's
    default (EXTENSIONS §11)."""
    ended = f"session ended after {timeout:g} s without a program"
    if asked:
        return (
            f"{ended} (the session's idle_timeout_seconds; --session-idle-seconds "
            f"allows {server_default:g} s)"
        )
    return f"{ended} (--session-idle-seconds)"


def program_name(request: ExecuteRequest) -> str:
    """How a session's end names the program that ended it: ``job ID`` for a job, the id
    its cell and ``%kcoral jobs`` show (a session cell is a job: "program <request id>"
    named an id the user never saw), else ``program REQUEST_ID``."""
    job_id = getattr(request.observer, "id", None)
    return f"job {job_id}" if isinstance(job_id, str) else f"program {request.request_id}"


def not_stopped_message(program: str | None) -> str:
    """The end message of a session whose program outlived an interrupt's grace."""
    return (
        f"session ended: {program} did not stop within "
        f"{INTERRUPT_GRACE_SECONDS:g} s of an interrupt and its worker was killed"
    )


def ended_under(message: str) -> RequestFailed:
    """The answer of a program whose session ended under it (EXTENSIONS §11): the 410 the
    next program would get, instead of a 499 'the job was cancelled' nobody submitted."""
    return RequestFailed(410, "session_ended", message, "cancelled")
