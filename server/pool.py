"""The owner of every worker's life: seats, FIFO assignment, retirement and replacement
(SERVER.md §4, §6).

A seat (``cpu/w<i>`` or ``gpu<N>/w<i>``) outlives its processes; ``generation`` counts them.
Every request gets its seat through ``checkout`` (an idle seat, else FIFO; a seat that
becomes idle goes to the oldest waiter). After the program, ``retirement`` decides once
whether the worker stays, and ``release`` applies it; replacing a worker (retirement, crash,
timeout) runs in the background and the seat stays out of ``request_capacity`` until its
new worker is ready. Only the pool starts, stops and kills workers (``WorkerHandle``).

Who can reach what: a reused worker (``--max-requests-per-worker`` other than 1) keeps its
sandbox's ``/tmp``, ``HOME``, caches and its interpreter's state from one program to the
next, so it never serves two identities (another token holder): ``serve_identity`` replaces
it, with a fresh sandbox directory, before a different identity's program runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kcoral_server import ipc, limits
from kcoral_server.lease import GpuQuarantined, LeaseArbiter
from kcoral_server.worker_channel import WorkerGone, close_fds
from kcoral_server.worker_handle import SeatSandbox, WorkerHandle, WorkerStartError, event_fields
from kcoral_server.workspace import remove_stale_workspaces

RETIRE_LEVELS = {
    "request_limit": "INFO",
    "poisoned_context": "WARNING",
    "sandbox_cleanup": "WARNING",
    "timeout": "WARNING",
    "crashed": "ERROR",
    "cancelled": "INFO",  # its program was cancelled (EXTENSIONS §5, §9)
    "identity": "INFO",  # the next program belongs to another identity
}
BACKOFF_START_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 30.0
REUSE_READY_TIMEOUT_SECONDS = 60.0


class SeatState(enum.Enum):
    """Where a seat is in its worker's life."""

    STARTING = "starting"  # its first worker is starting
    IDLE = "idle"  # its worker is ready for a program
    BUSY = "busy"  # checked out, or its worker is cleaning up after a program
    REPLACING = "replacing"  # a new worker is being started (with back-off)
    FAILED = "failed"  # its worker failed to start; a replacement follows
    QUARANTINED = "quarantined"  # the pool stopped admitting: no new worker
    CLOSED = "closed"  # the pool is shutting down


class RunResult(enum.Enum):
    """How one program's run on a worker ended (the pipeline answers from it)."""

    FINISHED = "finished"  # ProgramFinished (COMPLETED or FAILED), or a crash mid-instruction
    TIMED_OUT = "timeout"  # the deadline passed: killed under its lease
    CRASHED = "crashed"  # the worker died before running an instruction
    CANCELLED = "cancelled"  # a job cancel or a client disconnect: killed under its lease
    INVALID = "invalid"  # the worker spoke garbage
    QUARANTINED = "quarantined"  # a GPU it needs was taken out of service under it


class NoWorker(Exception):
    """No worker within the wait timeout, or the server is shutting down (503 ``busy``)."""


class PoolStartError(Exception):
    """The pool could not start (no worker came up, or mixed GPU architectures)."""


@dataclass
class GpuDevice:
    """One configured GPU: physical id, UUID when known, arch (``sm_90a``)."""

    id: int
    uuid: str = ""
    arch: str = ""


@dataclass
class Seat:
    id: str
    gpu_id: int | None
    generation: int = 0
    worker: WorkerHandle | None = None
    state: SeatState = SeatState.STARTING
    served: int = 0
    assigned: bool = False
    replacement: asyncio.Task | None = field(default=None, repr=False)
    #: under bubblewrap: the sandbox (and fork server) its workers share, one identity's
    sandbox: SeatSandbox | None = field(default=None, repr=False)
    #: a session's seat (EXTENSIONS §11): outside ``seats``; the session takes each release
    pinned: Callable[[str | None], None] | None = field(default=None, repr=False)


