"""Jobs (EXTENSIONS §5): ``/execute`` requests whose outcome is stored instead of written.

A ``Job`` observes its ``ExecuteRequest`` (``RequestObserver``) and turns what happens into
numbered Server-Sent Events kept for replay (``Last-Event-ID``): ``phase``, ``stdout``,
``stderr`` and ``heartbeat``. When the request ends, its ``Reply`` is copied into the job
(the exact status, content type and body ``/execute`` would have sent). ``JobRegistry``
holds jobs by id, expires finished ones after ``job_retention_seconds`` or when
``job_retention_bytes`` is exceeded (oldest finished first) and remembers expired ids so
they answer ``job_expired`` rather than ``not_found``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
import uuid
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from kcoral_server.output_stream import OutputTail
from kcoral_server.pipeline import RequestObserver
from kcoral_server.responses import Reply

from kcoral.protocol.strict_json import dumps_compact

if TYPE_CHECKING:
    from kcoral_server.pipeline import ExecuteRequest
    from kcoral_server.pool import Pool
    from kcoral_server.workspace import Workspace

HEARTBEAT_SECONDS = 15.0
SWEEP_SECONDS = 1.0
EXPIRED_IDS_KEPT = 65536
FINISHED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT", "ERROR"})
RECORD_OVERHEAD_BYTES = 1024  # the state fields of a finished job, roughly


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class StoredResult:
    """A finished job's answer, exactly as ``/execute`` would have sent it."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body


class Job(RequestObserver):
    """One job: state fields, its event log and, once finished, its result."""

    def __init__(self, request_id: str, target: dict[str, str]) -> None:
        self.id = str(uuid.uuid4())
        self.request_id = request_id
        self.status = "QUEUED"
        self.submitted_at = utc_now()
        self.started_at: str | None = None
        self.finished_at: str | None = None
        self.worker_id: str | None = None
        self.gpu_ids: list[int] | None = None
        self.target = dict(target)
        self.queue_position: int | None = None
        self.queue_ms: float | None = None
        self.lease_wait_ms: float | None = None
        self.lease_held_ms: float | None = None
        self.elapsed_ms: float | None = None
        self.error_kind: str | None = None
        self.events: list[bytes] = []  # event i has id i + 1
        self.event_bytes = 0
        self.last_event_at = time.monotonic()
        self.listeners: set[asyncio.Event] = set()
        self.result: StoredResult | None = None
        self.finished_monotonic: float | None = None
        self.request: ExecuteRequest | None = None
        self.accepted_future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._tail: OutputTail | None = None
        self.pool: Pool | None = None

    # ------------------------------------------------------------------ state

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    @property
    def size(self) -> int:
        """Bytes this job keeps in memory (for ``job_retention_bytes``)."""
        body = len(self.result.body) if self.result is not None else 0
        return RECORD_OVERHEAD_BYTES + body + self.event_bytes

    def state(self) -> dict[str, Any]:
        return {
            "job_id": self.id,
            "request_id": self.request_id,
            "status": self.status,
            "submitted_at": self.submitted_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "worker_id": self.worker_id,
            "gpu_ids": self.gpu_ids,
            "target": self.target,
            "queue_position": self.queue_position,
            "queue_ms": self.queue_ms,
            "lease_wait_ms": self.lease_wait_ms,
            "lease_held_ms": self.lease_held_ms,
            "elapsed_ms": self.elapsed_ms,
            "error_kind": self.error_kind,
        }

    # ------------------------------------------------------------------ events

    def append(self, kind: str, data: dict[str, Any]) -> None:
        """Record one event and wake every open stream."""
        number = len(self.events) + 1
        payload = dumps_compact(data).decode("utf-8")
        # JSON escapes line breaks, so one ``data:`` line carries the whole payload.
        self.events.append(f"id: {number}\nevent: {kind}\ndata: {payload}\n\n".encode())
        self.event_bytes += len(self.events[-1])
        self.last_event_at = time.monotonic()
        for listener in self.listeners:
            listener.set()

    def phase(self, name: str, **fields: Any) -> None:
        self.append("phase", {"phase": name, **fields})

    # ------------------------------------------------------------------ RequestObserver

    def accepted(self, request: ExecuteRequest) -> None:
        self.request = request
        if self.pool is not None:
            self.queue_position = self.pool.requests_waiting
        self.phase("queued", position=self.queue_position or 0)
        if not self.accepted_future.done():
            self.accepted_future.set_result(True)

    def queue_moved(self, position: int) -> None:
        if self.status == "QUEUED" and position != self.queue_position:
            self.queue_position = position
            self.phase("queued", position=position)

    def assigned(self, worker_id: str, gpu_ids: list[int], queue_ms: float) -> None:
        self.status = "RUNNING"
        self.started_at = utc_now()
        self.queue_position = None
        self.worker_id = worker_id
        self.gpu_ids = list(gpu_ids)
        self.queue_ms = queue_ms
        self.phase("assigned", worker_id=worker_id, gpu_ids=self.gpu_ids)

    def lease(self, phase: str) -> None:
        self.phase(phase)

    def instruction(self, index: int, op: str, instruction_id: str | None) -> None:
        self.phase("instruction", index=index, op=op, id=instruction_id)

    def output_started(self, workspace: Workspace, limit: int) -> None:
        if workspace.stdout_path is None or workspace.stderr_path is None:
            return
        self._tail = OutputTail(
            workspace.stdout_path,
            workspace.stderr_path,
            limit,
            lambda stream, text: self.append(stream, {"text": text}),
        )
        self._tail.start()

    async def output_finished(self) -> None:
        if self._tail is not None:
            tail, self._tail = self._tail, None
            await tail.finish()

    # ------------------------------------------------------------------ the end

    def finish(self, request: ExecuteRequest, reply: Reply, body: bytes) -> None:
        """Store the final answer; ``reply`` is already copied into ``body``."""
        if self._tail is not None:
            self._tail.close()
            self._tail = None
        fields = request.finish_fields
        reason = request.finish_reason
        if reason in ("cancelled", "client_disconnected"):
            status = "CANCELLED"
        elif reply.status == 200:
            status = str(fields.get("status", "FAILED"))
        elif reply.status == 504:
            status = "TIMED_OUT"
        else:
            status = "ERROR"
        self.status = status
        self.finished_at = utc_now()
        self.finished_monotonic = time.monotonic()
        self.queue_position = None
        for name in ("queue_ms", "lease_wait_ms", "lease_held_ms", "elapsed_ms"):
            if isinstance(fields.get(name), (int, float)):
                setattr(self, name, float(fields[name]))
        if status != "COMPLETED":
            kind = fields.get("error_kind")
            self.error_kind = kind if isinstance(kind, str) else None
        self.result = StoredResult(reply.status, dict(reply.headers), body)
        self.phase("finished", status=status)

    def cancel(self) -> None:
        """Cancel a queued or running job (a finished one is left alone)."""
        if self.finished:
            return
        if self.request is not None:
            self.request.cancel("cancelled")


