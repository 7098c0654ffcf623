"""One ``/execute`` request, from a received body to a response (PROTOCOL §3, §6–§9).

Checks run in the order of PROTOCOL §3.2: rows 2–11 and 13 (parsing), row 9 (hashing),
cache resolution with row 14, row 15 (``CACHE_MISS``), then row 12. Bodies of at most 64 KiB
go through them on the event loop (a thread hand-off costs more); larger ones, and the disk
cache, in the executor. An admitted request checks a seat out of the pool
(``Pool.checkout``), runs its program there (``run.SeatRun``) and answers from
the outcome (``responses.encode_outcome``); it ends in exactly one ``request_finished``
event.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import traceback
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kcoral.protocol.errors import ValidationError
from kcoral.protocol.headers import TIMEOUT_OUTPUT_HEADER
from kcoral.protocol.output_order import OUTPUT_ORDER_HEADER
from kcoral.protocol.request import ParsedRequest, parse_execute_request, verify_blob_hashes
from kcoral_server.execution.admitted import AdmittedProgram
from kcoral_server.execution.blob_resolution import Resolution, resolve_blobs
from kcoral_server.execution.control import NO_OBSERVER, Cancellation, RequestObserver
from kcoral_server.execution.request_record import RequestRecord, SeatAssignment
from kcoral_server.execution.responses import (
    ProgramOutcome,
    Reply,
    RequestFailed,
    encode_outcome,
    error_reply,
    json_reply,
    saturated,
)
from kcoral_server.execution.run import SeatRun
from kcoral_server.front_door.body import RequestBody
from kcoral_server.front_door.callers import DEFAULT, Identity
from kcoral_server.front_door.offload import hash_tasks, on_loop
from kcoral_server.front_door.token_reload import revoked_refusal
from kcoral_server.pool.queue import NoWorker
from kcoral_server.pool.seat import Seat
from kcoral_server.processes.output_order import wants_output_order

if TYPE_CHECKING:
    from kcoral_server.front_door.app import ServerState
    from kcoral_server.pool.queue import Checkout
    from kcoral_server.sessions.registry import Session, SessionCheckout

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
GPU_COUNT_MESSAGE = "gpu_count exceeds this GPU server's configured capacity"


class ExecuteRequest:
    """Everything about one request; ``run()`` returns its ``Reply``."""

    def __init__(
        self,
        state: ServerState,
        *,
        request_id: str,
        headers: Mapping[str, str],
        body: RequestBody,
        serialization: str | None,
        observer: RequestObserver | None = None,
        identity: Identity = DEFAULT,
        session: Session | None = None,
    ) -> None:
        self.state = state
        #: the answer carries ``output_order`` (X-KCoral-Output-Order, EXTENSIONS §16)
        self.output_order = wants_output_order(headers.get(OUTPUT_ORDER_HEADER))
        #: a 504 carries what the program printed (EXTENSIONS §15): a job's result always
        #: (the jobs API is ours), an ``/execute`` answer only when its client asked, since
        #: PROTOCOL §7.4 fixes an ERROR body to exactly three fields
        self.timeout_output = observer is not None or headers.get(TIMEOUT_OUTPUT_HEADER) == "1"
        #: the session whose pinned seat runs the program (EXTENSIONS §11)
        self.session = session
        self.identity = identity  # whose caches, jobs and workers this request may use
        self.observer = observer or NO_OBSERVER
        self.request_id = request_id
        self.content_type = headers.get("Content-Type")
        self.body = body
        self.serialization = serialization
        #: what ``request_finished`` and the request's job say about it, filled in as the
        #: request and its run learn things
        self.record = RequestRecord()
        self.seat: Seat | None = None
        self.finish_reason: str | None = None  # set once the request has ended
        self.cancellation = Cancellation()

    def cancel(self, reason: str, answer: RequestFailed | None = None) -> bool:
        """Stop this request (EXTENSIONS §5, §9): a queued one leaves the queue, a running
        one's process tree is killed under its lease and the worker replaced. ``reason`` is
        the finish reason (``cancelled`` or ``client_disconnected``); ``answer`` what a
        client still waiting gets instead of the logged-only 499. False when the request
        already ended or was cancelled before."""
        if self.finish_reason is not None:
            return False
        return self.cancellation.cancel(reason, answer)

    @property
    def cancel_reason(self) -> str | None:
        return self.cancellation.reason

    # ------------------------------------------------------------------ top level

    async def run(self) -> Reply:
        state = self.state
        state.live_requests.add(self)  # found there if its token is revoked
        try:
            reply, reason = await self._run()
        except RequestFailed as failure:
            printed = failure.output if self.timeout_output else None
            if printed is not None and printed.order and not self.output_order:
                printed = dataclasses.replace(printed, order=())  # as ``_respond`` does
            reply = error_reply(
                failure.status, self.request_id, failure.kind, failure.message, printed
            )
            if reply.length > state.config.max_response_bytes:
                # what it printed (EXTENSIONS §15) is bounded as a finished program's answer
                reply = error_reply(failure.status, self.request_id, failure.kind, failure.message)
            reason = failure.reason
            self.record.failed(failure)
        except Exception as exc:  # an unhandled front-end fault: never leak it to the client
            reply = error_reply(500, self.request_id, "engine", "internal server error")
            reason = "server_error"
            self.record.faulted(exc, traceback.format_exc())
        finally:
            self.body.close()
            state.live_requests.discard(self)
        self.finish_reason = reason
        state.events.emit(
            "request_finished",
            FINISH_LEVELS.get(reason, "ERROR"),
            request_id=self.request_id,
            http_status=reply.status,
            finish_reason=reason,
            response_bytes=reply.length,
            **self.record.fields(),
        )
        return reply

    async def _run(self) -> tuple[Reply, str]:
        state = self.state
        revoked = revoked_refusal(state, self.identity, self.body.opened_at)  # as it arrived
        if revoked is not None:
            raise revoked
        loop = asyncio.get_running_loop()
        view = self.body.finish()
        # A small body parses, hashes and resolves faster than a thread hand-off (front-end
        # CPU per request); only the disk cache stays off the loop.
        small = on_loop(len(view))
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
                            loop.run_in_executor(state.executor, verify_blob_hashes, task)
                            for task in hash_tasks(parsed.blobs)
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
            return await self._admitted(parsed, resolution)
        finally:
            for key in resolution.pins:
                state.memory_cache.unpin(key)

    async def _admitted(self, parsed: ParsedRequest, resolution: Resolution) -> tuple[Reply, str]:
        state = self.state
        program = parsed.program
        if resolution.missing:
            self.record.missing = len(resolution.missing)
            body = {
                "status": "CACHE_MISS",
                "request_id": self.request_id,
                "missing_blobs": resolution.missing,
            }
            return json_reply(200, body), "cache_miss"
        options = program.options
        if self.session is not None:
            self.session.check_options(options)
        elif options.gpu_count is not None and (
            state.mode == "cpu" or options.gpu_count > len(state.gpu_ids)
        ):
            raise RequestFailed(400, "parse", GPU_COUNT_MESSAGE, "rejected")
        admitted = AdmittedProgram.under(parsed, resolution, state.config)
        self.record.timeout_seconds = admitted.timeout

        program_file = state.events.record_program(self.request_id, bytes(parsed.program_bytes))
        ops = Counter(i.op for i in program.instructions)
        uploads = Counter(i.kind for i in program.instructions if i.op == "upload")
        accepted: dict[str, Any] = {
            "request_id": self.request_id,
            "request_bytes": self.body.size,
            "timeout_seconds": admitted.timeout,
            "program": program_file,
            "instructions": len(program.instructions),
            "ops": dict(ops),
            "uploads": dict(uploads),
            "blob_bytes": sum(len(memoryview(b)) for b in resolution.blobs.values()),
            "cache_hits": resolution.hits,
            "cache_hit_bytes": resolution.hit_bytes,
        }
        if options.gpu_count is not None:
            accepted["gpu_count"] = options.gpu_count
        state.events.emit("request_accepted", **accepted)
        self.observer.accepted(self)

        admitted_at = time.monotonic()
        if self.cancel_reason is not None:
            raise self.cancellation.failure()
        wait = state.config.worker_wait_timeout_seconds
        checkout: SessionCheckout | Checkout
        if self.session is not None:
            checkout = self.session.checkout(self)
        else:
            checkout = state.pool.checkout(
                wait,
                owner=self.observer,
                wait=self.cancellation.unless,
                identity=self.identity.name,
            )
        try:
            async with checkout as seat:
                queue_ms = (time.monotonic() - admitted_at) * 1000.0
                self.seat = seat
                self.record.seat = SeatAssignment(seat.id, seat.gpu_id, queue_ms)
                gpu_ids = seat.worker.gpu_ids if seat.worker is not None else []
                if options.gpu_count is not None and seat.pinned is None:
                    gpu_ids = []  # its GPUs are the set it leases next (observer.gpu_set)
                elif seat.pinned is not None and len(gpu_ids) > 1:
                    # a session pinned to several GPUs leases them all for each program:
                    # the log and the per-GPU lease metrics name the whole set
                    self.record.gpu_ids = list(gpu_ids)
                self.observer.assigned(seat.id, list(gpu_ids), queue_ms)
                try:
                    run = SeatRun(
                        state,
                        request_id=self.request_id,
                        identity=self.identity,
                        serialization=self.serialization,
                        observer=self.observer,
                        cancellation=self.cancellation,
                        record=self.record,
                    )
                    outcome = await run.execute(seat, admitted, queue_ms)
                except RequestFailed as failed:
                    if self.session is None:
                        raise
                    raise self.session.answer_for(failed) from None
                finally:
                    state.request_done()
        except NoWorker as exc:  # only the checkout raises it: no seat within the wait, or closing
            raise saturated(str(exc)).failure() from None
        finally:
            # A pool wait that ended without a seat (busy, a cancel, a client that left); not
            # a session's refusal, which never queued (its near-zero "waits" pulled the
            # queue-wait quantiles down; review).
            if self.record.seat is None and self.session is None:
                self.record.waited_ms = (time.monotonic() - admitted_at) * 1000.0
        return self._respond(outcome, queue_ms)

    # ------------------------------------------------------------------ response

    def _respond(self, outcome: ProgramOutcome, queue_ms: float) -> tuple[Reply, str]:
        self.record.answered(outcome)
        if outcome.output.order and not self.output_order:
            # a published client reads exactly the fields it always did
            outcome = dataclasses.replace(
                outcome, output=dataclasses.replace(outcome.output, order=())
            )
        reply = encode_outcome(
            outcome, self.request_id, queue_ms, self.state.config.max_response_bytes
        )
        return reply, outcome.reason
