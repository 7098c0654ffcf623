"""What one request's end is logged with (``request_finished``, SERVER §13) and what its job
reports (EXTENSIONS §5): the typed record the pipeline and its run fill in as they learn
things, and the one place (``RequestRecord.fields``) that turns it into those fields.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from kcoral_server.execution.responses import ProgramOutcome, RequestFailed

__all__ = ["ErrorSummary", "RequestRecord", "RunTimes", "SeatAssignment"]

#: ``error_message`` is cut to this many characters (SERVER §13)
MESSAGE_CHARS = 2048
#: and an unhandled fault's ``traceback`` to its last this many
TRACEBACK_CHARS = 8192


@dataclass(frozen=True)
class SeatAssignment:
    """The seat a request checked out and how long it queued for it."""

    worker_id: str  # the seat's id (a seat outlives the worker processes it runs)
    gpu_id: int | None  # None: a CPU seat
    queue_ms: float


@dataclass(frozen=True)
class RunTimes:
    """How long the program ran, in milliseconds: in all, waiting for a GPU lease (paused
    deadline), holding it."""

    elapsed_ms: float
    lease_wait_ms: float
    lease_held_ms: float


@dataclass(frozen=True)
class ErrorSummary:
    """Why a request failed, as its log says it: a program's ``error`` object, a
    ``RequestFailed`` or an unhandled front-end fault."""

    kind: str | None
    message: str
    instruction_index: int | None = None
    instruction_op: str | None = None
    instruction_id: str | None = None
    detail: str | None = None  # logged only (``error_detail``): e.g. an unconfirmed clean-up
    traceback: str | None = None  # an unhandled front-end fault's


@dataclass
class RequestRecord:
    """One request as its ``request_finished`` event and its job see it; None: not known
    (the request ended before) or not applicable."""

    timeout_seconds: float | None = None
    missing: int | None = None  # blobs a ``CACHE_MISS`` named
    seat: SeatAssignment | None = None
    #: how long a request that never got a seat waited for one (``waited_ms``): a 503
    #: ``busy``, a cancel or a client that left while queued; the queue-wait metric counts
    #: these too, else its quantiles miss exactly the longest waits (EXTENSIONS §13)
    waited_ms: float | None = None
    gpu_ids: list[int] | None = None  # a GPU-set request's leased set (PROTOCOL §6.5)
    status: str | None = None  # ``COMPLETED`` or ``FAILED``: the program finished
    error: ErrorSummary | None = None
    times: RunTimes | None = None
    exitcode: int | None = None  # of a worker that died under the program, or at teardown
    output_tail: dict[str, str] | None = None  # of a program that was killed or died

    def answered(self, outcome: ProgramOutcome) -> None:
        """The program finished: its status, and its ``error`` object when it failed."""
        self.status = outcome.status
        error = outcome.error
        if error is not None:
            self.error = ErrorSummary(
                kind=error.get("kind"),
                message=str(error.get("message", ""))[:MESSAGE_CHARS],
                instruction_index=error.get("instruction_index"),
                instruction_op=error.get("instruction_op"),
                instruction_id=error.get("instruction_id"),
            )

    def failed(self, failure: RequestFailed) -> None:
        """The request ended in ``failure``; a program's own error, when it had one, stays
        the logged one (an answer too large to send after a ``FAILED`` program)."""
        if self.error is None:
            self.error = ErrorSummary(failure.kind, failure.message[:MESSAGE_CHARS])
        if failure.error_detail is not None:
            self.error = dataclasses.replace(self.error, detail=failure.error_detail)

    def faulted(self, exc: Exception, traceback: str) -> None:
        """An unhandled front-end fault (answered as 500 ``engine``, never explained)."""
        self.error = ErrorSummary(
            kind="engine",
            message=f"{type(exc).__name__}: {exc}"[:MESSAGE_CHARS],
            traceback=traceback[-TRACEBACK_CHARS:],
        )

    def fields(self) -> dict[str, Any]:
        """The record as ``request_finished`` fields (SERVER §13): only those that apply."""
        out: dict[str, Any] = {}
        if self.timeout_seconds is not None:
            out["timeout_seconds"] = self.timeout_seconds
        if self.missing is not None:
            out["missing"] = self.missing
        if self.seat is not None:
            out.update(
                worker_id=self.seat.worker_id,
                gpu_id=self.seat.gpu_id,
                queue_ms=self.seat.queue_ms,
            )
        elif self.waited_ms is not None:
            out["waited_ms"] = self.waited_ms
        if self.gpu_ids is not None:
            out["gpu_ids"] = list(self.gpu_ids)
        if self.status is not None:
            out["status"] = self.status
        if self.error is not None:
            error = self.error
            out.update(error_kind=error.kind, error_message=error.message)
            optional = {
                "instruction_index": error.instruction_index,
                "instruction_op": error.instruction_op,
                "instruction_id": error.instruction_id,
                "error_detail": error.detail,
                "traceback": error.traceback,
            }
            out.update((name, value) for name, value in optional.items() if value is not None)
        if self.times is not None:
            out.update(
                elapsed_ms=self.times.elapsed_ms,
                lease_wait_ms=self.times.lease_wait_ms,
                lease_held_ms=self.times.lease_held_ms,
            )
        if self.exitcode is not None:
            out["exitcode"] = self.exitcode
        if self.output_tail is not None:
            out["output_tail"] = self.output_tail
        return out
