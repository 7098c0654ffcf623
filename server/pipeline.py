"""One ``/execute`` request, from a received body to a response (PROTOCOL §3, §6–§9).

Checks run in the order of PROTOCOL §3.2: rows 2–11 and 13 (parsing, in the executor), row 9
(hashing, in the executor), cache resolution with row 14, row 15 (``CACHE_MISS``), then
row 12. An admitted request takes a seat, runs on its worker under a deadline that pauses
while the worker waits for a GPU lease, and ends in exactly one ``request_finished`` event.
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
from kcoral_server.body import RequestBody, bytes_memfd
from kcoral_server.pool import NoWorker, Seat
from kcoral_server.worker_handle import WorkerGone, WorkerHandle, WorkerStartError
from kcoral_server.workspace import NO_OUTPUT, CapturedOutput, Workspace

from kcoral.errors import ValidationError
from kcoral.protocol.multipart import encode_multipart
from kcoral.protocol.request import (
    check_tensor_lengths,
    parse_execute_request,
    verify_blob_hashes,
)
from kcoral.protocol.schema import Program
from kcoral.protocol.strict_json import dumps_compact

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
}
MEMORY_KINDS = frozenset({"tensor", "bytes", "library"})
CRASH_MESSAGE = "worker exited while executing the instruction"
GPU_COUNT_MESSAGE = "gpu_count exceeds this GPU server's configured capacity"


@dataclass
class Reply:
    """An HTTP answer: status, headers and body chunks (zero-copy views allowed)."""

    status: int
    headers: dict[str, str]
    chunks: list[bytes | memoryview]
    length: int
    keep_alive: list[Any] = field(default_factory=list)  # mmaps backing the chunks

    def close(self) -> None:
        self.chunks = []
        for item in self.keep_alive:
            with contextlib.suppress(BufferError, ValueError):
                item.close()
        self.keep_alive = []


def json_reply(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Reply:
    data = dumps_compact(body)
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    return Reply(status, all_headers, [data], len(data))


def error_reply(status: int, request_id: str, kind: str, message: str) -> Reply:
    headers = {"Retry-After": "1"} if status == 503 else {}
    body = {
        "status": "ERROR",
        "request_id": request_id,
        "error": {"kind": kind, "message": message},
    }
    return json_reply(status, body, headers)


class RequestFailed(Exception):
    """Ends a request early with an ERROR reply and a finish reason."""

    def __init__(self, status: int, kind: str, message: str, reason: str, **fields: Any) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.reason = reason
        self.fields = fields


@dataclass
class Resolution:
    blobs: dict[str, bytes | memoryview]  # hash -> bytes the request keeps a reference to
    missing: list[str]
    pins: list[str]


@dataclass
class ReturnRecord:
    key: str
    node: dict[str, Any]
    parts: list[memoryview]


@dataclass
class Outcome:
    """What running the program produced (before the response is encoded)."""

    status: str
    error: dict[str, Any] | None
    returns: list[ReturnRecord]
    output: CapturedOutput
    elapsed: float
    lease_wait: float
    lease_held: float
    reason: str
    maps: list[mmap.mmap]
    gpu_ids: list[int] | None = None


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
    ) -> None:
        self.state = state
        self.request_id = request_id
        self.content_type = content_type
        self.body = body
        self.serialization = serialization
        self.finish_fields: dict[str, Any] = {}
        self.seat: Seat | None = None
        self.timeout_seconds: float | None = None

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
        try:
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
            resolution = await loop.run_in_executor(
                state.executor, self._resolve, program, parsed.blobs
            )
        except ValidationError as exc:  # row 14
            raise RequestFailed(400, "parse", str(exc), "rejected") from None
        try:
            return await self._admitted(program, parsed, resolution)
        finally:
            for sha in resolution.pins:
                state.memory_cache.unpin(sha)

    def _resolve(self, program: Program, supplied: dict[str, memoryview]) -> Resolution:
        """PROTOCOL §9.2 steps 2–5 (blocking: runs in the executor)."""
        state = self.state
        kinds = program.blob_kinds()
        memory, disk = state.memory_cache, state.disk_cache
        to_disk = {}
        for sha, data in supplied.items():
            used = kinds.get(sha, frozenset())
            if used & MEMORY_KINDS and len(data) * 4 <= memory.capacity_bytes:
                # The cache outlives the request body, so it gets its own copy.
                memory.put(sha, bytes(data))
            if "file" in used:
                to_disk[sha] = data
        if to_disk and disk.enabled:
            with contextlib.suppress(Exception):  # the disk cache never fails a request
                disk.put_many(to_disk)
        resolved: dict[str, bytes | memoryview] = {}
        missing: list[str] = []
        pins: list[str] = []
        for sha, used in kinds.items():
            needs_memory = bool(used & MEMORY_KINDS)
            if needs_memory and memory.pin(sha):
                pins.append(sha)
            if sha in supplied:
                resolved[sha] = supplied[sha]
                continue
            from_disk = from_memory = None
            if "file" in used and disk.enabled:
                with contextlib.suppress(Exception):
                    from_disk = disk.get(sha)
            if needs_memory:
                from_memory = memory.get(sha)
            if ("file" in used and from_disk is None) or (needs_memory and from_memory is None):
                missing.append(sha)
                if from_memory is not None:
                    resolved[sha] = from_memory  # still checked by row 14
                continue
            resolved[sha] = from_disk if from_disk is not None else from_memory  # type: ignore[assignment]
        try:
            check_tensor_lengths(program, resolved)
        except ValidationError:
            for sha in pins:
                memory.unpin(sha)
            raise
        return Resolution(resolved, missing, pins)

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

        admitted_at = time.monotonic()
        try:
            seat = await state.pool.acquire(config.worker_wait_timeout_seconds)
        except NoWorker:
            raise RequestFailed(503, "busy", "server saturated", "no_worker") from None
        queue_ms = (time.monotonic() - admitted_at) * 1000.0
        self.seat = seat
        self.finish_fields.update(worker_id=seat.id, gpu_id=seat.gpu_id, queue_ms=queue_ms)
        try:
            outcome = await self._execute(
                seat, program, parsed, resolution, timeout, limit, queue_ms
            )
        finally:
            state.pool.finish_request(seat)
            state.request_done()
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
        handle.begin_request(self.request_id)
        drive = await self._drive(handle, parsed, resolution, timeout, limit, started)
        retire = drive.reason_retire
        if drive.kind == "finished":
            retire = state.pool.retire_reason(seat, retire)
            if retire is not None and handle.gone is None:
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
        state.pool.release(seat, retire)
        return await self._finish_outcome(drive, handle, started)

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
        handle = WorkerHandle(
            seat_id=seat.id,
            generation=seat.generation,
            device=state.mode,
            gpu_ids=[],
            gpu_uuids=[],
            arbiter=state.arbiter,
            sandbox=state.sandbox,
            log_programs=state.config.log_programs,
            allowed_serialization=state.config.allowed_serialization,
            transient=True,
        )
        handle.begin_request(self.request_id)
        handle.lease.waiting_since = started
        try:
            gpu_ids = list(
                await state.arbiter.acquire(handle, count=count, request_id=self.request_id)
            )
        except BaseException:
            state.pool.release_unused(seat)
            raise
        now = time.monotonic()
        handle.lease.wait_total += now - started
        handle.lease.waiting_since = None
        handle.lease.held_since = now
        handle.holds_lease = True
        handle.gpu_ids = gpu_ids
        uuids = [state.gpu_uuid(g) for g in gpu_ids]
        handle.gpu_uuids = uuids if all(uuids) else []
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
                await handle.start(timeout=max(0.001, remaining))
            except WorkerStartError as exc:
                await state.pool.kill(handle)
                if self._budget_used(handle, started) >= timeout:
                    raise RequestFailed(504, "timeout", "execution timed out", "timeout") from None
                raise RequestFailed(
                    500, "engine", "worker crashed", "crashed", error_detail=str(exc)
                ) from None
            drive = await self._drive(handle, parsed, resolution, timeout, limit, started)
            # The transient worker is killed while holding its set (§6.5).
            await state.pool.kill(handle)
            outcome = await self._finish_outcome(drive, handle, started)
            outcome.gpu_ids = gpu_ids
            return outcome
        finally:
            await state.pool.kill(handle)
            handle.release_lease()
            state.pool.release_unused(seat)

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
            state.events.output_dir, str(handle.pid) if limit > 0 else None
        )
        drive = _Drive(workspace=workspace, limit=limit)
        extra_fd = None
        try:
            blobs, fds, extra_fd = await self._blob_slices(resolution.blobs)
            handle.send(
                ipc.RunProgram(
                    request_id=self.request_id,
                    program_json=bytes(parsed.program_bytes).decode("utf-8"),
                    workspace=str(workspace.path),
                    stdout_path=str(workspace.stdout_path) if workspace.stdout_path else None,
                    stderr_path=str(workspace.stderr_path) if workspace.stderr_path else None,
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
        while True:
            used = self._budget_used(handle, started)
            if used >= timeout and not handle.waiting_for_lease:
                return await self._timed_out(handle, drive)
            wait = 0.25 if handle.waiting_for_lease else max(0.001, timeout - used)
            try:
                message, fds = await handle.receive(wait)
            except (asyncio.TimeoutError, TimeoutError):
                continue
            except WorkerGone as gone:
                return await self._gone(handle, drive, gone)
            try:
                if isinstance(message, ipc.InstructionStarted):
                    drive.last_instruction = message
                elif isinstance(message, ipc.ReturnProduced):
                    drive.returns.append(self._return_record(message, fds, drive))
                elif isinstance(message, ipc.ProgramFinished):
                    _close(fds)
                    return self._program_finished(message, drive)
                else:
                    raise ValueError(f"unexpected message {message.tag!r}")
            except (ValueError, TypeError, OSError) as exc:
                _close(fds)
                return await self._gone(handle, drive, WorkerGone(str(exc), invalid=True))

    def _return_record(
        self, message: ipc.ReturnProduced, fds: list[int], drive: _Drive
    ) -> ReturnRecord:
        lengths = [int(n) for n in message.part_lengths]
        if any(n < 0 for n in lengths) or len(fds) != (1 if lengths else 0):
            _close(fds)
            raise ValueError("return parts do not match their descriptor")
        parts: list[memoryview] = []
        if fds:
            total = sum(lengths)
            try:
                size = os.fstat(fds[0]).st_size
                if size < total:
                    raise ValueError("return memfd is shorter than its parts")
                if total:
                    mapped = mmap.mmap(fds[0], total, prot=mmap.PROT_READ)
                    drive.maps.append(mapped)
                    view = memoryview(mapped)
                    offset = 0
                    for n in lengths:
                        parts.append(view[offset : offset + n])
                        offset += n
                else:
                    parts = [memoryview(b"") for _ in lengths]
            finally:
                _close(fds)
        if not isinstance(message.node, dict) or not isinstance(message.key, str):
            raise ValueError("return node is not an object")
        return ReturnRecord(message.key, message.node, parts)

    def _program_finished(self, message: ipc.ProgramFinished, drive: _Drive) -> _Drive:
        if message.status not in ("COMPLETED", "FAILED"):
            raise ValueError(f"unknown program status {message.status!r}")
        if message.status == "FAILED" and not isinstance(message.error, dict):
            raise ValueError("FAILED without an error object")
        drive.kind = "finished"
        drive.status = message.status
        drive.error = message.error if message.status == "FAILED" else None
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

    async def _timed_out(self, handle: WorkerHandle, drive: _Drive) -> _Drive:
        await self.state.pool.kill(handle)
        drive.kind = "timeout"
        drive.reason = "timeout"
        drive.reason_retire = "timeout"
        self.finish_fields["output_tail"] = drive.workspace.output_tail()
        return drive

    async def _gone(self, handle: WorkerHandle, drive: _Drive, gone: WorkerGone) -> _Drive:
        await self.state.pool.kill(handle)
        drive.reason_retire = "crashed"
        self.finish_fields["exitcode"] = handle.returncode
        self.finish_fields["output_tail"] = drive.workspace.output_tail()
        if gone.invalid:
            drive.kind = "invalid"
            drive.reason = "server_error"
        elif drive.last_instruction is not None:
            drive.kind = "finished"
            drive.status = "FAILED"
            drive.error = _instruction_error(drive.last_instruction, CRASH_MESSAGE)
            drive.reason = "crashed"
        else:
            drive.kind = "crashed"
            drive.reason = "crashed"
        return drive

    async def _blob_slices(
        self, blobs: dict[str, bytes | memoryview]
    ) -> tuple[list[ipc.BlobSlice], list[int], int | None]:
        """Blob locations for the worker: supplied blobs inside the body memfd, cached ones in
        a second memfd."""
        slices: list[ipc.BlobSlice] = []
        fds: list[int] = []
        copies: list[tuple[str, bytes | memoryview]] = []
        in_body: list[tuple[str, int, int]] = []
        for sha, data in blobs.items():
            offset = None
            if isinstance(data, memoryview) and self.body.fd is not None:
                with contextlib.suppress(ValueError, TypeError):
                    offset = self.body.offset_of(data)
            if offset is None:
                copies.append((sha, data))
            else:
                in_body.append((sha, offset, len(data)))
        if in_body:
            fds.append(self.body.fd)  # type: ignore[arg-type]
            slices += [ipc.BlobSlice(sha, 0, off, n) for sha, off, n in in_body]
        extra_fd = None
        if copies:
            loop = asyncio.get_running_loop()
            extra_fd, placed = await loop.run_in_executor(self.state.executor, bytes_memfd, copies)
            index = len(fds)
            fds.append(extra_fd)
            slices += [ipc.BlobSlice(sha, index, off, n) for sha, off, n in placed]
        return slices, fds, extra_fd

    async def _finish_outcome(self, drive: _Drive, handle: WorkerHandle, started: float) -> Outcome:
        loop = asyncio.get_running_loop()
        handle.end_request()
        elapsed = time.monotonic() - started
        output = NO_OUTPUT
        if drive.kind == "finished" and drive.limit > 0:
            output = await loop.run_in_executor(
                self.state.executor, drive.workspace.read_output, drive.limit
            )
        await loop.run_in_executor(self.state.executor, drive.workspace.remove)
        self.finish_fields.update(
            elapsed_ms=elapsed * 1000.0,
            lease_wait_ms=handle.lease.wait_total * 1000.0,
            lease_held_ms=handle.lease.held_total * 1000.0,
        )
        if drive.kind == "timeout":
            _close_maps(drive.maps)
            raise RequestFailed(504, "timeout", "execution timed out", "timeout")
        if drive.kind == "invalid":
            _close_maps(drive.maps)
            raise RequestFailed(500, "engine", "invalid worker response", "server_error")
        if drive.kind == "crashed":
            _close_maps(drive.maps)
            raise RequestFailed(500, "engine", "worker crashed", "crashed")
        return Outcome(
            status=drive.status,
            error=drive.error,
            returns=drive.returns,
            output=output,
            elapsed=elapsed,
            lease_wait=handle.lease.wait_total,
            lease_held=handle.lease.held_total,
            reason=drive.reason,
            maps=drive.maps,
        )

    # ------------------------------------------------------------------ response

    async def _respond(self, outcome: Outcome, queue_ms: float) -> tuple[Reply, str]:
        result: dict[str, Any] = {
            "status": outcome.status,
            "request_id": self.request_id,
            "queue_ms": queue_ms,
            "elapsed_ms": outcome.elapsed * 1000.0,
            "lease_wait_ms": outcome.lease_wait * 1000.0,
            "lease_held_ms": outcome.lease_held * 1000.0,
        }
        if outcome.gpu_ids is not None:
            result["gpu_ids"] = outcome.gpu_ids
            result["gpu_count"] = len(outcome.gpu_ids)
        result.update(
            stdout=outcome.output.stdout,
            stderr=outcome.output.stderr,
            stdout_truncated=outcome.output.stdout_truncated,
            stderr_truncated=outcome.output.stderr_truncated,
            results={r.key: r.node for r in outcome.returns},
        )
        if outcome.error is not None:
            result["error"] = outcome.error
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
        try:
            data = dumps_compact(result)
        except (TypeError, ValueError):
            _close_maps(outcome.maps)
            raise RequestFailed(500, "engine", "invalid worker response", "server_error") from None
        parts = [part for record in outcome.returns for part in record.parts]
        if parts:
            named = [("result", "application/json", data)] + [
                (f"return:{i}", "application/octet-stream", part) for i, part in enumerate(parts)
            ]
            content_type, chunks, length = encode_multipart(named)
            reply = Reply(200, {"Content-Type": content_type}, chunks, length, list(outcome.maps))
        else:
            _close_maps(outcome.maps)
            reply = Reply(200, {"Content-Type": "application/json"}, [data], len(data))
        if reply.length > self.state.config.max_response_bytes:
            reply.close()
            raise RequestFailed(
                500,
                "response_too_large",
                "results exceed the configured response-size limit",
                "server_error",
            )
        return reply, outcome.reason


@dataclass
class _Drive:
    """Progress of one program on a worker."""

    workspace: Workspace
    limit: int
    kind: str = "running"  # finished | timeout | crashed | invalid
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


def _close(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _close_maps(maps: list[mmap.mmap]) -> None:
    for mapped in maps:
        with contextlib.suppress(BufferError, ValueError):
            mapped.close()