class JobRegistry:
    """Every retained job of one server, plus expired ids."""

    def __init__(self, retention_seconds: float, retention_bytes: int) -> None:
        self.retention_seconds = float(retention_seconds)
        self.retention_bytes = int(retention_bytes)
        self.jobs: OrderedDict[str, Job] = OrderedDict()  # submission order
        self.expired: OrderedDict[str, None] = OrderedDict()
        self.running: set[asyncio.Task] = set()
        self._sweeper: asyncio.Task | None = None
        self._pool: Pool | None = None

    def attach(self, pool: Pool) -> None:
        """Follow ``pool``'s queue (positions) and start the sweeper."""
        self._pool = pool
        pool.queue_listeners.append(self._queue_changed)
        if self._sweeper is None:
            self._sweeper = asyncio.ensure_future(self._sweep_forever())

    def new_job(self, request_id: str) -> Job:
        job = Job(request_id, dict(self._pool.target) if self._pool is not None else {})
        job.pool = self._pool
        return job

    def add(self, job: Job) -> None:
        self.jobs[job.id] = job

    def lookup(self, job_id: str) -> Job | str:
        """The job, or the error kind: ``not_found`` / ``job_expired``."""
        self.sweep()
        job = self.jobs.get(job_id)
        if job is not None:
            return job
        return "job_expired" if job_id in self.expired else "not_found"

    def newest_first(self) -> list[Job]:
        self.sweep()
        return list(reversed(self.jobs.values()))

    def finished(self, job: Job) -> None:
        """A job ended: apply the byte bound now (the time bound is swept)."""
        self.sweep()

    # ------------------------------------------------------------------ retention

    def sweep(self) -> None:
        now = time.monotonic()
        finished = [j for j in self.jobs.values() if j.finished_monotonic is not None]
        for job in finished:
            if now - job.finished_monotonic >= self.retention_seconds:  # type: ignore[operator]
                self._expire(job)
        total = sum(j.size for j in self.jobs.values() if j.finished_monotonic is not None)
        if total <= self.retention_bytes:
            return
        by_age = sorted(
            (j for j in self.jobs.values() if j.finished_monotonic is not None),
            key=lambda j: j.finished_monotonic,  # type: ignore[arg-type,return-value]
        )
        for job in by_age:
            if total <= self.retention_bytes:
                break
            total -= job.size
            self._expire(job)

    def _expire(self, job: Job) -> None:
        self.jobs.pop(job.id, None)
        self.expired[job.id] = None
        while len(self.expired) > EXPIRED_IDS_KEPT:
            self.expired.popitem(last=False)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            with contextlib.suppress(Exception):  # the sweeper must never die
                self.sweep()
                now = time.monotonic()
                for job in list(self.jobs.values()):
                    if not job.finished and now - job.last_event_at >= HEARTBEAT_SECONDS:
                        job.append("heartbeat", {})

    def _queue_changed(self) -> None:
        if self._pool is None:
            return
        for owner, position in self._pool.queue_positions().items():
            if isinstance(owner, Job):
                owner.queue_moved(position)

    # ------------------------------------------------------------------ shutdown

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