class Checkout:
    """``Pool.checkout``'s context: the seat on entry, the request counted done on exit (a
    plain class, not a generator: it is on every request's path)."""

    __slots__ = ("_owner", "_pool", "_timeout", "_wait", "seat")

    def __init__(
        self,
        pool: Pool,
        timeout: float,
        owner: object | None,
        wait: Callable[[Awaitable[Seat]], Awaitable[Seat]] | None,
    ) -> None:
        self._pool = pool
        self._timeout = timeout
        self._owner = owner
        self._wait = wait
        self.seat: Seat | None = None

    async def __aenter__(self) -> Seat:
        pool = self._pool
        seat = pool.try_acquire()
        if seat is None:
            waiting = pool.acquire(self._timeout, owner=self._owner)
            seat = await (self._wait(waiting) if self._wait is not None else waiting)
        self.seat = seat
        return seat

    async def __aexit__(self, *exc_info: object) -> None:
        if self.seat is not None:
            self._pool.finish_request(self.seat)


class Pool:
    """All seats of one server, plus the queue of requests waiting for one."""

    def __init__(
        self,
        *,
        mode: str,
        gpus: Sequence[GpuDevice],
        config: Any,
        events: Any,
        arbiter: LeaseArbiter | None,
        sandbox: str = "none",
        allowed_serialization: Sequence[str] = ("json", "pickle"),
        worker: Callable[..., WorkerHandle] = WorkerHandle,
    ) -> None:
        self.mode = mode  # "cpu", "gpu" or "fake-gpu"
        #: makes the worker handles (unit tests of the pool's decisions pass a stand-in)
        self._worker = worker
        self.gpus = list(gpus)
        self.config = config
        self.events = events
        self.arbiter = arbiter
        self.sandbox = sandbox
        self.allowed_serialization = list(allowed_serialization)
        self.seats: list[Seat] = []
        if mode == "cpu":
            self.seats = [Seat(f"cpu/w{i}", None) for i in range(config.num_workers)]
        else:
            for gpu in self.gpus:
                self.seats += [
                    Seat(f"gpu{gpu.id}/w{i}", gpu.id) for i in range(config.workers_per_gpu)
                ]
        self.target: dict[str, str] = {}
        self.versions: dict[str, str] = {}
        self.accepting = False
        self.closing = False
        #: why the pool stopped admitting for good (a clean-up it could not confirm)
        self.quarantine_reason: str | None = None
        self.requests_in_progress = 0
        self._waiters: deque[asyncio.Future[Seat]] = deque()
        self._owners: dict[asyncio.Future[Seat], object] = {}
        #: called (no arguments) whenever the queue of waiting requests changes
        self.queue_listeners: list[Callable[[], None]] = []

    # ------------------------------------------------------------------ counters

    @property
    def request_capacity(self) -> int:
        if not self.accepting:
            return 0
        return sum(1 for s in self.seats if s.state in (SeatState.IDLE, SeatState.BUSY))

    @property
    def requests_waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    def queue_positions(self) -> dict[object, int]:
        """Owner -> number of requests ahead of it, for queued ``acquire`` calls that named
        an owner."""
        positions: dict[object, int] = {}
        ahead = 0
        for waiter in self._waiters:
            if waiter.done():
                continue
            owner = self._owners.get(waiter)
            if owner is not None:
                positions[owner] = ahead
            ahead += 1
        return positions

    def _queue_changed(self) -> None:
        for listener in list(self.queue_listeners):
            listener()

    @property
    def busy_workers(self) -> int:
        return sum(1 for s in self.seats if s.state is not SeatState.IDLE)

    def gpu_device(self, gpu_id: int | None) -> GpuDevice | None:
        return next((g for g in self.gpus if g.id == gpu_id), None)

    # ------------------------------------------------------------------ start-up

    async def start(self) -> None:
        # SERVER §7: workspaces a front-end killed earlier left behind (its lock is free)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, remove_stale_workspaces)
        await loop.run_in_executor(None, limits.remove_stale_cgroups)  # of killed servers
        wanted = limits.limits_from_config(self.config, seats=len(self.seats))
        missing = await loop.run_in_executor(None, limits.unenforced, wanted)
        if missing:
            # said once, so that a limit nobody enforces is never silent (README "Limits")
            self.events.emit(
                "worker_limits_unenforced",
                "WARNING",
                missing=missing,
                memory_bytes=wanted.memory_bytes,
                processes=wanted.processes,
                message="no writable cgroup enforces these per-worker limits: "
                + ", ".join(missing),
            )
        results = await asyncio.gather(
            *(self._start_seat(seat, phase="startup") for seat in self.seats)
        )
        ready = [seat for seat, ok in zip(self.seats, results, strict=True) if ok]
        if not ready:
            raise PoolStartError("no worker could be started")
        arches = {seat.worker.info.target.get("arch") for seat in ready}  # type: ignore[union-attr]
        if len(arches) > 1:
            raise PoolStartError(f"GPUs report different architectures: {sorted(arches)}")
        first = ready[0].worker.info  # type: ignore[union-attr]
        self.target = dict(first.target)
        self.versions = dict(first.versions)
        self.accepting = True
        for seat, ok in zip(self.seats, results, strict=True):
            if not ok:
                self._schedule_replacement(seat, "crashed", emit_retired=False)

    def _new_handle(self, seat: Seat, *, transient: bool | None = None) -> WorkerHandle:
        seat.generation += 1
        gpu = self.gpu_device(seat.gpu_id)
        if self.sandbox == "bubblewrap" and seat.sandbox is None:
            seat.sandbox = SeatSandbox(
                config=self.config, device=self.mode, gpu_ids=[gpu.id] if gpu else []
            )
        return self._worker(
            seat_id=seat.id,
            generation=seat.generation,
            device=self.mode,
            gpu_ids=[gpu.id] if gpu else [],
            gpu_uuids=[gpu.uuid] if gpu and gpu.uuid else [],
            arbiter=self.arbiter,
            sandbox=self.sandbox,
            log_programs=self.config.log_programs,
            allowed_serialization=self.allowed_serialization,
            # one request per worker: it exits right after its outcome instead of cleaning
            # up for a next program it will never get (the pipeline waits for that exit)
            transient=self.config.max_requests_per_worker == 1 if transient is None else transient,
            on_gone=self._on_worker_gone,
            config=self.config,
            events=self.events,
            seats=len(self.seats),
            seat_sandbox=seat.sandbox,
        )

    def set_worker(self, seat: Seat) -> WorkerHandle:
        """PROTOCOL §6.5: a transient worker for a GPU-set request that borrowed ``seat``;
        it leases its GPUs (``WorkerHandle.take_gpu_set``) before it starts, and is killed
        while holding them."""
        return self._worker(
            seat_id=seat.id,
            generation=seat.generation,
            device=self.mode,
            gpu_ids=[],
            gpu_uuids=[],
            arbiter=self.arbiter,
            sandbox=self.sandbox,
            log_programs=self.config.log_programs,
            allowed_serialization=self.allowed_serialization,
            transient=True,
            config=self.config,
            events=self.events,
        )

    async def _start_seat(self, seat: Seat, *, phase: str, idle: bool = True) -> bool:
        handle = self._new_handle(seat)
        try:
            info = await handle.start()
        except (WorkerStartError, WorkerGone, OSError) as exc:
            self.events.emit(
                "worker_failed",
                "ERROR",
                worker_id=seat.id,
                gpu_id=seat.gpu_id,
                generation=seat.generation,
                phase=phase,
                error=str(exc),
            )
            await self.kill(handle)
            seat.worker = None
            seat.state = SeatState.FAILED
            return False
        seat.worker = handle
        seat.served = 0
        gpu = self.gpu_device(seat.gpu_id)
        self.events.emit(
            "worker_ready",
            worker_id=seat.id,
            gpu_id=seat.gpu_id,
            generation=seat.generation,
            pid=info.pid,
            device=info.device_uuid or (gpu.uuid if gpu and gpu.uuid else self.mode),
            arch=info.target.get("arch"),
        )
        if idle:
            self._make_idle(seat)
        return True

    # ------------------------------------------------------------------ assignment

    async def acquire(self, timeout: float, owner: object | None = None) -> Seat:
        """An idle seat, marked busy; ``NoWorker`` after ``timeout`` or during shutdown.

        ``owner`` names the caller in ``queue_positions`` while it waits. Cancelling the
        wait leaves the queue (a seat assigned in the same tick is handed on)."""
        seat = self.try_acquire()
        if seat is not None:
            return seat
        future: asyncio.Future[Seat] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        if owner is not None:
            self._owners[future] = owner
        self._queue_changed()
        try:
            seat = await asyncio.wait_for(asyncio.shield(future), timeout)
        except (asyncio.TimeoutError, TimeoutError):
            if future.done() and not future.cancelled() and future.exception() is None:
                seat = future.result()  # assigned in the very same tick
            else:
                future.cancel()
                raise NoWorker("no worker became free in time") from None
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                # The seat's worker took nothing: it is still clean and idle.
                self.release_unused(future.result())
            future.cancel()
            raise
        finally:
            self._owners.pop(future, None)
            with contextlib.suppress(ValueError):
                self._waiters.remove(future)
            self._queue_changed()
        self._take(seat)
        return seat

    def checkout(
        self,
        timeout: float,
        *,
        owner: object | None = None,
        wait: Callable[[Awaitable[Seat]], Awaitable[Seat]] | None = None,
    ) -> Checkout:
        """The one way a request gets a seat (single GPU, GPU set and CPU alike):
        ``async with pool.checkout(...) as seat``. An idle seat at once (no task, no waiter:
        front-end CPU per request), else FIFO within ``timeout`` (``wait`` wraps that wait,
        e.g. to stop it on a cancel); ``NoWorker`` when none comes or the pool stops
        admitting. The request counts in ``requests_in_progress`` until the block ends.
        Inside it, the caller runs its program and hands the seat back with the decision
        ``retirement`` takes (``release``), or untouched (``release_unused``).

        A seat pinned across several programs (a session) is a checkout held open across
        them: the seat stays busy and its worker serves only that holder in between."""
        return Checkout(self, timeout, owner, wait)

    def try_acquire(self) -> Seat | None:
        """An idle seat at once (marked busy), or None when the request would have to
        queue; ``NoWorker`` when the pool is not admitting."""
        if not self.accepting:
            raise NoWorker("server is not accepting requests")
        seat = self._pick_idle() if not self.requests_waiting else None
        if seat is not None:
            self._take(seat)
        return seat

    async def serve_identity(self, seat: Seat, identity: str) -> None:
        """Make the (acquired) seat's worker fit to run ``identity``'s program: a worker that
        served another identity is replaced by a fresh one (fresh sandbox directory: empty
        ``/tmp``, ``HOME`` and caches) first. ``NoWorker`` when the new one fails to start
        (the seat is then replaced in the background)."""
        handle = seat.worker
        if handle is None or handle.identity in (None, identity):
            if handle is not None:
                handle.identity = identity
            return
        self.events.emit(
            "worker_retired",
            RETIRE_LEVELS["identity"],
            worker_id=seat.id,
            gpu_id=seat.gpu_id,
            generation=seat.generation,
            pid=handle.pid,
            reason="identity",
        )
        started = False
        try:
            await self.kill(handle)
            seat.worker = None
            if seat.sandbox is not None:  # its HOME and caches are the other identity's
                old, seat.sandbox = seat.sandbox, None
                await asyncio.get_running_loop().run_in_executor(None, old.close)
            if self.quarantine_reason is None:
                started = await self._start_seat(seat, phase="respawn", idle=False)
        finally:
            if not started:
                seat.worker = None
                self._schedule_replacement(seat, "crashed", emit_retired=False)
        if not started:
            raise NoWorker("the worker for this identity failed to start")
        assert seat.worker is not None
        seat.worker.identity = identity

    def _take(self, seat: Seat) -> None:
        seat.state = SeatState.BUSY
        seat.assigned = True
        self.requests_in_progress += 1

    def _pick_idle(self) -> Seat | None:
        idle = [s for s in self.seats if s.state is SeatState.IDLE]
        if not idle:
            return None
        load: dict[int | None, int] = {}
        for s in self.seats:
            load[s.gpu_id] = load.get(s.gpu_id, 0) + (1 if s.assigned else 0)
        return min(idle, key=lambda s: load.get(s.gpu_id, 0))

    def _make_idle(self, seat: Seat) -> None:
        seat.state = SeatState.IDLE
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                seat.state = SeatState.BUSY
                waiter.set_result(seat)
                return

    def begin_shutdown(self) -> None:
        """Stop admitting: ``request_capacity`` 0, queued requests get ``NoWorker``."""
        self.closing = True
        self._stop_admitting("server is shutting down")

    def _stop_admitting(self, why: str) -> None:
        self.accepting = False
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(NoWorker(why))

    def _check_cleanup(self, handle: WorkerHandle) -> None:
        """SERVER §8, §11: a worker whose end could not be confirmed may still be running
        on its GPUs. They are quarantined (never leased again) and the server stops
        admitting requests; requests already running finish (those that need a quarantined
        GPU answer 503)."""
        if handle.cleanup_unconfirmed is None:
            return
        if self.arbiter is not None and handle.gpu_ids:
            self.arbiter.quarantine(handle.gpu_ids)
        first = self.quarantine_reason is None
        if first:
            self.quarantine_reason = handle.cleanup_unconfirmed
        self.events.emit(
            "devices_quarantined",
            "ERROR",
            **event_fields(handle),
            gpu_ids=list(handle.gpu_ids),
            quarantined=sorted(self.arbiter.quarantined) if self.arbiter is not None else [],
            error=handle.cleanup_unconfirmed,
        )
        if first:
            self._stop_admitting("devices quarantined")

    # ------------------------------------------------------------------ after a request

    def finish_request(self, seat: Seat) -> None:
        seat.assigned = False
        self.requests_in_progress = max(0, self.requests_in_progress - 1)

    def retirement(self, seat: Seat, asked: str | None) -> str | None:
        """The one decision whether the seat's worker retires after its current program:
        ``asked`` (the run's reason: timeout, crashed, cancelled, or the worker's own, e.g.
        poisoned_context), else the reuse limit (``request_limit``), else None (reuse).
        ``release`` then applies it."""
        limit = self.config.max_requests_per_worker
        if asked is None and limit and seat.served + 1 >= limit and seat.pinned is None:
            return "request_limit"
        return asked

    def release_unused(self, seat: Seat) -> None:
        """Return a seat whose worker took no program (a GPU-set request borrowed it)."""
        handle = seat.worker
        if handle is None or handle.gone is not None:
            self._schedule_replacement(seat, "crashed")
        elif self.closing:
            seat.state = SeatState.IDLE
        else:
            self._make_idle(seat)

    def release(self, seat: Seat, retire_reason: str | None) -> None:
        """Hand the seat back after a request, with the ``retirement`` decided for it: None
        keeps the worker (it becomes idle once it reports ready again); a worker that is
        gone is replaced all the same."""
        handle = seat.worker
        seat.served += 1
        if handle is None or (handle.gone is not None and retire_reason is None):
            retire_reason = retire_reason or "crashed"
        if seat.pinned is not None:  # a session's seat: the session keeps or ends it
            seat.pinned(retire_reason)
            return
        if retire_reason is not None:
            self._schedule_replacement(seat, retire_reason)
            return
        seat.state = SeatState.BUSY  # until the worker reports clean
        seat.replacement = asyncio.ensure_future(self._await_clean(seat, handle))

    async def _await_clean(self, seat: Seat, handle: WorkerHandle) -> None:
        try:
            while True:
                message, fds = await handle.channel.receive(REUSE_READY_TIMEOUT_SECONDS)
                close_fds(fds)
                if isinstance(message, ipc.WorkerReady):
                    # After ProgramFinished the worker forgot the lease; it is ours to free.
                    handle.lease.release()
                    break
                # Anything else between requests is a protocol violation.
                raise WorkerGone(f"unexpected message {message.tag!r}", invalid=True)
        except (asyncio.TimeoutError, TimeoutError, WorkerGone):
            self._schedule_replacement(seat, "crashed")
            return
        if self.closing:
            seat.state = SeatState.IDLE
            return
        self._make_idle(seat)

    def _on_worker_gone(self, handle: WorkerHandle) -> None:
        # Only idle seats are handled here; a busy seat's request notices by itself.
        for seat in self.seats:
            if seat.worker is handle and seat.state is SeatState.IDLE:
                self._schedule_replacement(seat, "crashed")

    def _schedule_replacement(self, seat: Seat, reason: str, *, emit_retired: bool = True) -> None:
        old = seat.worker
        if emit_retired and old is not None:
            self.events.emit(
                "worker_retired",
                RETIRE_LEVELS.get(reason, "INFO"),
                worker_id=seat.id,
                gpu_id=seat.gpu_id,
                generation=seat.generation,
                pid=old.pid,
                reason=reason,
            )
        seat.state = SeatState.REPLACING
        seat.replacement = asyncio.ensure_future(self._replace(seat, old, reason))

    async def _replace(self, seat: Seat, old: WorkerHandle | None, reason: str) -> None:
        if old is not None:
            await self.kill(old)
        seat.worker = None
        if self.quarantine_reason is not None:
            seat.state = SeatState.QUARANTINED  # nothing is admitted any more: nothing to serve
            return
        delay = BACKOFF_START_SECONDS
        while not self.closing:
            if await self._start_seat(seat, phase="respawn"):
                return
            self.events.emit(
                "worker_replace_failed",
                "ERROR",
                worker_id=seat.id,
                gpu_id=seat.gpu_id,
                reason=reason,
                error="worker failed to start",
            )
            seat.state = SeatState.REPLACING
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX_SECONDS)
        seat.state = SeatState.CLOSED

    async def kill(self, handle: WorkerHandle) -> None:
        """Kill a worker's process tree while holding its GPU's lease (§5); quarantine its
        GPUs when the kill cannot be confirmed. A second call does nothing."""
        if handle.killed:
            return
        grace = float(self.config.worker_termination_grace_seconds)
        arbiter = self.arbiter
        token: object | None = None
        if arbiter is not None and handle.gpu_ids and not handle.lease.held:
            handle.lease.withdraw()
            token = object()
            try:
                await arbiter.acquire(token, handle.gpu_ids, request_id=handle.request_id)
            except GpuQuarantined:
                token = None  # never leased again: kill without it
        try:
            await handle.kill(grace)
        finally:
            if token is not None:
                arbiter.release(token, handle.gpu_ids)  # type: ignore[union-attr]
        handle.lease.release()
        self._check_cleanup(handle)

    async def stop_worker(self, handle: WorkerHandle, timeout: float) -> bool:
        """Retire a worker politely: ``Shutdown``, then wait for its exit. The lease it holds
        is kept until the process is gone. False when it did not exit within ``timeout``."""
        exited = await handle.stop(timeout, float(self.config.worker_termination_grace_seconds))
        if exited:
            handle.close()
            handle.lease.release()
            self._check_cleanup(handle)
        return exited

    # ------------------------------------------------------------------ shutdown

    async def close(self, timeout: float = 10.0) -> None:
        """Stop every worker (politely, then by force) under its lease."""
        self.begin_shutdown()
        replacing = [
            seat.replacement
            for seat in self.seats
            if seat.replacement is not None and not seat.replacement.done()
        ]
        for task in replacing:
            task.cancel()
        deadline = time.monotonic() + timeout
        if replacing:  # a cancelled start cleans up after itself (processes, sandbox dirs)
            await asyncio.wait(replacing, timeout=timeout)

        async def close_seat(seat: Seat) -> None:
            handle = seat.worker
            seat.state = SeatState.CLOSED
            if handle is None:
                return
            if handle.gone is None:
                remaining = max(0.1, deadline - time.monotonic())
                if await self.stop_worker(handle, remaining):
                    return
            await self.kill(handle)

        await asyncio.gather(*(close_seat(seat) for seat in self.seats), return_exceptions=True)
        sandboxes = [seat.sandbox for seat in self.seats if seat.sandbox is not None]
        if sandboxes:  # their fork servers exit now that their workers have
            loop = asyncio.get_running_loop()
            await asyncio.gather(*(loop.run_in_executor(None, box.close) for box in sandboxes))
