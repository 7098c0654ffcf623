"""One admitted program on the seat its request checked out (PROTOCOL §6, SERVER §5–§8).

``ProgramRun.execute`` sends the program to the seat's worker (or, for ``gpu_count``, to a
transient worker holding a leased GPU set, §6.5), collects its messages under a deadline
that pauses while the worker waits for a GPU lease, and ends in one ``RunResult``: the
program finished, timed out, crashed, was cancelled, spoke garbage or lost its GPU to a
quarantine. The worker's fate is the pool's: ``Pool.retirement`` decides once, ``release``
applies it. What the request answers is ``execute``'s ``ProgramOutcome`` or ``RequestFailed``.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kcoral_server import ipc
from kcoral_server.blob_resolution import Resolution
from kcoral_server.body import bytes_memfd, memfd_locations
from kcoral_server.identity import Identity
from kcoral_server.lease import GpuQuarantined
from kcoral_server.offload import INLINE_BYTES, on_loop
from kcoral_server.pool import NoWorker, RunResult, Seat
from kcoral_server.request_control import Cancellation, RequestObserver
from kcoral_server.responses import ProgramOutcome, RequestFailed, ReturnRecord, close_maps
from kcoral_server.worker_channel import ReceiveInterrupted, WorkerGone, close_fds
from kcoral_server.worker_handle import WorkerHandle, WorkerStartError
from kcoral_server.workspace import NO_OUTPUT, CapturedOutput, Workspace

from kcoral.protocol.schema import Instruction, Program, Return

if TYPE_CHECKING:
    from kcoral_server.app import ServerState

CRASH_MESSAGE = "worker exited while executing the instruction"
#: PROTOCOL §7.1: the fixed message of a clean-up that could not be verified
CLEANUP_MESSAGE = "worker cleanup was not confirmed; affected devices unavailable"
# Return memfds are mapped prefaulted (64 MiB = 16,384 separate faults otherwise).
MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


class ProgramRun:
    """One program of one request on its checked-out seat; ``execute`` returns its
    ``ProgramOutcome`` (or raises ``RequestFailed``). ``finish_fields`` is the request's log
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
        finish_fields: dict[str, Any],
    ) -> None:
        self.state = state
        self.request_id = request_id
        self.identity = identity
        self.serialization = serialization
        self.observer = observer
        self.cancellation = cancellation
        self.finish_fields = finish_fields

    async def execute(
        self,
        seat: Seat,
        program: Program,
        parsed: Any,
        resolution: Resolution,
        timeout: float,
        limit: int,
        queue_ms: float,
    ) -> ProgramOutcome:
        state = self.state
        gpu_count = program.options.gpu_count
        if gpu_count is not None and seat.pinned is None:  # a session's GPUs are its seat's
            return await self._execute_on_set(
                seat, program, parsed, resolution, timeout, limit, queue_ms, gpu_count
            )
        try:
            # A reused worker never serves two identities (its /tmp, HOME, caches).
            await state.pool.serve_identity(seat, self.identity.name)
        except NoWorker:
            raise RequestFailed(503, "busy", "server saturated", "no_worker") from None
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
        handle.lease.begin_request(self.request_id)
        handle.lease.observe(self.observer.lease)
        try:
            drive = await self._drive(handle, parsed, resolution, timeout, limit, started)
        finally:
            handle.lease.observe(None)
        retire = state.pool.retirement(seat, drive.reason_retire)
        if drive.result is RunResult.FINISHED:
            # A one-shot worker closes its channel right after the outcome (gone is set):
            # its exit still has to be awaited and its code checked (§6.3, SERVER §8).
            if retire is not None and (
                handle.gone is None or handle.returncode != 0 or handle.survivors
            ):
                # The deadline also covers a retiring worker's exit (SERVER §8).
                remaining = timeout - self._budget_used(handle, started)
                exited = await state.pool.stop_worker(handle, max(0.0, remaining))
                if not exited:
                    drive = await self._timed_out(handle, drive)
                    retire = "timeout"
                elif (
                    drive.status == "COMPLETED"
                    and handle.returncode not in (0, None)
                    and drive.last_instruction is not None
                ):
                    self.finish_fields["exitcode"] = handle.returncode
                    drive.status = "FAILED"
                    drive.reason = "program_failed"
                    drive.error = _instruction_error(
                        drive.last_instruction,
                        f"worker exited with code {handle.returncode} during teardown",
                    )
        try:
            # Output is read before the seat is handed on: the worker's next request
            # recreates (truncates) the same capture files.
            output = await self._read_output(drive)
        finally:
            state.pool.release(seat, retire)
        return await self._finish_outcome(drive, handle, started, output)

    async def _execute_on_set(
        self,
        seat: Seat,
        program: Program,
        parsed: Any,
        resolution: Resolution,
        timeout: float,
        limit: int,
        queue_ms: float,
        count: int,
    ) -> ProgramOutcome:
        """PROTOCOL §6.5: a transient fresh worker holding a set of ``count`` GPUs."""
        state = self.state
        assert state.arbiter is not None
        started = time.monotonic()
        handle = state.pool.set_worker(seat)
        handle.lease.begin_request(self.request_id)
        handle.lease.observe(self.observer.lease)
        try:
            gpu_ids = await self.cancellation.unless(
                handle.take_gpu_set(count, self.request_id, state.gpu_uuid)
            )
        except BaseException as exc:
            handle.lease.withdraw()
            state.pool.release_unused(seat)
            if isinstance(exc, GpuQuarantined):
                raise RequestFailed(503, "busy", "server saturated", "no_worker") from None
            raise
        self.finish_fields["gpu_ids"] = gpu_ids
        state.events.emit(
            "request_routed",
            request_id=self.request_id,
            worker_id=seat.id,
            gpu_id=seat.gpu_id,
            gpu_ids=gpu_ids,
            generation=seat.generation,
            pid=None,
            queue_ms=queue_ms,
        )
        try:
            remaining = timeout - self._budget_used(handle, started)
            try:
                await self.cancellation.unless(handle.start(timeout=max(0.001, remaining)))
            except WorkerStartError as exc:
                await state.pool.kill(handle)
                self._confirm_cleanup(handle)
                if self._budget_used(handle, started) >= timeout:
                    raise RequestFailed(504, "timeout", "execution timed out", "timeout") from None
                raise RequestFailed(
                    500, "engine", "worker crashed", "crashed", error_detail=str(exc)
                ) from None
            drive = await self._drive(handle, parsed, resolution, timeout, limit, started)
            # The transient worker is killed while holding its set (§6.5).
            await state.pool.kill(handle)
            output = await self._read_output(drive)
            outcome = await self._finish_outcome(drive, handle, started, output)
            outcome.gpu_ids = gpu_ids
            return outcome
        finally:
            await state.pool.kill(handle)
            handle.lease.release()
            state.pool.release_unused(seat)

    def _confirm_cleanup(self, handle: WorkerHandle) -> None:
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

    def _budget_used(self, handle: WorkerHandle, started: float) -> float:
        now = time.monotonic()
        return (now - started) - handle.lease.wait_so_far(now)

    async def _drive(
        self,
        handle: WorkerHandle,
        parsed: Any,
        resolution: Resolution,
        timeout: float,
        limit: int,
        started: float,
    ) -> _Drive:
        """Send the program and collect messages until ``ProgramFinished``, a timeout or a
        crash."""
        state = self.state
        workspace = Workspace.create(
            state.events.output_dir, str(handle.pid) if limit > 0 else None, limit
        )
        drive = _Drive(workspace=workspace, limit=limit, instructions=parsed.program.instructions)
        if limit > 0:
            self.observer.output_started(workspace, limit)
        if self.cancellation.reason is not None:
            return await self._cancelled(handle, drive)
        extra_fd = progress_fd = None
        try:
            blobs, fds, extra_fd = await self._blob_slices(resolution.blobs)
            drive.progress, progress_fd = handle.progress_slot()
            progress_index = None
            if progress_fd is not None:
                progress_index = len(fds)
                fds.append(progress_fd)
            if drive.progress is not None:
                drive.progress.reset()
            handle.send(
                ipc.RunProgram(
                    request_id=self.request_id,
                    program_json=bytes(parsed.program_bytes).decode("utf-8"),
                    workspace=workspace.root,
                    stdout_path=workspace.stdout_file,
                    stderr_path=workspace.stderr_file,
                    blobs=blobs,
                    serialization=self.serialization,
                    max_response_bytes=state.config.max_response_bytes,
                    progress_fd=progress_index,
                    # the slot names a crash's instruction; frames only for a live observer
                    report_instructions=drive.progress is None
                    or self.observer.follows_instructions,
                ),
                fds,
            )
        except WorkerGone as gone:
            return await self._gone(handle, drive, gone)
        finally:
            for fd in (extra_fd, progress_fd):
                if fd is not None:
                    os.close(fd)
        self.cancellation.driving(handle)
        try:
            return await self._collect(handle, drive, timeout, started)
        finally:
            self.cancellation.driving(None)
            handle.channel.clear_interrupt()

    async def _collect(
        self, handle: WorkerHandle, drive: _Drive, timeout: float, started: float
    ) -> _Drive:
        # The deadline is one alarm that interrupts the receive (as a cancel does), not a
        # timeout per message: ``wait_for`` costs a task, a timer and three loop hops for
        # each of the ~6 messages of even a trivial program.
        loop = asyncio.get_running_loop()
        alarm: asyncio.TimerHandle | None = None
        try:
            while True:
                if self.cancellation.reason is not None:
                    ending = self._cancelled(handle, drive)
                    break
                used = self._budget_used(handle, started)
                if used >= timeout and not handle.lease.waiting:
                    ending = self._timed_out(handle, drive)
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
                    ending = self._gone(handle, drive, gone)
                    break
                try:
                    if isinstance(message, ipc.InstructionStarted):
                        drive.last_instruction = message
                        self.observer.instruction(message.index, message.op, message.id)
                    elif isinstance(message, ipc.ReturnProduced):
                        drive.returns.append(self._return_record(message, fds, drive))
                    elif isinstance(message, ipc.ProgramFinished):
                        close_fds(fds)
                        drive.read_progress()
                        return self._program_finished(message, drive, handle)
                    else:
                        raise ValueError(f"unexpected message {message.tag!r}")
                except (ValueError, TypeError, OSError) as exc:
                    close_fds(fds)
                    ending = self._gone(handle, drive, WorkerGone(str(exc), invalid=True))
                    break
        finally:
            if alarm is not None:
                alarm.cancel()  # before any kill: nothing may interrupt later receives
        return await ending

    def _return_record(
        self, message: ipc.ReturnProduced, fds: list[int], drive: _Drive
    ) -> ReturnRecord:
        lengths = [int(n) for n in message.part_lengths]
        if any(n < 0 for n in lengths) or len(fds) != (1 if lengths else 0):
            close_fds(fds)
            raise ValueError("return parts do not match their descriptor")
        parts: list[memoryview] = []
        if fds:
            total = sum(lengths)
            try:
                size = os.fstat(fds[0]).st_size
                if size < total:
                    raise ValueError("return memfd is shorter than its parts")
                if total:
                    mapped = mmap.mmap(fds[0], total, flags=MAP_FLAGS, prot=mmap.PROT_READ)
                    drive.maps.append(mapped)
                    view = memoryview(mapped)
                    offset = 0
                    for n in lengths:
                        parts.append(view[offset : offset + n])
                        offset += n
                else:
                    parts = [memoryview(b"") for _ in lengths]
            finally:
                close_fds(fds)
        if not isinstance(message.node, dict) or not isinstance(message.key, str):
            raise ValueError("return node is not an object")
        return ReturnRecord(message.key, message.node, parts)

    def _program_finished(
        self, message: ipc.ProgramFinished, drive: _Drive, handle: WorkerHandle
    ) -> _Drive:
        if message.status not in ("COMPLETED", "FAILED"):
            raise ValueError(f"unknown program status {message.status!r}")
        if message.status == "FAILED" and not isinstance(message.error, dict):
            raise ValueError("FAILED without an error object")
        drive.result = RunResult.FINISHED
        drive.status = message.status
        drive.error = message.error if message.status == "FAILED" else None
        if drive.error is not None and drive.error.get("kind") == "gpu_access":
            self._record_gpu_access(drive.error, message.gpu_access_at, handle)
        if message.left_processes:
            drive.reason_retire = "request_limit"
            if drive.status == "COMPLETED" and drive.last_instruction is not None:
                drive.status = "FAILED"
                drive.error = _instruction_error(
                    drive.last_instruction,
                    "program left background processes running; they were terminated",
                )
        if message.poisoned:
            drive.reason_retire = "poisoned_context"
        drive.reason = "completed" if drive.status == "COMPLETED" else "program_failed"
        return drive

    def _record_gpu_access(
        self, error: dict[str, Any], at: float | None, handle: WorkerHandle
    ) -> None:
        """PROTOCOL §7.6: name the request that held this GPU when the cpu_only call entered
        CUDA (null when none, or itself), from the arbiter's holder history; log it."""
        arbiter = self.state.arbiter
        interfered = None
        if arbiter is not None and at is not None:
            for gpu in handle.gpu_ids:
                holder = arbiter.request_at(gpu, float(at))
                if holder is not None and holder != self.request_id:
                    interfered = holder
                    break
        error["interfered_request_id"] = interfered
        self.state.events.emit(
            "gpu_access_violation",
            "WARNING",
            request_id=self.request_id,
            worker_id=handle.seat_id,
            gpu_id=handle.gpu_ids[0] if handle.gpu_ids else None,
            instruction_id=error.get("instruction_id"),
            cuda_call=error.get("cuda_call"),
            location=error.get("location"),
            interfered_request_id=interfered,
        )

    async def _timed_out(self, handle: WorkerHandle, drive: _Drive) -> _Drive:
        await self.state.pool.kill(handle)
        drive.result = RunResult.TIMED_OUT
        drive.reason = "timeout"
        drive.reason_retire = "timeout"
        self.finish_fields["output_tail"] = drive.workspace.output_tail()
        return drive

    async def _cancelled(self, handle: WorkerHandle, drive: _Drive) -> _Drive:
        """Kill the program as for a timeout (under the lease); the worker is replaced."""
        await self.state.pool.kill(handle)
        drive.result = RunResult.CANCELLED
        drive.reason = self.cancellation.reason or "cancelled"
        drive.reason_retire = "cancelled"
        self.finish_fields["output_tail"] = drive.workspace.output_tail()
        return drive

    async def _gone(self, handle: WorkerHandle, drive: _Drive, gone: WorkerGone) -> _Drive:
        await self.state.pool.kill(handle)
        drive.read_progress()  # the process is gone: the slot holds its last word
        drive.reason_retire = "crashed"
        self.finish_fields["exitcode"] = handle.returncode
        self.finish_fields["output_tail"] = drive.workspace.output_tail()
        if handle.lease.quarantined:
            drive.result = RunResult.QUARANTINED  # its GPU was taken out of service under it
        elif gone.invalid:
            drive.result = RunResult.INVALID
            drive.reason = "server_error"
        elif drive.last_instruction is not None:
            drive.result = RunResult.FINISHED
            drive.status = "FAILED"
            drive.error = _instruction_error(drive.last_instruction, CRASH_MESSAGE)
            drive.reason = "crashed"
        else:
            drive.result = RunResult.CRASHED
            drive.reason = "crashed"
        return drive

    async def _blob_slices(
        self, blobs: dict[str, bytes | memoryview]
    ) -> tuple[list[ipc.BlobSlice], list[int], int | None]:
        """Blob locations for the worker: blobs inside a body memfd (this request's, or one
        the memory cache kept) by descriptor, other cached ones copied into a new memfd."""
        located, fds, copies = memfd_locations(blobs)
        slices = [ipc.BlobSlice(*where) for where in located]
        extra_fd = None
        if copies:
            if on_loop(sum(len(memoryview(data)) for _, data in copies)):
                extra_fd, placed = bytes_memfd(copies)  # cheaper than a thread hand-off
            else:
                loop = asyncio.get_running_loop()
                extra_fd, placed = await loop.run_in_executor(
                    self.state.executor, bytes_memfd, copies
                )
            index = len(fds)
            fds.append(extra_fd)
            slices += [ipc.BlobSlice(sha, index, off, n) for sha, off, n in placed]
        return slices, fds, extra_fd

    async def _read_output(self, drive: _Drive) -> CapturedOutput:
        """Drain live output (jobs), then read the response's output (finished programs)."""
        if drive.limit <= 0:
            return NO_OUTPUT
        await self.observer.output_finished()
        if drive.result is not RunResult.FINISHED:
            return NO_OUTPUT
        # small output is read here: cheaper than a thread hand-off
        output = drive.workspace.read_small_output(drive.limit, INLINE_BYTES)
        if output is not None:
            return output
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self.state.executor, drive.workspace.read_output, drive.limit
        )

    async def _finish_outcome(
        self, drive: _Drive, handle: WorkerHandle, started: float, output: CapturedOutput
    ) -> ProgramOutcome:
        loop = asyncio.get_running_loop()
        # Read now: once the seat is handed on, the handle times the next request.
        lease_wait, lease_held = handle.lease.end_request()
        elapsed = time.monotonic() - started
        if not drive.workspace.remove_if_empty():
            # a tree the program wrote: walking it can take long, keep it off the loop
            await loop.run_in_executor(self.state.executor, drive.workspace.remove)
        self.finish_fields.update(
            elapsed_ms=elapsed * 1000.0,
            lease_wait_ms=lease_wait * 1000.0,
            lease_held_ms=lease_held * 1000.0,
        )
        if handle.cleanup_unconfirmed is not None:
            close_maps(drive.maps)
            self._confirm_cleanup(handle)
        if drive.result is RunResult.QUARANTINED:
            close_maps(drive.maps)
            raise RequestFailed(503, "busy", "server saturated", "no_worker")
        if drive.result is RunResult.TIMED_OUT:
            close_maps(drive.maps)
            raise RequestFailed(504, "timeout", "execution timed out", "timeout")
        if drive.result is RunResult.INVALID:
            close_maps(drive.maps)
            raise RequestFailed(500, "engine", "invalid worker response", "server_error")
        if drive.result is RunResult.CRASHED:
            close_maps(drive.maps)
            raise RequestFailed(500, "engine", "worker crashed", "crashed")
        if drive.result is RunResult.CANCELLED:
            close_maps(drive.maps)
            raise self.cancellation.failure()
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


