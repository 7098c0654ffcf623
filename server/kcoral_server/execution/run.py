"""One admitted program on the seat its request checked out (PROTOCOL §6, SERVER §5–§8).

``SeatRun.execute`` sends the program to the seat's worker (or, for ``gpu_count``, to a
transient worker holding a leased GPU set, §6.5), collects its messages under a deadline
that pauses while the worker waits for a GPU lease, and ends in one ``RunResult``: the
program finished, timed out, crashed, was cancelled, spoke garbage or lost its GPU to a
quarantine. The worker's fate is the pool's: ``Pool.retirement`` decides once, ``release``
applies it. What the request answers is ``execute``'s ``ProgramOutcome`` or ``RequestFailed``
(``program_outcome``); the run's state is a ``drive.ProgramDrive``, and the records made
from the worker's messages come from ``records``. What the run learns for the request's log
goes into its ``RequestRecord``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from typing import TYPE_CHECKING

from kcoral_server.execution.admitted import AdmittedProgram
from kcoral_server.execution.blob_handover import blob_slices, read_output
from kcoral_server.execution.control import Cancellation, RequestObserver
from kcoral_server.execution.drive import ProgramDrive
from kcoral_server.execution.endings import RunEndings
from kcoral_server.execution.exit_cause import TIMEOUT_MESSAGE, deadline_message
from kcoral_server.execution.exit_report import announced_exit
from kcoral_server.execution.gpu_set import execute_on_gpu_set
from kcoral_server.execution.outcome import program_outcome
from kcoral_server.execution.records import output_sizes, record_gpu_access
from kcoral_server.execution.request_record import RequestRecord, RunTimes
from kcoral_server.execution.responses import ProgramOutcome, saturated
from kcoral_server.front_door.callers import Identity
from kcoral_server.pool.queue import NoWorker
from kcoral_server.pool.retirement import RunResult
from kcoral_server.pool.seat import Seat
from kcoral_server.processes import ipc
from kcoral_server.processes.channel import ReceiveInterrupted, WorkerGone, close_fds
from kcoral_server.processes.handle import WorkerHandle
from kcoral_server.processes.output_order import OutputOrder
from kcoral_server.storage.workspace import CapturedOutput, Workspace
from kcoral_server.storage.workspace_watch import WorkspaceWatch

if TYPE_CHECKING:
    from kcoral_server.front_door.app import ServerState


class SeatRun:
    """One program of one request on its checked-out seat; ``execute`` returns its
    ``ProgramOutcome`` (or raises ``RequestFailed``). ``record`` is the request's log
    record, filled in as the run learns things."""

    def __init__(
        self,
        state: ServerState,
        *,
        request_id: str,
        identity: Identity,
        serialization: str | None,
        observer: RequestObserver,
        cancellation: Cancellation,
        record: RequestRecord,
    ) -> None:
        self.state = state
        self.request_id = request_id
        self.identity = identity
        self.serialization = serialization
        self.observer = observer
        self.cancellation = cancellation
        self.record = record
        self.timeout_message = TIMEOUT_MESSAGE  # with the deadline once ``execute`` knows it
        self.endings = RunEndings(state.pool, state.events, record)

    async def execute(
        self, seat: Seat, admitted: AdmittedProgram, queue_ms: float
    ) -> ProgramOutcome:
        state = self.state
        options = admitted.program.options
        # for a 504's message: the deadline and the setting that set it
        self.timeout_message = deadline_message(
            admitted.timeout, options.timeout_seconds, state.config
        )
        if options.gpu_count is not None and seat.pinned is None:  # a session's: its seat's
            return await execute_on_gpu_set(self, seat, admitted, queue_ms)
        try:
            # A reused worker never serves two identities (its /tmp, HOME, caches).
            await state.pool.serve_identity(seat, self.identity.name, self.observer.lease)
        except NoWorker as exc:
            raise saturated(str(exc)).failure() from None
        handle = seat.worker
        assert handle is not None
        state.events.emit(
            "request_routed",
            request_id=self.request_id,
            worker_id=seat.id,
            gpu_id=seat.gpu_id,
            gpu_ids=handle.gpu_ids,
            generation=seat.generation,
            pid=handle.pid,
            queue_ms=queue_ms,
        )
        started = time.monotonic()
        handle.lease.begin_request(self.request_id, self.identity.name)
        handle.lease.observe(self.observer.lease)
        try:
            drive = await self.drive_program(handle, admitted, started)
        finally:
            handle.lease.observe(None)
        retire = state.pool.retirement(seat, drive.reason_retire)
        if drive.result is RunResult.FINISHED:
            # A retiring worker's exit code is checked (§6.3, SERVER §8): the one a
            # one-shot worker announces once nothing of it can change the answer, else the
            # real one, awaited within the deadline.
            code = None
            if retire is not None and handle.transient:
                remaining = admitted.timeout - self.budget_used(handle, started)
                code = await announced_exit(handle, remaining)
            if (
                code is None
                and retire is not None
                and (handle.gone is None or handle.returncode != 0 or handle.survivors)
            ):
                # The deadline also covers a retiring worker's exit (SERVER §8).
                remaining = admitted.timeout - self.budget_used(handle, started)
                if await state.pool.stop_worker(handle, max(0.0, remaining)):
                    code = handle.returncode
                else:
                    drive = await self.endings.timed_out(handle, drive, self.timeout_message)
                    retire = "timeout"
            if (
                code is not None
                and code != 0
                and drive.status == "COMPLETED"
                and drive.last_instruction is not None
            ):
                self.record.exitcode = code
                drive.failed_at_teardown(code)
        try:
            # Output is read before the seat is handed on: the worker's next request
            # recreates (truncates) the same capture files.
            output = await read_output(drive, self.observer, state.executor)
        finally:
            state.pool.release(seat, retire)
        return await self.finish_outcome(drive, handle, started, output)

    def budget_used(self, handle: WorkerHandle, started: float) -> float:
        now = time.monotonic()
        return (now - started) - handle.lease.wait_so_far(now)

    async def drive_program(
        self, handle: WorkerHandle, admitted: AdmittedProgram, started: float
    ) -> ProgramDrive:
        """Send the program and collect messages until ``ProgramFinished``, a timeout or a
        crash."""
        state = self.state
        limit = admitted.output_limit
        # a sandboxed program's workspace is its sandbox's own (``run_program`` sends its path)
        workspace = Workspace.create(
            state.events.output_dir,
            str(handle.pid) if limit > 0 else None,
            limit,
            directory=handle.sandbox_dir is None,
        )
        drive = ProgramDrive(
            workspace=workspace, limit=limit, instructions=admitted.program.instructions
        )
        if limit > 0:
            self.observer.output_started(workspace, limit)
        if self.cancellation.reason is not None:
            return await self.endings.cancelled(handle, drive, self.cancellation.reason)
        extra_fd = progress_fd = None
        try:
            blobs, fds, extra_fd = await blob_slices(admitted.resolution.blobs, state.executor)
            slot, progress_fd = handle.progress_slot()
            drive.use_slot(slot, self.observer)
            progress_index = None
            if progress_fd is not None:
                progress_index = len(fds)
                fds.append(progress_fd)
            handle.send(
                ipc.RunProgram(
                    request_id=self.request_id,
                    program_json=bytes(admitted.parsed.program_bytes).decode("utf-8"),
                    workspace=workspace.root or "",
                    stdout_path=workspace.stdout_file,
                    stderr_path=workspace.stderr_file,
                    blobs=blobs,
                    serialization=self.serialization,
                    max_response_bytes=state.config.max_response_bytes,
                    progress_fd=progress_index,
                    # the slot names a crash's instruction; frames only for a live observer
                    report_instructions=drive.progress is None
                    or self.observer.follows_instructions,
                    deadline_seconds=max(0.0, admitted.timeout - self.budget_used(handle, started)),
                ),
                fds,
            )
        except WorkerGone as gone:
            return await self.endings.gone(handle, drive, gone)
        finally:
            for fd in (extra_fd, progress_fd):
                if fd is not None:
                    os.close(fd)
        self.cancellation.driving(handle)
        watch = self._workspace_watch(handle)
        try:
            return await self._collect(handle, drive, admitted.timeout, started, watch)
        finally:
            if watch is not None:
                await watch.stop()
            self.cancellation.driving(None)
            handle.channel.clear_interrupt()

    def _workspace_watch(self, handle: WorkerHandle) -> WorkspaceWatch | None:
        """The watch on a sandboxed worker's directory (``--workspace-limit-bytes``); None
        without a sandbox (nothing bounds its disk) or a limit."""
        limit = self.state.config.workspace_limit_bytes
        sandbox_dir = handle.sandbox_dir
        if not limit or sandbox_dir is None:
            return None
        watch = WorkspaceWatch(
            sandbox_dir.host_dir, limit, self.state.executor, handle.channel.interrupt
        )
        watch.start()
        return watch

    async def _collect(
        self,
        handle: WorkerHandle,
        drive: ProgramDrive,
        timeout: float,
        started: float,
        watch: WorkspaceWatch | None = None,
    ) -> ProgramDrive:
        # The deadline is one alarm that interrupts the receive (as a cancel does), not a
        # timeout per message: ``wait_for`` costs a task, a timer and three loop hops for
        # each of the ~6 messages of even a trivial program.
        loop = asyncio.get_running_loop()
        alarm: asyncio.TimerHandle | None = None
        try:
            while True:
                if self.cancellation.reason is not None:
                    ending = self.endings.cancelled(handle, drive, self.cancellation.reason)
                    break
                if watch is not None and watch.exceeded:
                    ending = self.endings.disk_limit_passed(handle, drive, watch.limit)
                    break
                used = self.budget_used(handle, started)
                if used >= timeout and not handle.lease.waiting:
                    ending = self.endings.timed_out(handle, drive, self.timeout_message)
                    break
                if alarm is None:
                    # The deadline only moves later (lease waits pause it): an alarm that
                    # rings early just leads to a new one.
                    wait = 0.25 if handle.lease.waiting else max(0.001, timeout - used)
                    alarm = loop.call_later(wait, handle.channel.interrupt)
                try:
                    message, fds = await handle.channel.receive(None)
                except ReceiveInterrupted:
                    alarm.cancel()
                    alarm = None
                    continue
                except WorkerGone as gone:
                    ending = self.endings.gone(handle, drive, gone)
                    break
                try:
                    if isinstance(message, ipc.InstructionStarted):
                        drive.last_instruction = message
                        self.observer.instruction(
                            message.index, message.op, message.id, output_sizes(message)
                        )
                    elif isinstance(message, ipc.ReturnProduced | ipc.ReturnTooLarge):
                        drive.returned(message, fds)
                    elif isinstance(message, OutputOrder):  # EXTENSIONS §16
                        drive.order_reported(message.runs, fds)
                        self.observer.output_order(drive.output_order)
                    elif isinstance(message, ipc.ProgramFinished):
                        close_fds(fds)
                        drive.read_progress()
                        return await self._program_finished(message, drive, handle)
                    else:
                        raise ValueError(f"unexpected message {message.tag!r}")
                except (ValueError, TypeError, OSError) as exc:
                    close_fds(fds)
                    ending = self.endings.gone(handle, drive, WorkerGone(str(exc), invalid=True))
                    break
        finally:
            if alarm is not None:
                alarm.cancel()  # before any kill: nothing may interrupt later receives
        return await ending

    async def _program_finished(
        self, message: ipc.ProgramFinished, drive: ProgramDrive, handle: WorkerHandle
    ) -> ProgramDrive:
        # Before the seat and the lease are handed on: processes the program left where
        # the worker does not look (SERVER §8) are killed, and fail it as leftovers do.
        found = handle.strays.find() if handle.strays is not None else []
        if found:
            assert handle.strays is not None
            loop = asyncio.get_running_loop()
            killed = await loop.run_in_executor(self.state.executor, handle.strays.kill, found)
            self.state.events.emit(
                "worker_strays_killed",
                "WARNING",
                request_id=self.request_id,
                worker_id=handle.seat_id,
                pid=handle.pid,
                pids=killed,
            )
            message = dataclasses.replace(message, left_processes=True)
        drive.finished(message)
        if drive.error is not None and drive.error.get("kind") == "gpu_access":
            record_gpu_access(
                drive.error,
                message.gpu_access_at,
                handle,
                request_id=self.request_id,
                arbiter=self.state.arbiter,
                events=self.state.events,
            )
        return drive

    async def finish_outcome(
        self, drive: ProgramDrive, handle: WorkerHandle, started: float, output: CapturedOutput
    ) -> ProgramOutcome:
        loop = asyncio.get_running_loop()
        # Read now: once the seat is handed on, the handle times the next request.
        lease_wait, lease_held = handle.lease.end_request()
        elapsed = time.monotonic() - started
        if not drive.workspace.remove_if_empty():
            # a tree the program wrote: walking it can take long, keep it off the loop
            await loop.run_in_executor(self.state.executor, drive.workspace.remove)
        self.record.times = RunTimes(
            elapsed_ms=elapsed * 1000.0,
            lease_wait_ms=lease_wait * 1000.0,
            lease_held_ms=lease_held * 1000.0,
        )
        return program_outcome(
            drive,
            handle,
            self.cancellation,
            output,
            elapsed=elapsed,
            lease_wait=lease_wait,
            lease_held=lease_held,
        )
