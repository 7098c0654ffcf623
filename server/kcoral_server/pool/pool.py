"""The owner of every worker's life: seats, assignment, retirement and replacement
(SERVER.md §4, §6). Only the pool starts, stops and kills workers (``WorkerHandle``).

Every request gets its seat through ``checkout`` (an idle seat, else the identities' turns
of ``queue``).
After the program, ``retirement`` decides once whether the worker stays, and ``release``
applies it (``retirement``); replacing a worker (retirement, crash, timeout) runs in
the background with back-off (``replacement``) and the seat stays out of
``request_capacity`` until its new worker is ready. The handles the pool starts are made by
``handles.HandleMaker``; workers end under their GPUs' lease (``kill.WorkerEnds``); a
seat's states are in ``seat``, start-up and shutdown in ``startup`` and ``shutdown``.

Who can reach what: a reused worker (``--max-requests-per-worker`` other than 1) keeps its
sandbox's ``/tmp``, ``HOME``, caches and its interpreter's state from one program to the
next, so it never serves two identities (another token holder): ``serve_identity`` replaces
it, with a fresh sandbox directory, before a different identity's program runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from kcoral_server.execution.responses import QUARANTINED, SHUTTING_DOWN
from kcoral_server.gpu.lease import LeaseArbiter
from kcoral_server.pool import retirement as pool_retirement
from kcoral_server.pool.handles import HandleMaker
from kcoral_server.pool.identity_change import serve_identity
from kcoral_server.pool.kill import LeasePhases, WorkerEnds
from kcoral_server.pool.queue import Checkout, NoWorker, SeatQueue
from kcoral_server.pool.replacement import start_with_backoff
from kcoral_server.pool.retirement import reason_to_retire
from kcoral_server.pool.seat import (
    SERVING,
    GpuDevice,
    Seat,
    SeatState,
    seat_to_take,
    seats_for,
)
from kcoral_server.pool.shutdown import close_seats
from kcoral_server.pool.spares import SpareWorkers
from kcoral_server.pool.startup import common_target, emit_failed, emit_ready, prepare_host
from kcoral_server.processes.channel import WorkerGone
from kcoral_server.processes.handle import WorkerHandle
from kcoral_server.processes.start import WorkerInfo, WorkerStartError
from kcoral_server.settings.config import ServerConfig
from kcoral_server.storage.event_log import EventLog


class Pool:
    """All seats of one server, plus the queue of requests waiting for one."""

    def __init__(
        self,
        *,
        mode: str,
        gpus: Sequence[GpuDevice],
        config: ServerConfig,
        events: EventLog,
        arbiter: LeaseArbiter | None,
        sandbox: str = "none",
        allowed_serialization: Sequence[str] = ("json", "pickle"),
        worker: Callable[..., WorkerHandle] = WorkerHandle,
    ) -> None:
        self.mode = mode  # "cpu", "gpu" or "fake-gpu"
        self.gpus = list(gpus)
        self.config = config
        self.events = events
        self.seats = seats_for(mode, self.gpus, config.num_workers, config.workers_per_gpu)
        self.target: dict[str, str] = {}
        self.versions: dict[str, str] = {}
        self.accepting = False
        #: why the pool admits nothing (``NoWorker``'s message, a 503's why); None: it admits
        self.refusing: str | None = "the server is starting"
        self.closing = False
        self.requests_in_progress = 0
        #: the requests waiting for a seat: their positions, and ``listeners`` called (no
        #: arguments) whenever they change (the jobs' queue positions)
        self.queue = SeatQueue()
        # A 503 gives no reason details: they name another identity's worker (the log has them).
        stop = lambda _reason: self._stop_admitting(QUARANTINED)  # noqa: E731
        self.ends = WorkerEnds(
            arbiter, events, float(config.worker_termination_grace_seconds), stop
        )
        #: makes every worker handle of this pool (a session's: ``for_session``, a
        #: GPU-set request's transient one: ``for_gpu_set``)
        self.handles = HandleMaker(
            make=worker,  # unit tests of the pool's decisions pass a stand-in
            mode=mode,
            gpus=self.gpus,
            config=config,
            events=events,
            arbiter=arbiter,
            sandbox=sandbox,
            allowed_serialization=list(allowed_serialization),
            seats=len(self.seats),
            on_gone=self._on_worker_gone,
        )
        #: each stateless seat's next worker, started ahead (SERVER §6)
        self.spares = SpareWorkers(self)

    # ------------------------------------------------------------------ counters

    @property
    def request_capacity(self) -> int:
        return sum(1 for s in self.seats if s.state in SERVING) if self.accepting else 0

    @property
    def requests_waiting(self) -> int:
        return self.queue.waiting

    @property
    def busy_workers(self) -> int:
        return sum(1 for s in self.seats if s.state is not SeatState.IDLE)

    # ------------------------------------------------------------------ start-up

    async def start(self) -> None:
        await prepare_host(self.config, len(self.seats), self.events)
        results = await asyncio.gather(
            *(self.start_seat(seat, phase="startup") for seat in self.seats)
        )
        ready = [seat for seat, ok in zip(self.seats, results, strict=True) if ok]
        self.target, self.versions = common_target(ready)
        self.accepting = True
        self.refusing = None
        for seat, ok in zip(self.seats, results, strict=True):
            if not ok:
                self.schedule_replacement(seat, "crashed", emit_retired=False)

    @property
    def quarantine_reason(self) -> str | None:
        """Why the pool stopped admitting for good (a clean-up it could not confirm)."""
        return self.ends.quarantine_reason

    async def start_seat(
        self,
        seat: Seat,
        *,
        phase: str,
        idle: bool = True,
        identity: str | None = None,
        lease_phases: LeasePhases = None,
    ) -> bool:
        """Start ``seat``'s next worker (its start-up in ``identity``'s turn, its wait for the
        GPU's lease told to ``lease_phases``); False when it failed (the seat ``FAILED``)."""
        handle = self.handles.for_seat(seat)
        handle.lease.identity = identity  # whose turn its start-up takes (SERVER §5)
        if lease_phases is not None:  # its start-up's lease wait is a program's
            handle.lease.observe(lease_phases)
        try:
            info = await handle.start()
        except (WorkerStartError, WorkerGone, OSError) as exc:
            if lease_phases is not None:
                handle.lease.observe(None)
            emit_failed(self.events, seat, seat.generation, phase, exc)
            await self.kill(handle)
            seat.worker = None
            seat.state = SeatState.FAILED
            self.queue.serve(self.seats)  # a request waiting for this seat takes another
            return False
        if lease_phases is not None:
            handle.lease.observe(None)
        self._occupy(seat, handle, info)
        if idle:
            self._make_idle(seat)
        return True

    def _occupy(self, seat: Seat, handle: WorkerHandle, info: WorkerInfo, **fields: Any) -> None:
        """``handle``, ready, becomes the seat's worker (``worker_ready``); a spare starts."""
        seat.worker = handle
        seat.served = 0
        gpu = self.handles.gpu_device(seat.gpu_id)
        emit_ready(self.events, seat, handle.pid, info, gpu, self.mode, **fields)
        self.spares.keep(seat)

    # ------------------------------------------------------------------ assignment

    def checkout(
        self,
        timeout: float,
        *,
        owner: object | None = None,
        wait: Callable[[Awaitable[Seat]], Awaitable[Seat]] | None = None,
        identity: str = "",
    ) -> Checkout:
        """The one way a request gets a seat (single GPU, GPU set and CPU alike):
        ``async with pool.checkout(...) as seat``. An idle seat at once (no task, no waiter:
        front-end CPU per request), else queued in ``identity``'s turn within ``timeout``
        (``wait`` wraps that wait: a cancel stops it); ``NoWorker`` when none comes or the
        pool stops admitting; the request counts in ``requests_in_progress`` until it ends.
        Inside it, the caller runs its program and hands the seat back with the decision
        ``retirement`` takes (``release``), or untouched (``release_unused``). (A session's
        seat is a checkout held open across its programs, serving only its holder.)"""
        return Checkout(self, timeout, owner, wait, identity)

    def try_acquire(self) -> Seat | None:
        """An idle seat at once (marked busy), or None when the request would have to
        queue; ``NoWorker`` when the pool is not admitting."""
        if not self.accepting:
            raise NoWorker(self.refusing or SHUTTING_DOWN)
        seat = seat_to_take(self.seats) if not self.requests_waiting else None
        if seat is not None:
            self._take(seat)
        return seat

    async def acquire(self, timeout: float, owner: object = None, identity: str = "") -> Seat:
        """An idle seat, marked busy, ``owner`` named in ``queue.positions()`` while it waits
        in ``identity``'s turn; ``NoWorker`` after ``timeout`` or during shutdown (a cancelled
        wait leaves the queue; a seat assigned in the same tick is handed on)."""
        seat = self.try_acquire()
        if seat is None:
            seat = await self.queue.wait(timeout, owner, self.release_unused, identity)
            self._take(seat)
        return seat

    async def serve_identity(
        self, seat: Seat, identity: str, lease_phases: LeasePhases = None
    ) -> None:
        """Make the (acquired) seat's worker fit to run ``identity``'s program
        (``identity_change.serve_identity``)."""
        await serve_identity(self, seat, identity, lease_phases)

    def _take(self, seat: Seat) -> None:
        seat.state = SeatState.BUSY
        seat.assigned = True
        self.requests_in_progress += 1

    def _make_idle(self, seat: Seat) -> None:
        """The seat's worker is ready: a waiting request takes it or a seat the seat rule had
        held it back from (a closing pool has no waiters: ``fail_all``), else it idles."""
        seat.state = SeatState.IDLE
        self.queue.serve(self.seats)

    def begin_shutdown(self) -> None:
        """Stop admitting: ``request_capacity`` 0, queued requests get ``NoWorker``."""
        self.closing = True
        self._stop_admitting(SHUTTING_DOWN)

    def _stop_admitting(self, why: str) -> None:
        self.accepting = False
        if self.refusing != QUARANTINED:  # a quarantine outranks a shutdown
            self.refusing = why
        self.queue.fail_all(why)

    # ------------------------------------------------------------------ after a request

    def finish_request(self, seat: Seat) -> None:
        seat.assigned = False
        self.requests_in_progress = max(0, self.requests_in_progress - 1)

    def retirement(self, seat: Seat, asked: str | None) -> str | None:
        """The one decision whether the seat's worker retires after its current program
        (``pool_retirement.retirement``); ``release`` then applies it."""
        return pool_retirement.retirement(seat, asked, self.config.max_requests_per_worker)

    def release_unused(self, seat: Seat) -> None:
        """Return a seat whose worker took no program (a GPU-set request borrowed it)."""
        handle = seat.worker
        if handle is None or handle.gone is not None:
            self.schedule_replacement(seat, "crashed")
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
            self.schedule_replacement(seat, retire_reason)
            return
        seat.state = SeatState.BUSY  # until the worker reports clean
        assert handle is not None  # a seat without a worker was retired above
        seat.replacement = asyncio.ensure_future(self._await_clean(seat, handle))

    async def _await_clean(self, seat: Seat, handle: WorkerHandle) -> None:
        if (reason := await reason_to_retire(handle)) is not None:
            self.schedule_replacement(seat, reason)
        else:
            self._make_idle(seat)

    def _on_worker_gone(self, handle: WorkerHandle) -> None:
        # Only idle seats are handled here; a busy seat's request notices by itself.
        for seat in self.seats:
            if seat.worker is handle and seat.state is SeatState.IDLE:
                self.schedule_replacement(seat, "crashed")

    def schedule_replacement(self, seat: Seat, reason: str, *, emit_retired: bool = True) -> None:
        """Retire ``seat``'s worker for ``reason`` and replace it in the background."""
        old = seat.worker
        if emit_retired and old is not None:
            pool_retirement.emit_retired(self.events, seat, old, reason)
        seat.state = SeatState.REPLACING
        seat.replacement = asyncio.ensure_future(self._replace(seat, old, reason))

    async def _replace(self, seat: Seat, old: WorkerHandle | None, reason: str) -> None:
        if seat.departure is not None:  # the last one handed over runs no more code first
            await asyncio.wait([seat.departure])
        if old is not None and self.spares.takes_over_early(old) and self.accepting:
            seat.departure = asyncio.ensure_future(self.spares.see_off(seat, old))
        elif old is not None:
            await self.kill(old)
        seat.worker = None
        if self.quarantine_reason is not None:
            seat.state = SeatState.QUARANTINED  # nothing is admitted any more: nothing to serve
            return
        taken = await self.spares.take(seat)
        if taken is not None:  # the seat's next worker was started ahead: ready now
            self._occupy(seat, *taken, started_ahead=True)
            self._make_idle(seat)
            return
        if seat.departure is not None:  # a worker started anew may need its sandbox directory
            await asyncio.wait([seat.departure])
        start = lambda: self.start_seat(seat, phase="respawn")  # noqa: E731
        await start_with_backoff(seat, reason, start, lambda: self.closing, self.events)

    # ------------------------------------------------------------------ ending workers

    async def kill(self, handle: WorkerHandle, lease_phases: LeasePhases = None) -> None:
        """Kill a worker under its GPUs' lease (``WorkerEnds.kill``)."""
        await self.ends.kill(handle, lease_phases)

    async def stop_worker(self, handle: WorkerHandle, timeout: float) -> bool:
        """Retire a worker politely within ``timeout`` (``WorkerEnds.stop``)."""
        return await self.ends.stop(handle, timeout)

    async def close(self, timeout: float = 10.0) -> None:
        """Stop every worker (politely, then by force) under its lease."""
        self.begin_shutdown()
        await close_seats(self.seats, timeout, self.stop_worker, self.kill)
