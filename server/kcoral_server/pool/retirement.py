"""After a program: how its run ended, whether its worker retires, and a kept worker's
report that it is clean again (SERVER.md §4, §6).

``retirement`` is the one decision; ``Pool.release`` applies it. A worker that stays waits
for ``reason_to_retire`` before it takes the next program.
"""

from __future__ import annotations

import asyncio
import enum

from kcoral_server.pool.seat import Seat
from kcoral_server.processes import ipc
from kcoral_server.processes.channel import WorkerGone, close_fds
from kcoral_server.processes.handle import WorkerHandle
from kcoral_server.storage.event_log import EventLog

#: the level of the ``worker_retired`` event for each reason
RETIRE_LEVELS = {
    "request_limit": "INFO",
    "poisoned_context": "WARNING",
    "sandbox_cleanup": "WARNING",
    "timeout": "WARNING",
    "crashed": "ERROR",
    "cancelled": "INFO",  # its program was cancelled (EXTENSIONS §5, §9)
    "identity": "INFO",  # the next program belongs to another identity
    "disk_limit": "WARNING",  # its program passed --workspace-limit-bytes (sandbox)
    "preload": "INFO",  # idle and unused, it gave way to a spare that preloaded torch
}
#: how long a kept worker may take to report clean before it counts as crashed
REUSE_READY_TIMEOUT_SECONDS = 60.0


class RunResult(enum.Enum):
    """How one program's run on a worker ended (the pipeline answers from it)."""

    FINISHED = "finished"  # ProgramFinished (COMPLETED or FAILED), or a crash mid-instruction
    TIMED_OUT = "timeout"  # the deadline passed: killed under its lease
    CRASHED = "crashed"  # the worker died before running an instruction
    CANCELLED = "cancelled"  # a job cancel or a client disconnect: killed under its lease
    INVALID = "invalid"  # the worker spoke garbage
    QUARANTINED = "quarantined"  # a GPU it needs was taken out of service under it


def retirement(seat: Seat, asked: str | None, max_requests_per_worker: int) -> str | None:
    """Whether the seat's worker retires after its current program: ``asked`` (the run's
    reason: timeout, crashed, cancelled, or the worker's own, e.g. poisoned_context), else
    the reuse limit (``request_limit``; never for a session's seat), else None (reuse)."""
    limit = max_requests_per_worker
    if asked is None and limit and seat.served + 1 >= limit and seat.pinned is None:
        return "request_limit"
    return asked


def emit_retired(events: EventLog, seat: Seat, handle: WorkerHandle, reason: str) -> None:
    """The ``worker_retired`` event (SERVER.md §13) of ``seat``'s worker ``handle``."""
    events.emit(
        "worker_retired",
        RETIRE_LEVELS.get(reason, "INFO"),
        worker_id=seat.id,
        gpu_id=seat.gpu_id,
        generation=seat.generation,
        pid=handle.pid,
        reason=reason,
    )


async def reason_to_retire(handle: WorkerHandle) -> str | None:
    """Wait for a kept worker's ``WorkerReady`` after its program, then free the lease it
    forgot. None when it is clean; else the reason it retires: its own (``WorkerRetiring``:
    ``sandbox_cleanup``), or ``crashed`` when it says anything else, goes away or takes
    too long."""
    try:
        message, fds = await handle.channel.receive(REUSE_READY_TIMEOUT_SECONDS)
        close_fds(fds)
    except (asyncio.TimeoutError, TimeoutError, WorkerGone):
        return "crashed"
    if isinstance(message, ipc.WorkerRetiring) and message.reason == ipc.SANDBOX_CLEANUP:
        return message.reason  # the one reason a worker gives itself (a program could lie)
    if not isinstance(message, ipc.WorkerReady):
        return "crashed"  # anything else between requests is a protocol violation
    handle.lease.release()  # after ProgramFinished the worker forgot the lease; ours to free
    return None