@dataclass
class _Drive:
    """Progress of one program on a worker."""

    workspace: Workspace
    limit: int
    result: RunResult | None = None  # None while the program runs
    status: str = "FAILED"
    error: dict[str, Any] | None = None
    returns: list[ReturnRecord] = field(default_factory=list)
    last_instruction: ipc.InstructionStarted | None = None
    reason: str = "server_error"
    reason_retire: str | None = None
    maps: list[mmap.mmap] = field(default_factory=list)
    instructions: Sequence[Instruction] = ()
    progress: ipc.ProgressSlot | None = None  # the worker's, when it has one

    def read_progress(self) -> None:
        """Take the last instruction started from the progress slot (the program is over):
        without ``InstructionStarted`` frames this is the only record of it. A value that
        names no instruction of this program (uploaded code can write the slot) leaves what
        the frames said, if anything."""
        if self.progress is None:
            return
        index = self.progress.last_started(len(self.instructions))
        if index is None:
            return
        instruction = self.instructions[index]
        self.last_instruction = ipc.InstructionStarted(
            index=index,
            op=instruction.op,
            id=None if isinstance(instruction, Return) else instruction.id,
        )


def _instruction_error(instruction: ipc.InstructionStarted, message: str) -> dict[str, Any]:
    return {
        "kind": "runtime",
        "message": message,
        "instruction_index": instruction.index,
        "instruction_op": instruction.op,
        "instruction_id": instruction.id,
        "traceback": "",
    }
