"""Jobs (EXTENSIONS §5): ``/execute`` requests whose outcome is stored instead of written.

A ``Job`` observes its ``ExecuteRequest`` (``RequestObserver``) and turns what happens into
numbered Server-Sent Events kept for replay (``Last-Event-ID``): ``phase``, ``stdout``,
``stderr`` and ``heartbeat``. When the request ends, its ``Reply`` is copied into the job
(the exact status, content type and body ``/execute`` would have sent). ``JobRegistry``
holds jobs by id, expires finished ones after ``job_retention_seconds`` or when
``job_retention_bytes`` is exceeded and remembers expired ids (with their owner and why they
went) so they answer ``job_expired``, naming the reason, rather than ``not_found``.

Who can reach what (EXTENSIONS §5, §6): a job belongs to the identity that submitted it.
Another token holder gets exactly what an unknown id gets (``404 not_found``, also for an
expired job, and lists show only its own jobs), so job ids, states, output and results do not
leak between identities and a job cannot be cancelled by anyone but its owner; an admin
identity sees and acts on all. With a single shared token every holder is ``default`` and
shares all jobs. The byte bound is shared too, so it is applied fairly: over the bound, the
owner holding the most bytes of finished jobs loses its oldest first. Another token holder
who floods the server with large finished jobs drops its own results, not everyone's oldest
(a single owner sees plain oldest-first).

Memory: a finished job keeps its result and its event log in memory only while they are
small (each at most ``KEEP_IN_MEMORY_BYTES``, all of them within ``MEMORY_BUDGET_BYTES``);
larger ones are written to owner-only files (``jobs.spill``). ``job_retention_bytes`` bounds
the results and events of finished jobs wherever they are kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from kcoral.protocol.strict_json import dumps_compact
from kcoral_server.execution.control import RequestObserver
from kcoral_server.execution.responses import Reply
from kcoral_server.front_door.callers import Identity
from kcoral_server.jobs.followers import FollowerWatch
from kcoral_server.jobs.output_stream import OutputTail
from kcoral_server.jobs.spill import SpillDirectory, SpillFile
from kcoral_server.sessions.end_reasons import NOT_STARTED
from kcoral_server.storage.fair_eviction import fair_victims

if TYPE_CHECKING:
    from kcoral_server.execution.pipeline import ExecuteRequest
    from kcoral_server.pool.pool import Pool
    from kcoral_server.processes.progress_slot import ProgressSlot
    from kcoral_server.storage.workspace import Workspace

HEARTBEAT_SECONDS = 15.0
SWEEP_SECONDS = 1.0
EXPIRED_IDS_KEPT = 65536
FINISHED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT", "ERROR"})
#: what a finished job costs besides its result and events (its record, ids, index entry)
#: and each of its events besides its bytes: measured as the server's resident memory per
#: retained trivial job (4.4 KiB for 9 events and a 0.3 KiB result), where 1 KiB per job
#: and nothing per event had counted half of it (jobs soak)
RECORD_OVERHEAD_BYTES = 3072
EVENT_OVERHEAD_BYTES = 48
# A finished job's result or event log larger than this is written to disk ...
KEEP_IN_MEMORY_BYTES = 1 << 20
# ... and so is any once the retained ones in memory would exceed this.
MEMORY_BUDGET_BYTES = 32 << 20

#: Why a job went, as the ``job_expired`` message and the ``job_expired`` event say it.
EXPIRY_REASONS = {
    "age": "its --job-retention-seconds passed",
    "space": "finished jobs went past --job-retention-bytes (the largest holder's oldest go first)",
    "too_large": "its result and output alone are larger than --job-retention-bytes",
}


class Expiry(NamedTuple):
    """What stays of a dropped job: whose it was and why it went."""

    owner: str
    reason: str  # a key of EXPIRY_REASONS

    @property
    def message(self) -> str:
        return f"job expired: {EXPIRY_REASONS[self.reason]}"


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class StoredResult:
    """A finished job's answer, exactly as ``/execute`` would have sent it: its body in
    memory (``body``) or in an owner-only file (``file``)."""

    def __init__(
        self,
        status: int,
        headers: dict[str, str],
        body: bytes | None,
        file: SpillFile | None = None,
    ) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.file = file

    @property
    def length(self) -> int:
        if self.file is not None:
            return self.file.length
        return len(self.body) if self.body is not None else 0

    @property
    def in_memory(self) -> int:
        """Bytes of the body held in memory."""
        return len(self.body) if self.body is not None else 0


class Job(RequestObserver):
    """One job: state fields, its event log and, once finished, its result."""

    def __init__(self, request_id: str, target: dict[str, str], owner: str = "default") -> None:
        self.id = str(uuid.uuid4())
        self.owner = owner  # the identity that submitted it: only it (or an admin) sees it
        self.request_id = request_id
        self.status = "QUEUED"
        self.submitted_at = utc_now()
        self.started_at: str | None = None
        self.finished_at: str | None = None
        #: the seat that ran it (``worker_id`` on the wire: a seat outlives its workers)
        self.seat_id: str | None = None
        self.gpu_ids: list[int] | None = None
        self.target = dict(target)
        self.queue_position: int | None = None
        self.queue_ms: float | None = None
        self.lease_wait_ms: float | None = None
        #: between its ``lease_wait`` and ``lease_held`` phases: RUNNING (a worker is its)
        #: but waiting for its GPUs, which its state says as ``waiting_for`` (EXTENSIONS §5)
        self.waiting_for_gpus = False
        self.lease_held_ms: float | None = None
        self.elapsed_ms: float | None = None
        self.error_kind: str | None = None
        self.cancelled_by: str | None = None  # an admin that cancelled another's job
        self.revoked = False  # cancelled because its owner's token was revoked (SIGHUP)
        #: why its session cancelled it: the session's end, or an interrupt before it started
        self.session_end: str | None = None
        #: cancels it once no event stream has followed it for a while, where its submitter
        #: asked for that (``X-KCoral-Cancel-Unfollowed``, EXTENSIONS §5)
        self.follow_watch: FollowerWatch | None = None
        self.events: list[bytes] = []  # event i has id i + 1 (emptied once written to disk)
        self.event_bytes = 0
        self.events_file: SpillFile | None = None  # a finished job's events, when on disk
        self.event_offsets: list[int] = []  # where event i starts in events_file
        self.last_event_at = time.monotonic()
        self.listeners: set[asyncio.Event] = set()
        self.result: StoredResult | None = None
        self.result_read = False  # ``/result`` was answered once (a draining server waits)
        self.finished_monotonic: float | None = None
        self.request: ExecuteRequest | None = None
        self.accepted_future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._tail: OutputTail | None = None
        #: the streams its followed output was cut from at the output limit
        self.truncated: dict[str, bool] = {"stdout_truncated": False, "stderr_truncated": False}
        self.pool: Pool | None = None

    # ------------------------------------------------------------------ state

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    @property
    def size(self) -> int:
        """Bytes this job keeps, in memory or on disk (for ``job_retention_bytes``)."""
        body = self.result.length if self.result is not None else 0
        events = self.event_bytes + EVENT_OVERHEAD_BYTES * self.event_count
        return RECORD_OVERHEAD_BYTES + body + events

    @property
    def memory_size(self) -> int:
        """Bytes of result and events this job holds in memory."""
        body = self.result.in_memory if self.result is not None else 0
        events = 0 if self.events_file is not None else self.event_bytes
        return body + events

    @property
    def event_count(self) -> int:
        if self.events_file is not None:
            return len(self.event_offsets)
        return len(self.events)

    def state(self) -> dict[str, Any]:
        return {
            "job_id": self.id,
            "request_id": self.request_id,
            "status": self.status,
            "submitted_at": self.submitted_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "worker_id": self.seat_id,
            "gpu_ids": self.gpu_ids,
            "target": self.target,
            "queue_position": self.queue_position,
            "queue_ms": self.queue_ms,
            "lease_wait_ms": self.lease_wait_ms,
            "lease_held_ms": self.lease_held_ms,
            "elapsed_ms": self.elapsed_ms,
            "error_kind": self.error_kind,
            "waiting_for": "gpus" if self.waiting_for_gpus and not self.finished else None,
            "owner": self.owner,  # an admin lists every identity's jobs: whose each is
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
        self.phase_after(None, name, **fields)

    def phase_after(self, upto: tuple[int, int] | None, name: str, **fields: Any) -> None:
        """A phase after the output written before it: ``upto`` stdout and stderr bytes
        (``None``: all the files hold now)."""
        if self._tail is not None:  # the output written before this phase goes first
            self._tail.catch_up(upto)
        self.append("phase", {"phase": name, **fields})

    # ------------------------------------------------------------------ RequestObserver

    def accepted(self, request: ExecuteRequest) -> None:
        self.request = request
        if self.pool is not None:  # where it will wait, the identities taking turns
            self.queue_position = self.pool.queue.position_for(self.owner)
        self.phase("queued", position=self.queue_position or 0)
        if not self.accepted_future.done():
            self.accepted_future.set_result(True)

    def queue_moved(self, position: int) -> None:
        if self.status == "QUEUED" and position != self.queue_position:
            self.queue_position = position
            self.phase("queued", position=position)

    def assigned(self, seat_id: str, gpu_ids: list[int], queue_ms: float) -> None:
        self.status = "RUNNING"
        self.started_at = utc_now()
        self.queue_position = None
        self.seat_id = seat_id
        self.gpu_ids = list(gpu_ids)
        self.queue_ms = queue_ms
        self.phase("assigned", worker_id=seat_id, gpu_ids=self.gpu_ids)

    def gpu_set(self, gpu_ids: list[int]) -> None:
        self.gpu_ids = list(gpu_ids)

    def lease(self, phase: str) -> None:
        self.waiting_for_gpus = phase == "lease_wait"
        self.phase(phase)

    def instruction(
        self,
        index: int,
        op: str,
        instruction_id: str | None,
        output_sizes: tuple[int, int] | None = None,
    ) -> None:
        # Only what was written before the instruction started: the worker runs on while its
        # frame waits to be read, and its next lines must follow this phase, not precede it.
        self.phase_after(output_sizes, "instruction", index=index, op=op, id=instruction_id)

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

    def output_order(self, runs: Sequence[tuple[int, int]]) -> None:
        if self._tail is not None:
            self._tail.runs = runs

    def output_record(self, slot: ProgressSlot) -> None:
        if self._tail is not None:
            self._tail.record = slot

    async def output_finished(self) -> None:
        if self._tail is not None:
            tail, self._tail = self._tail, None
            await tail.finish()
            self.truncated = {f"{s.name}_truncated": s.truncated for s in tail.streams}

    # ------------------------------------------------------------------ the end

    def finish(self, request: ExecuteRequest, reply: Reply, result: StoredResult) -> None:
        """Store the final answer; ``reply`` is already copied into ``result``."""
        if self._tail is not None:
            self._tail.close()
            self._tail = None
        if self.follow_watch is not None:
            self.follow_watch.close()
        record = request.record
        reason = request.finish_reason
        if reason in ("cancelled", "client_disconnected"):
            status = "CANCELLED"
        elif reply.status == 200:
            status = record.status or "FAILED"
        elif reply.status == 504:
            status = "TIMED_OUT"
        else:
            status = "ERROR"
        self.status = status
        self.finished_at = utc_now()
        self.finished_monotonic = time.monotonic()
        self.queue_position = None
        if record.seat is not None:
            self.queue_ms = record.seat.queue_ms
        if record.times is not None:
            self.elapsed_ms = record.times.elapsed_ms
            self.lease_wait_ms = record.times.lease_wait_ms
            self.lease_held_ms = record.times.lease_held_ms
        if status != "COMPLETED":
            self.error_kind = record.error.kind if record.error is not None else None
        if (
            status == "CANCELLED"
            and record.error is not None
            and (self.error_kind == "session_ended" or record.error.message == NOT_STARTED)
        ):
            self.session_end = record.error.message
        self.result = result
        # What ran the job is let go: a finished job kept its request (program, record,
        # pipeline), about 4 KiB more than retention counted (jobs soak).
        self.request = None
        self.pool = None
        self.phase("finished", status=status, **self.truncated)

    def cancel(self, by: str | None = None) -> None:
        """Cancel a queued or running job (a finished one is left alone); ``by``: the
        identity that asked, named to the owner when it is another (an admin)."""
        if self.finished:
            return
        if by is not None and by != self.owner and self.cancelled_by is None:
            self.cancelled_by = by
        if self.request is not None:
            self.request.cancel("cancelled")


class JobRegistry:
    """Every retained job of one server, plus expired ids (with their owners)."""

    def __init__(
        self,
        retention_seconds: float,
        retention_bytes: int,
        spill_parent: Path | None = None,
        emit: Callable[..., None] | None = None,
    ) -> None:
        self.retention_seconds = float(retention_seconds)
        self.retention_bytes = int(retention_bytes)
        self.jobs: OrderedDict[str, Job] = OrderedDict()  # submission order
        self.expired: OrderedDict[str, Expiry] = OrderedDict()  # job id -> owner, reason
        # The event log's ``emit`` (SERVER §13): a dropped job is an event, so an operator
        # can see whose results the byte bound took.
        self._emit = emit
        self.running: set[asyncio.Task] = set()
        self.spill = SpillDirectory(spill_parent)
        self._sweeper: asyncio.Task | None = None
        self._pool: Pool | None = None

    def attach(self, pool: Pool) -> None:
        """Follow ``pool``'s queue (positions) and start the sweeper."""
        self._pool = pool
        pool.queue.listeners.append(self._queue_changed)
        if self._sweeper is None:
            self._sweeper = asyncio.ensure_future(self._sweep_forever())

    def new_job(self, request_id: str, owner: Identity) -> Job:
        target = dict(self._pool.target) if self._pool is not None else {}
        job = Job(request_id, target, owner.name)
        job.pool = self._pool
        return job

    def add(self, job: Job) -> None:
        self.jobs[job.id] = job

    def cancel_when_unfollowed(self, job: Job, grace: int) -> None:
        """Cancel ``job`` once no event stream has followed it for ``grace`` seconds."""
        if job.finished:  # it ended before its 202 was written: nothing to cancel
            return

        def unfollowed() -> None:
            if job.finished:  # nothing to cancel: job_unfollowed would say it was cancelled
                return
            if self._emit is not None:
                self._emit(
                    "job_unfollowed",
                    "WARNING",
                    job_id=job.id,
                    request_id=job.request_id,
                    owner=job.owner,
                    seconds=grace,
                )
            job.cancel()

        job.follow_watch = FollowerWatch(grace, unfollowed)

    def lookup(self, job_id: str, identity: Identity) -> Job | Expiry | None:
        """The job, its ``Expiry`` (answered ``job_expired``), or None (``not_found``).

        Someone else's job, live or expired, is ``not_found`` exactly like an id that never
        existed: the answer must not tell another identity that the id is in use."""
        self.sweep()
        job = self.jobs.get(job_id)
        if job is not None:
            return job if identity.owns(job.owner) else None
        expiry = self.expired.get(job_id)
        return expiry if expiry is not None and identity.owns(expiry.owner) else None

    def unread_results(self, since: float) -> int:
        """How many jobs that finished at ``since`` (monotonic) or later have a result
        nobody has read yet (a cancelled job's is its ``409 cancelled``: a cell following
        a job cancelled from the panel reads it to say so)."""
        return sum(
            1
            for job in self.jobs.values()
            if job.finished_monotonic is not None
            and job.finished_monotonic >= since
            and not job.result_read
        )

    def newest_first(self, identity: Identity) -> list[Job]:
        """The jobs ``identity`` may see, newest first."""
        self.sweep()
        return [job for job in reversed(self.jobs.values()) if identity.owns(job.owner)]

    async def store_result(self, reply: Reply, executor: Executor | None) -> StoredResult:
        """Copy a job's final answer out of ``reply``: in memory when small, else to disk."""
        loop = asyncio.get_running_loop()
        headers = dict(reply.headers)
        if self._fits_in_memory(reply.length):
            return StoredResult(reply.status, headers, b"".join(reply.chunks))
        chunks = list(reply.chunks)
        try:
            file = await loop.run_in_executor(executor, self.spill.write, chunks)
        except OSError:
            # An unwritable temporary directory must not lose the answer: memory, then.
            body = await loop.run_in_executor(executor, b"".join, chunks)
            return StoredResult(reply.status, headers, body)
        finally:
            # The executor's finished work item may still hold this list for a moment; empty,
            # it holds no view of the reply's mappings, which ``reply.close()`` can then
            # unmap at once.
            chunks.clear()
        return StoredResult(reply.status, headers, None, file)

    async def finished(self, job: Job, executor: Executor | None = None) -> None:
        """A job ended: a large event log goes to disk, then the byte bound applies now
        (the time bound is swept)."""
        if job.events and not self._fits_in_memory(job.event_bytes, besides=job):
            events = list(job.events)
            try:
                file = await asyncio.get_running_loop().run_in_executor(
                    executor, self.spill.write, events
                )
            except OSError:
                pass  # kept in memory: still bounded by job_retention_bytes
            else:
                offsets, at = [], 0
                for event in events:
                    offsets.append(at)
                    at += len(event)
                if job.id in self.jobs:
                    # Switched in one step on the event loop: streams see one or the other.
                    job.event_offsets, job.events_file, job.events = offsets, file, []
                else:  # dropped meanwhile
                    file.remove()
        self.sweep()

    def _fits_in_memory(self, length: int, besides: Job | None = None) -> bool:
        if length > KEEP_IN_MEMORY_BYTES:
            return False
        held = sum(
            job.memory_size
            for job in self.jobs.values()
            if job.finished_monotonic is not None and job is not besides
        )
        return held + length <= MEMORY_BUDGET_BYTES

    # ------------------------------------------------------------------ retention

    def sweep(self) -> None:
        now = time.monotonic()
        finished = [j for j in self.jobs.values() if j.finished_monotonic is not None]
        kept = []
        for job in finished:
            if now - job.finished_monotonic >= self.retention_seconds:  # type: ignore[operator]
                self._expire(job, "age")
            elif job.size > self.retention_bytes:
                # Larger than the whole bound, it can never be kept: it goes by itself.
                self._expire(job, "too_large")
            else:
                kept.append(job)
        if sum(job.size for job in kept) <= self.retention_bytes:
            return
        # Over the bound, the owner holding the most bytes gives up its oldest finished job
        # (by when it finished) until the rest fit (``fair_victims``).
        by_age = sorted(kept, key=lambda j: j.finished_monotonic)  # type: ignore[arg-type,return-value]
        victims = fair_victims(
            by_age, self.retention_bytes, owner=lambda j: j.owner, size=lambda j: j.size
        )
        for job in victims:
            self._expire(job, "space")

    def _expire(self, job: Job, reason: str) -> None:
        self.jobs.pop(job.id, None)
        self.expired[job.id] = Expiry(job.owner, reason)
        # A stream or result read already under way keeps its open file.
        if job.result is not None and job.result.file is not None:
            job.result.file.remove()
        if job.events_file is not None:
            job.events_file.remove()
        while len(self.expired) > EXPIRED_IDS_KEPT:
            self.expired.popitem(last=False)
        if self._emit is not None:
            self._emit(
                "job_expired",
                "INFO" if reason == "age" else "WARNING",
                job_id=job.id,
                request_id=job.request_id,
                owner=job.owner,
                reason=reason,
                bytes=job.size,
                retention_bytes=self.retention_bytes,
            )

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
        for owner, position in self._pool.queue.positions().items():
            if isinstance(owner, Job):
                owner.queue_moved(position)

    # ------------------------------------------------------------------ shutdown

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self.spill.close()
