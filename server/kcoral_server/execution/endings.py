"""How a run that did not finish ends (PROTOCOL §6.4, SERVER §8, §11): timed out, past its
disk limit, cancelled, or its worker gone. Each kills the worker under its GPUs' lease
(``Pool.kill``), tells the run's ``ProgramDrive`` why, and keeps the output's tail for the
request's log record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kcoral_server.execution.drive import ProgramDrive
from kcoral_server.execution.exit_cause import exit_cause, limit_cause
from kcoral_server.execution.request_record import RequestRecord
from kcoral_server.processes.channel import WorkerGone
from kcoral_server.processes.handle import WorkerHandle, event_fields
from kcoral_server.storage import workspace_watch
from kcoral_server.storage.event_log import EventLog

#: how long a worker whose channel ended may take to report its exit before the server's
#: own kill (it follows within milliseconds; only a lost worker waits for it)
EXIT_REPORT_SECONDS = 0.2

if TYPE_CHECKING:
    from kcoral_server.pool.pool import Pool


class RunEndings:
    """The four ends of one ``SeatRun`` other than its program finishing."""

    def __init__(self, pool: Pool, events: EventLog, record: RequestRecord) -> None:
        self.pool = pool
        self.events = events
        self.record = record

    async def timed_out(
        self, handle: WorkerHandle, drive: ProgramDrive, message: str
    ) -> ProgramDrive:
        await self.pool.kill(handle)
        drive.timed_out(message)
        self.record.output_tail = drive.workspace.output_tail()
        return drive

    async def disk_limit_passed(
        self, handle: WorkerHandle, drive: ProgramDrive, limit: int
    ) -> ProgramDrive:
        """Kill the program as for a timeout; its seat's sandbox directory is discarded, so
        that what it wrote (caches, HOME) does not end the seat's next programs too."""
        await self.pool.kill(handle)
        if handle.seat_sandbox is not None:
            handle.seat_sandbox.spoiled = True
        drive.disk_limit_passed(limit)
        message = workspace_watch.limit_message(limit)
        self.events.emit(
            "worker_limit_exceeded", "WARNING", **event_fields(handle), message=message
        )
        self.record.output_tail = drive.workspace.output_tail()
        return drive

    async def cancelled(
        self, handle: WorkerHandle, drive: ProgramDrive, reason: str | None
    ) -> ProgramDrive:
        """Kill the program as for a timeout (under the lease); the worker is replaced."""
        await self.pool.kill(handle)
        drive.cancelled(reason)
        self.record.output_tail = drive.workspace.output_tail()
        return drive

    async def gone(
        self, handle: WorkerHandle, drive: ProgramDrive, gone: WorkerGone
    ) -> ProgramDrive:
        cause = limit_cause(handle.cgroup)  # read before the kill removes the cgroup
        said_by_exit = cause is None and not gone.invalid
        # Whether it ended before the server's own kill (which sends SIGTERM too): its exit
        # report follows the end of its channel within milliseconds. Waited for only where
        # the exit is what the answer says (not after a limit, nor for a worker that spoke
        # garbage and may still run).
        ended_alone = said_by_exit and await handle.wait_exit(EXIT_REPORT_SECONDS)
        await self.pool.kill(handle)
        if said_by_exit:
            cause = exit_cause(
                handle.returncode,
                ended_alone=ended_alone,
                launcher_returncode=handle.launcher_returncode,
            )
        drive.worker_lost(gone, quarantined=handle.lease.quarantined, cause=cause)
        self.record.exitcode = handle.returncode
        self.record.output_tail = drive.workspace.output_tail()
        return drive
