"""One ``/execute`` request, from a received body to a response (PROTOCOL §3, §6–§9).

Checks run in the order of PROTOCOL §3.2: rows 2–11 and 13 (parsing), row 9 (hashing),
cache resolution with row 14, row 15 (``CACHE_MISS``), then row 12. Bodies of at most 64 KiB
go through them on the event loop (a thread hand-off costs more); larger ones, and the disk
cache, in the executor. An admitted request takes a seat, runs on its worker under a deadline
that pauses while the worker waits for a GPU lease, and ends in exactly one
``request_finished`` event.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kcoral_server import ipc
from kcoral_server.blob_resolution import Resolution, resolve_blobs
from kcoral_server.body import RequestBody, bytes_memfd, memfd_locations
from kcoral_server.identity import DEFAULT, Identity
from kcoral_server.lease import GpuQuarantined
from kcoral_server.pool import NoWorker, RunResult, Seat
from kcoral_server.responses import (
    Outcome,
    Reply,
    RequestFailed,
    ReturnRecord,
    close_maps,
    encode_outcome,
    error_reply,
    json_reply,
)
from kcoral_server.worker_channel import ReceiveInterrupted, WorkerGone, close_fds
from kcoral_server.worker_handle import WorkerHandle, WorkerStartError
from kcoral_server.workspace import NO_OUTPUT, CapturedOutput, Workspace

from kcoral.errors import ValidationError
from kcoral.protocol.request import parse_execute_request, verify_blob_hashes
from kcoral.protocol.schema import Program

if TYPE_CHECKING:
    from kcoral_server.app import ServerState

FINISH_LEVELS = {
    "completed": "INFO",
    "program_failed": "INFO",
    "cache_miss": "INFO",
    "rejected": "WARNING",
    "no_worker": "WARNING",
    "timeout": "WARNING",
    "crashed": "ERROR",
    "server_error": "ERROR",
    "client_disconnected": "INFO",
    "cancelled": "INFO",
}
# Re-exported: handlers and jobs build replies with these.
__all__ = ["ExecuteRequest", "Reply", "RequestObserver", "error_reply", "json_reply"]
CRASH_MESSAGE = "worker exited while executing the instruction"
#: PROTOCOL §7.1: the fixed message of a clean-up that could not be verified
CLEANUP_MESSAGE = "worker cleanup was not confirmed; affected devices unavailable"
# Return memfds are mapped prefaulted (64 MiB = 16,384 separate faults otherwise).
MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
# Below these sizes work runs on the IO loop: a thread hand-off costs more CPU than the work.
INLINE_PARSE_BYTES = 64 * 1024
INLINE_READ_BYTES = 64 * 1024
INLINE_COPY_BYTES = 64 * 1024
GPU_COUNT_MESSAGE = "gpu_count exceeds this GPU server's configured capacity"
CANCELLED_STATUS = 499  # logged only: nobody is left to receive a cancelled request's answer
CANCEL_MESSAGES = {
    "cancelled": "the job was cancelled",
    "client_disconnected": "the client disconnected",
}


class RequestObserver:
    """Hooks a job uses to follow its request (``/execute`` passes none: all no-ops).

    Called on the event loop, in this order: ``accepted`` (every check passed, about to
    queue), ``assigned``, then any ``lease``/``instruction`` calls, ``output_started`` /
    ``output_finished`` around the program's run. ``output_finished`` must drain the capture
    files before the response reads them.
    """

    def accepted(self, request: ExecuteRequest) -> None:
        pass

    def assigned(self, worker_id: str, gpu_ids: list[int], queue_ms: float) -> None:
        pass

    def lease(self, phase: str) -> None:
        pass

    def instruction(self, index: int, op: str, instruction_id: str | None) -> None:
        pass

    def output_started(self, workspace: Workspace, limit: int) -> None:
        pass

    async def output_finished(self) -> None:
        pass


_NO_OBSERVER = RequestObserver()


class ExecuteRequest:
    """Everything about one request; ``run()`` returns its ``Reply``."""

    def __init__(
        self,
        state: ServerState,
        *,
        request_id: str,
        content_type: str | None,
        body: RequestBody,
        serialization: str | None,
        observer: RequestObserver | None = None,
        identity: Identity = DEFAULT,
    ) -> None:
        self.state = state
        self.identity = identity  # whose caches, jobs and workers this request may use
        self.observer = observer or _NO_OBSERVER
        self.request_id = request_id
        self.content_type = content_type
        self.body = body
        self.serialization = serialization
        self.finish_fields: dict[str, Any] = {}
        self.seat: Seat | None = None
        self.timeout_seconds: float | None = None
        self.finish_reason: str | None = None  # set once the request has ended
        self.cancel_reason: str | None = None
        self._cancel_event = asyncio.Event()
        self._driving: WorkerHandle | None = None  # the worker running the program now

    def cancel(self, reason: str) -> bool:
        """Stop this request (EXTENSIONS §5, §9): a queued one leaves the queue, a running
        one's process tree is killed under its lease and the worker replaced. ``reason`` is
        the finish reason (``cancelled`` or ``client_disconnected``). False when the request
        already ended or was cancelled before."""
        if self.finish_reason is not None or self.cancel_reason is not None:
            return False
        self.cancel_reason = reason
        self._cancel_event.set()
        if self._driving is not None:
            self._driving.channel.interrupt()
        return True

    def _cancelled_failure(self) -> RequestFailed:
        reason = self.cancel_reason or "cancelled"
        kind = "cancelled"
        return RequestFailed(CANCELLED_STATUS, kind, CANCEL_MESSAGES.get(reason, reason), reason)

    async def _unless_cancelled(self, awaitable: Any) -> Any:
        """Await ``awaitable`` unless the request is cancelled first (then it is cancelled
        too, and ``RequestFailed`` is raised)."""
        if self.cancel_reason is not None:
            if asyncio.iscoroutine(awaitable):
                awaitable.close()
            raise self._cancelled_failure()
        task = asyncio.ensure_future(awaitable)
        waiter = asyncio.ensure_future(self._cancel_event.wait())
        try:
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise self._cancelled_failure()

    # ------------------------------------------------------------------ top level

    async def run(self) -> Reply:
        state = self.state
        try:
            reply, reason = await self._run()
        except RequestFailed as failure:
            reply = error_reply(failure.status, self.request_id, failure.kind, failure.message)
            reason = failure.reason
            self.finish_fields.update(failure.fields)
            self.finish_fields.setdefault("error_kind", failure.kind)
            self.finish_fields.setdefault("error_message", failure.message[:2048])
        except Exception as exc:  # an unhandled front-end fault: never leak it to the client
            reply = error_reply(500, self.request_id, "engine", "internal server error")
            reason = "server_error"
            self.finish_fields.update(
                error_kind="engine",
                error_message=f"{type(exc).__name__}: {exc}"[:2048],
                traceback=traceback.format_exc()[-8192:],
            )
        finally:
            self.body.close()
        self.finish_reason = reason
        state.events.emit(
            "request_finished",
            FINISH_LEVELS.get(reason, "ERROR"),
            request_id=self.request_id,
            http_status=reply.status,
            finish_reason=reason,
            response_bytes=reply.length,
            **self.finish_fields,
        )
        return reply

    async def _run(self) -> tuple[Reply, str]:
        state = self.state
        loop = asyncio.get_running_loop()
        view = self.body.finish()
        # A small body parses, hashes and resolves faster than a thread hand-off (front-end
        # CPU per request); only the disk cache stays off the loop.
        small = len(view) <= INLINE_PARSE_BYTES
        try:
            if small:
                parsed = parse_execute_request(self.content_type, view, verify_hashes=False)
                verify_blob_hashes(parsed.blobs)
            else:
                parsed = await loop.run_in_executor(
                    state.executor,
                    lambda: parse_execute_request(self.content_type, view, verify_hashes=False),
                )
                if parsed.blobs:
                    await asyncio.gather(
                        *(
                            loop.run_in_executor(state.executor, verify_blob_hashes, {h: data})
                            for h, data in parsed.blobs.items()
                        )
                    )
        except ValidationError as exc:
            raise RequestFailed(400, "parse", str(exc), "rejected") from None
        program = parsed.program
        try:
            kinds = program.blob_kinds()
            if (small or not parsed.blobs) and not any("file" in used for used in kinds.values()):
                resolution = resolve_blobs(
                    state.memory_cache,
                    state.disk_cache,
                    program,
                    parsed.blobs,
                    self.identity.name,  # caches are per identity (EXTENSIONS §6)
                )
            else:
                resolution = await loop.run_in_executor(
                    state.executor,
                    resolve_blobs,
                    state.memory_cache,
                    state.disk_cache,
                    program,
                    parsed.blobs,
                    self.identity.name,
                )
        except ValidationError as exc:  # row 14
            raise RequestFailed(400, "parse", str(exc), "rejected") from None
        try:
            return await self._admitted(program, parsed, resolution)
        finally:
            for key in resolution.pins:
                state.memory_cache.unpin(key)

    async def _admitted(
        self, program: Program, parsed: Any, resolution: Resolution
    ) -> tuple[Reply, str]:
        state = self.state
        config = state.config
        if resolution.missing:
            self.finish_fields["missing"] = len(resolution.missing)
            body = {
                "status": "CACHE_MISS",
                "request_id": self.request_id,
                "missing_blobs": resolution.missing,
            }
            return json_reply(200, body), "cache_miss"
        options = program.options
        if options.gpu_count is not None and (
            state.mode == "cpu" or options.gpu_count > len(state.gpu_ids)
        ):
            raise RequestFailed(400, "parse", GPU_COUNT_MESSAGE, "rejected")
        timeout = config.default_timeout_seconds
        if options.timeout_seconds is not None:
            timeout = options.timeout_seconds
        timeout = min(float(timeout), float(config.max_timeout_seconds))
        limit = config.output_limit_bytes
        if options.output_limit_bytes is not None:
            limit = options.output_limit_bytes
        limit = min(int(limit), int(config.max_output_limit_bytes))
        self.timeout_seconds = timeout
        self.finish_fields["timeout_seconds"] = timeout

        program_file = state.events.record_program(self.request_id, bytes(parsed.program_bytes))
        ops = Counter(i.op for i in program.instructions)
        uploads = Counter(i.kind for i in program.instructions if i.op == "upload")
        accepted: dict[str, Any] = {
            "request_id": self.request_id,
            "request_bytes": self.body.size,
            "timeout_seconds": timeout,
            "program": program_file,
            "instructions": len(program.instructions),
            "ops": dict(ops),
            "uploads": dict(uploads),
            "blob_bytes": sum(len(memoryview(b)) for b in resolution.blobs.values()),
        }
        if options.gpu_count is not None:
            accepted["gpu_count"] = options.gpu_count
        state.events.emit("request_accepted", **accepted)
        self.observer.accepted(self)

        admitted_at = time.monotonic()
        if self.cancel_reason is not None:
            raise self._cancelled_failure()
        checkout = state.pool.checkout(
            config.worker_wait_timeout_seconds, owner=self.observer, wait=self._unless_cancelled
        )
        try:
            async with checkout as seat:
                queue_ms = (time.monotonic() - admitted_at) * 1000.0
                self.seat = seat
                self.finish_fields.update(worker_id=seat.id, gpu_id=seat.gpu_id, queue_ms=queue_ms)
                gpu_ids = seat.worker.gpu_ids if seat.worker is not None else []
                self.observer.assigned(seat.id, list(gpu_ids), queue_ms)
                try:
                    outcome = await self._execute(
                        seat, program, parsed, resolution, timeout, limit, queue_ms
                    )
                finally:
                    state.request_done()
        except NoWorker:  # only the checkout raises it: no seat within the wait, or closing
            raise RequestFailed(503, "busy", "server saturated", "no_worker") from None
        return await self._respond(outcome, queue_ms)

    # ------------------------------------------------------------------ execution

    async def _execute(
        self,
        seat: Seat,
        program: Program,
        parsed: Any,
        resolution: Resolution,
        timeout: float,
        limit: int,
        queue_ms: float,
    ) -> Outcome:
        state = self.state
        gpu_count = program.options.gpu_count
        if gpu_count is not None:
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
    ) -> Outcome:
        """PROTOCOL §6.5: a transient fresh worker holding a set of ``count`` GPUs."""
        state = self.state
        assert state.arbiter is not None
        started = time.monotonic()
        handle = state.pool.set_worker(seat)
        handle.lease.begin_request(self.request_id)
        handle.lease.observe(self.observer.lease)
        try:
            gpu_ids = await self._unless_cancelled(
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
                await self._unless_cancelled(handle.start(timeout=max(0.001, remaining)))
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
        drive = _Drive(workspace=workspace, limit=limit)
        if limit > 0:
            self.observer.output_started(workspace, limit)
        if self.cancel_reason is not None:
            return await self._cancelled(handle, drive)
        extra_fd = None
        try:
            blobs, fds, extra_fd = await self._blob_slices(resolution.blobs)
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
                ),
                fds,
            )
        except WorkerGone as gone:
            return await self._gone(handle, drive, gone)
        finally:
            if extra_fd is not None:
                os.close(extra_fd)
        self._driving = handle
        try:
            return await self._collect(handle, drive, timeout, started)
        finally:
            self._driving = None
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
                if self.cancel_reason is not None:
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
        drive.reason = self.cancel_reason or "cancelled"
        drive.reason_retire = "cancelled"
        self.finish_fields["output_tail"] = drive.workspace.output_tail()
        return drive

    async def _gone(self, handle: WorkerHandle, drive: _Drive, gone: WorkerGone) -> _Drive:
        await self.state.pool.kill(handle)
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
            if sum(len(memoryview(data)) for _, data in copies) <= INLINE_COPY_BYTES:
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
        output = drive.workspace.read_small_output(drive.limit, INLINE_READ_BYTES)
        if output is not None:
            return output
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self.state.executor, drive.workspace.read_output, drive.limit
        )

    async def _finish_outcome(
        self, drive: _Drive, handle: WorkerHandle, started: float, output: CapturedOutput
    ) -> Outcome:
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
            raise self._cancelled_failure()
        return Outcome(
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

    # ------------------------------------------------------------------ response

    async def _respond(self, outcome: Outcome, queue_ms: float) -> tuple[Reply, str]:
        if outcome.error is not None:
            self.finish_fields.update(
                status=outcome.status,
                error_kind=outcome.error.get("kind"),
                error_message=str(outcome.error.get("message", ""))[:2048],
                instruction_index=outcome.error.get("instruction_index"),
                instruction_op=outcome.error.get("instruction_op"),
                instruction_id=outcome.error.get("instruction_id"),
            )
        else:
            self.finish_fields["status"] = outcome.status
        reply = encode_outcome(
            outcome, self.request_id, queue_ms, self.state.config.max_response_bytes
        )
        return reply, outcome.reason


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


def _instruction_error(instruction: ipc.InstructionStarted, message: str) -> dict[str, Any]:
    return {
        "kind": "runtime",
        "message": message,
        "instruction_index": instruction.index,
        "instruction_op": instruction.op,
        "instruction_id": instruction.id,
        "traceback": "",
    }
