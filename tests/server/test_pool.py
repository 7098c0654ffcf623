"""The pool's decisions, with a stand-in for the worker process (SERVER §4, §6).

Which seat a request gets, who waits, when a worker retires and what replaces it, which
identity a worker may serve, when the pool stops admitting. The real processes behind
these decisions are tested beside this (``test_execute.py``, ``tests/reliability``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import types
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import pytest
from kcoral_server.execution.control import Cancellation
from kcoral_server.execution.responses import RequestFailed
from kcoral_server.gpu.lease import LeaseArbiter
from kcoral_server.pool import replacement as pool_replacement
from kcoral_server.pool import spares as pool_spares
from kcoral_server.pool import startup as pool_startup
from kcoral_server.pool.pool import Pool
from kcoral_server.pool.queue import NoWorker
from kcoral_server.pool.seat import GpuDevice, Seat, SeatState
from kcoral_server.processes import cgroups, ipc
from kcoral_server.processes.channel import WorkerGone
from kcoral_server.processes.start import WorkerInfo, WorkerStartError
from kcoral_server.settings.config import ServerConfig

_PIDS = itertools.count(10_000)


class Events:
    """Records what the pool logs."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str, dict[str, Any]]] = []

    def emit(self, event: str, level: str = "INFO", **fields: Any) -> None:
        self.records.append((event, level, fields))

    def named(self, event: str) -> list[dict[str, Any]]:
        return [fields for name, _level, fields in self.records if name == event]


class StandInLease:
    def __init__(self, gpu_ids: list[int]) -> None:
        self.gpu_ids = list(gpu_ids)
        self.held = False
        self.request_id: str | None = None

    def release(self) -> None:
        self.held = False

    def withdraw(self) -> None:
        pass


class StandInChannel:
    """Between programs a real worker reports ready again; this one does at once (or
    breaks, when its worker is gone)."""

    def __init__(self) -> None:
        self.gone: WorkerGone | None = None

    async def receive(self, timeout: float | None) -> tuple[ipc.Message, list[int]]:
        if self.gone is not None:
            raise self.gone
        return ipc.WorkerReady(pid=1), []


class StandInProcess:
    """``WorkerHandle.os_process`` of a stand-in: the release of a worker forked ahead."""

    def __init__(self, worker: StandInWorker) -> None:
        self.worker = worker

    async def release(self, seat_sandbox: Any) -> None:
        assert self.worker.held, "only a worker forked ahead is released"
        assert not self.worker.killed, "a killed worker is never released"
        if self.worker.gone is not None:
            raise WorkerStartError("cannot start the worker forked ahead: it is gone")
        self.worker.begin()
        self.worker.held = False
        self.worker.released_into.append(seat_sandbox)


class StandInWorker:
    """What the pool needs of a ``WorkerHandle``, without a process."""

    fail_starts = 0  # how many of the next starts fail
    unconfirmed_kill: str | None = None  # what the next kill cannot confirm

    def __init__(self, *, seat_id: str, generation: int, gpu_ids: list[int], **options: Any):
        self.seat_id = seat_id
        self.generation = generation
        self.options = options
        self.on_gone: Callable[[StandInWorker], None] | None = options.get("on_gone")
        self.lease = StandInLease(gpu_ids)
        self.channel = StandInChannel()
        self.pid = next(_PIDS)
        self._identity: str | None = None
        self.info: WorkerInfo | None = None
        self.launches = 0
        self.after_preload = False
        self.held = False
        self.released_into: list[Any] = []  # the sandboxes it was released into
        self.os_process = StandInProcess(self)
        self.killed = False
        self.stopped = False
        self.exit_announced = False  # the pipeline sets it where a real handle's is believed
        self.cleanup_unconfirmed: str | None = None
        self.configured_ahead = False  # set by the pool, as on a real handle
        self.process: Any = None  # a forked worker's: what its launcher had preloaded

    @property
    def gpu_ids(self) -> list[int]:
        return self.lease.gpu_ids

    @property
    def identity(self) -> str | None:
        """As a real handle's: its seat sandbox's, when it has one."""
        sandbox = self.options.get("seat_sandbox")
        return sandbox.identity if sandbox is not None else self._identity

    @identity.setter
    def identity(self, name: str | None) -> None:
        self._identity = name
        sandbox = self.options.get("seat_sandbox")
        if sandbox is not None:
            sandbox.identity = name

    @property
    def gone(self) -> WorkerGone | None:
        return self.channel.gone

    @property
    def request_id(self) -> str | None:
        return self.lease.request_id

    async def start(self) -> WorkerInfo:
        await self.launch()
        return await self.configure()

    @property
    def seat_sandbox(self) -> Any:
        return self.options.get("seat_sandbox")

    def begin(self) -> None:
        """The moment it may run code: launched, or released after it was forked ahead."""

    async def launch(self, *, hold: bool = False, after_preload: bool = False) -> None:
        if not hold:
            self.begin()
        self.launches += 1
        self.after_preload = after_preload  # no program waits for it: preload first
        self.held = hold  # forked ahead: waits for ``os_process.release``
        if StandInWorker.fail_starts:
            StandInWorker.fail_starts -= 1
            raise WorkerStartError("stand-in refuses to start")

    async def configure(self) -> WorkerInfo:
        self.info = WorkerInfo(self.pid, {"arch": "x86_64"}, {"python": "3"})
        return self.info

    def die(self) -> None:
        """The process exits on its own."""
        self.channel.gone = WorkerGone("channel closed: stand-in died")
        if self.on_gone is not None:
            self.on_gone(self)  # type: ignore[arg-type]

    async def kill(self, grace: float) -> None:
        self.cleanup_unconfirmed = StandInWorker.unconfirmed_kill
        self.killed = True
        self.channel.gone = self.channel.gone or WorkerGone("worker closed")

    async def stop(self, timeout: float, grace: float) -> bool:
        self.stopped = True
        await self.kill(grace)
        return True

    def close(self) -> None:
        self.channel.gone = self.channel.gone or WorkerGone("worker closed")


@pytest.fixture(autouse=True)
def _no_host_side_effects(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Pool.start`` tidies what killed servers left in /tmp and the cgroup tree; a unit
    test touches neither."""
    monkeypatch.setattr(pool_startup, "remove_stale_workspaces", lambda: 0)
    monkeypatch.setattr(cgroups, "remove_stale_cgroups", lambda: None)
    monkeypatch.setattr(cgroups, "unenforced", lambda wanted: [])
    monkeypatch.setattr(pool_replacement, "BACKOFF_START_SECONDS", 0.01)
    StandInWorker.fail_starts = 0
    StandInWorker.unconfirmed_kill = None


def run_pool(
    test: Callable[[Pool, Events], Awaitable[None]],
    *,
    workers: int = 1,
    reuse: int = 0,
    sandbox: str = "none",
    mode: str = "cpu",
    events: Events | None = None,
    worker: type[StandInWorker] = StandInWorker,
    gpus: int = 1,
) -> Events:
    """Start a pool of stand-ins (CPU, or ``fake-gpu`` on ``gpus`` GPUs with ``workers``
    seats each), run ``test`` on it, close it; the events logged."""
    events = events if events is not None else Events()

    async def main() -> None:
        config = ServerConfig(
            num_workers=workers,
            workers_per_gpu=workers,
            max_requests_per_worker=reuse,
            sandbox=sandbox,
            log_dir="",
        )
        devices = [GpuDevice(i) for i in range(gpus)] if mode != "cpu" else []
        pool = Pool(
            mode=mode,
            gpus=devices,
            config=config,
            events=events,
            arbiter=LeaseArbiter([d.id for d in devices]) if devices else None,
            sandbox=sandbox,
            worker=worker,
        )
        await pool.start()
        try:
            await test(pool, events)
        finally:
            await pool.close(timeout=1)

    asyncio.run(main())
    return events


async def settled(pool: Pool) -> None:
    """Until no seat is replacing a worker, waiting for it to report clean or starting its
    spare."""
    for _ in range(200):
        pending = [
            task
            for s in pool.seats
            for task in (s.replacement, s.spare_start, s.held_start, s.departure, *s.leaving)
            if task is not None and not task.done()
        ]
        if not pending:
            return
        await asyncio.wait(pending, timeout=1)


def test_an_idle_seat_is_checked_out_at_once_and_counted_until_the_checkout_ends() -> None:
    async def test(pool: Pool, events: Events) -> None:
        assert pool.request_capacity == 1
        async with pool.checkout(1.0) as seat:
            assert seat.state is SeatState.BUSY and pool.requests_in_progress == 1
            pool.release(seat, pool.retirement(seat, None))
        assert pool.requests_in_progress == 0
        await settled(pool)
        assert seat.state is SeatState.IDLE and seat.generation == 1

    run_pool(test)


def test_waiting_requests_get_seats_in_the_order_they_came() -> None:
    async def test(pool: Pool, events: Events) -> None:
        order: list[str] = []

        async def request(name: str, hold: asyncio.Event | None = None) -> None:
            async with pool.checkout(5.0, owner=name) as seat:
                order.append(name)
                if hold is not None:
                    await hold.wait()
                pool.release(seat, None)

        hold = asyncio.Event()
        first = asyncio.ensure_future(request("first", hold))
        await asyncio.sleep(0)
        later = [asyncio.ensure_future(request(name)) for name in ("second", "third")]
        await asyncio.sleep(0.01)
        assert pool.requests_waiting == 2
        assert pool.queue.positions() == {"second": 0, "third": 1}
        hold.set()
        await asyncio.gather(first, *later)
        assert order == ["first", "second", "third"]

    run_pool(test)


def test_a_checkout_that_waits_too_long_or_during_shutdown_gets_no_worker() -> None:
    async def test(pool: Pool, events: Events) -> None:
        async with pool.checkout(1.0) as seat:
            with pytest.raises(NoWorker):
                async with pool.checkout(0.01):
                    pass
            pool.release(seat, None)
        pool.begin_shutdown()
        with pytest.raises(NoWorker):
            async with pool.checkout(1.0):
                pass

    run_pool(test)


def test_a_cancelled_wait_leaves_the_queue() -> None:
    async def test(pool: Pool, events: Events) -> None:
        async with pool.checkout(1.0) as seat:
            waiting = asyncio.ensure_future(pool.acquire(5.0, owner="late"))
            await asyncio.sleep(0.01)
            assert pool.requests_waiting == 1
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert pool.requests_waiting == 0 and pool.queue.positions() == {}
            pool.release(seat, None)

    run_pool(test)


@pytest.mark.parametrize("ticks", range(12))
def test_a_request_cancelled_as_its_seat_is_handed_over_leaves_the_seat_free(ticks: int) -> None:
    """The soak's lost seat: a queued request whose client went away while the seat freed
    for it was being handed over. The cancel lands ``ticks`` loop turns after the release,
    so one of them falls between the hand-over and the request's wake-up; whichever came
    first, the seat is the request's (it hands it back) or the pool's, never busy for
    nobody (it was: busy for good, and shutdown waited for it forever)."""

    async def test(pool: Pool, events: Events) -> None:
        cancellation = Cancellation()

        async def queued() -> None:
            async with pool.checkout(5.0, owner="gone", wait=cancellation.unless) as seat:
                pool.release(seat, None)  # it got the seat before its cancel

        async with pool.checkout(1.0) as seat:
            waiting = asyncio.ensure_future(queued())
            while pool.requests_waiting == 0:
                await asyncio.sleep(0)
            pool.release(seat, None)
        for _ in range(ticks):
            await asyncio.sleep(0)
        cancellation.cancel("client_disconnected")
        with contextlib.suppress(RequestFailed):
            await waiting
        await settled(pool)
        assert pool.requests_in_progress == 0
        assert [s.state for s in pool.seats] == [SeatState.IDLE]

    run_pool(test)


def test_the_retirement_decision_prefers_the_runs_reason_then_the_reuse_limit() -> None:
    async def test(pool: Pool, events: Events) -> None:
        seat = pool.seats[0]
        assert pool.retirement(seat, None) is None  # served 0 of 2
        assert pool.retirement(seat, "timeout") == "timeout"
        seat.served = 1
        assert pool.retirement(seat, None) == "request_limit"
        assert pool.retirement(seat, "poisoned_context") == "poisoned_context"

    run_pool(test, reuse=2)


def test_unlimited_reuse_never_retires_a_worker_for_its_count() -> None:
    async def test(pool: Pool, events: Events) -> None:
        seat = pool.seats[0]
        seat.served = 10_000
        assert pool.retirement(seat, None) is None

    run_pool(test, reuse=0)


def test_a_retired_worker_is_killed_logged_and_replaced_by_a_new_generation() -> None:
    async def test(pool: Pool, events: Events) -> None:
        async with pool.checkout(1.0) as seat:
            old = seat.worker
            pool.release(seat, pool.retirement(seat, None))
            assert seat.state is SeatState.REPLACING and pool.request_capacity == 0
        await settled(pool)
        assert old is not None and old.killed
        assert seat.worker is not old and seat.generation == 2 and seat.state is SeatState.IDLE
        retired = events.named("worker_retired")
        assert [r["reason"] for r in retired] == ["request_limit"]
        assert retired[0]["pid"] == old.pid

    run_pool(test, reuse=1)


def test_a_worker_that_died_during_its_program_is_replaced_as_crashed() -> None:
    async def test(pool: Pool, events: Events) -> None:
        async with pool.checkout(1.0) as seat:
            seat.worker.die()  # type: ignore[union-attr]
            pool.release(seat, pool.retirement(seat, None))
        await settled(pool)
        assert [r["reason"] for r in events.named("worker_retired")] == ["crashed"]
        assert seat.generation == 2 and seat.state is SeatState.IDLE

    run_pool(test)


def test_an_idle_worker_that_dies_is_replaced_without_a_request() -> None:
    async def test(pool: Pool, events: Events) -> None:
        seat = pool.seats[0]
        seat.worker.die()  # type: ignore[union-attr]
        await settled(pool)
        assert seat.generation == 2 and seat.state is SeatState.IDLE

    run_pool(test)


def test_a_replacement_that_fails_to_start_is_retried_with_backoff() -> None:
    async def test(pool: Pool, events: Events) -> None:
        StandInWorker.fail_starts = 2
        async with pool.checkout(1.0) as seat:
            pool.release(seat, "crashed")
        await settled(pool)
        assert len(events.named("worker_replace_failed")) == 2
        assert seat.state is SeatState.IDLE and seat.generation == 4

    run_pool(test)


class GatedWorker(StandInWorker):
    """A stand-in whose launch waits for ``gate`` (while set): a replacement in flight."""

    gate: asyncio.Event | None = None

    async def launch(self, *, hold: bool = False, after_preload: bool = False) -> None:
        if GatedWorker.gate is not None:
            await GatedWorker.gate.wait()
        await super().launch(hold=hold, after_preload=after_preload)


async def _one_gpu_busy_the_other_replacing(pool: Pool, stack: contextlib.AsyncExitStack) -> None:
    """GPU 0: a request runs on w0 (its lease held), w1 idle; GPU 1: both workers being
    replaced (their launches wait for ``GatedWorker.gate``)."""
    seats = [await stack.enter_async_context(pool.checkout(1.0)) for _ in range(4)]
    assert [s.id for s in seats] == ["gpu0/w0", "gpu1/w0", "gpu0/w1", "gpu1/w1"]
    GatedWorker.gate = asyncio.Event()
    for seat, reason in ((seats[1], "crashed"), (seats[3], "crashed"), (seats[2], None)):
        pool.release(seat, reason)
        pool.finish_request(seat)
    await asyncio.sleep(0.01)
    assert [s.state for s in pool.seats] == [
        SeatState.BUSY,
        SeatState.IDLE,
        SeatState.REPLACING,
        SeatState.REPLACING,
    ]


def test_a_request_waits_for_a_free_gpus_new_worker_rather_than_a_busy_gpus_lease() -> None:
    async def test(pool: Pool, events: Events) -> None:
        async with contextlib.AsyncExitStack() as stack:
            await _one_gpu_busy_the_other_replacing(pool, stack)
            waiting = asyncio.ensure_future(stack.enter_async_context(pool.checkout(5.0)))
            await asyncio.sleep(0.01)
            assert not waiting.done() and pool.requests_waiting == 1
            assert GatedWorker.gate is not None
            GatedWorker.gate.set()  # GPU 1's new workers start
            seat = await waiting
            assert seat.gpu_id == 1 and pool.seats[1].state is SeatState.IDLE
            GatedWorker.gate = None

    run_pool(test, workers=2, mode="fake-gpu", gpus=2, worker=GatedWorker)


def test_a_request_waiting_for_a_new_worker_that_fails_to_start_takes_an_idle_seat() -> None:
    async def test(pool: Pool, events: Events) -> None:
        async with contextlib.AsyncExitStack() as stack:
            await _one_gpu_busy_the_other_replacing(pool, stack)
            waiting = asyncio.ensure_future(stack.enter_async_context(pool.checkout(5.0)))
            await asyncio.sleep(0.01)
            assert not waiting.done()
            StandInWorker.fail_starts = 2
            assert GatedWorker.gate is not None
            GatedWorker.gate.set()  # both fail: backing off, they are not about to be ready
            seat = await waiting
            assert seat.id == "gpu0/w1"
            GatedWorker.gate = None

    run_pool(test, workers=2, mode="fake-gpu", gpus=2, worker=GatedWorker)


def test_a_worker_serves_one_identity_and_is_replaced_for_another() -> None:
    async def test(pool: Pool, events: Events) -> None:
        async with pool.checkout(1.0) as seat:
            await pool.serve_identity(seat, "alice")
            first = seat.worker
            pool.release(seat, None)
        await settled(pool)
        async with pool.checkout(1.0) as seat:
            await pool.serve_identity(seat, "alice")
            assert seat.worker is first  # the same identity keeps its worker
            await pool.serve_identity(seat, "bob")
            assert seat.worker is not first and seat.worker.identity == "bob"  # type: ignore[union-attr]
            pool.release(seat, None)
        assert first is not None and first.killed
        assert [r["reason"] for r in events.named("worker_retired")] == ["identity"]

    run_pool(test)


def test_an_unconfirmed_kill_stops_admission_and_leaves_the_seat_quarantined() -> None:
    async def test(pool: Pool, events: Events) -> None:
        StandInWorker.unconfirmed_kill = "stand-in: 1 descendant(s) survived SIGKILL"
        async with pool.checkout(1.0) as seat:
            pool.release(seat, "timeout")
        await settled(pool)
        assert pool.quarantine_reason == "stand-in: 1 descendant(s) survived SIGKILL"
        assert not pool.accepting and pool.request_capacity == 0
        assert seat.state is SeatState.QUARANTINED
        assert len(events.named("devices_quarantined")) == 1
        with pytest.raises(NoWorker):
            async with pool.checkout(1.0):
                pass

    run_pool(test)


def test_seats_fill_from_the_least_loaded_and_the_pool_starts_without_failed_workers() -> None:
    async def test(pool: Pool, events: Events) -> None:
        assert [s.state for s in pool.seats] == [SeatState.IDLE, SeatState.IDLE]
        async with pool.checkout(1.0) as one, pool.checkout(1.0) as two:
            assert {one.id, two.id} == {"cpu/w0", "cpu/w1"}
            assert pool.busy_workers == 2 and pool.requests_in_progress == 2
            pool.release(one, None)
            pool.release(two, None)

    run_pool(test, workers=2)


# ---------------------------------------------------------------- spare workers (issue 31)


async def one_program(pool: Pool, identity: str = "alice") -> Seat:
    """Check out a seat, serve ``identity`` and hand it back as a finished program."""
    async with pool.checkout(1.0) as seat:
        await pool.serve_identity(seat, identity)
        pool.release(seat, pool.retirement(seat, None))
    await settled(pool)
    return seat


def test_a_seat_of_one_program_workers_takes_over_its_spare_after_the_old_is_gone() -> None:
    class Watch(Events):
        """At each take-over: was the worker it replaces already killed?"""

        def __init__(self) -> None:
            super().__init__()
            self.old_killed: list[bool] = []

        def emit(self, event: str, level: str = "INFO", **fields: Any) -> None:
            if event == "worker_ready" and fields.get("started_ahead"):
                self.old_killed.append(all(w.killed for w in retired))
            super().emit(event, level, **fields)

    retired: list[Any] = []
    watch = Watch()

    async def test(pool: Pool, events: Events) -> None:
        await settled(pool)
        seat = pool.seats[0]
        first, spare = seat.worker, seat.spare
        assert spare is not None and spare is not first and spare.info is not None
        for _ in range(3):
            retired.append(seat.worker)
            await one_program(pool)
            assert seat.worker is spare and seat.state is SeatState.IDLE
            assert seat.spare is not None and seat.spare is not seat.worker
            spare = seat.spare
        assert seat.generation == 4 and seat.worker.generation == 4  # type: ignore[union-attr]
        assert [r["reason"] for r in events.named("worker_retired")] == ["request_limit"] * 3

    run_pool(test, reuse=1, events=watch)
    assert watch.old_killed == [True, True, True]  # never two workers for one program


def test_only_the_workers_no_program_waits_for_are_forked_after_the_preload() -> None:
    # A seat's first worker makes the server ready: forked at once. Its spare and the one
    # forked ahead after it wait for the launcher's preload (torch), so the programs after
    # the first do not import it themselves.
    async def test(pool: Pool, events: Events) -> None:
        await settled(pool)
        seat = pool.seats[0]
        assert seat.worker is not None and seat.spare is not None
        assert seat.worker.after_preload is False
        assert seat.spare.after_preload is True
        await one_program(pool)
        assert seat.spare is not None and seat.spare.after_preload is True

    run_pool(test, reuse=1)


class PreloadingLauncherWorker(StandInWorker):
    """Forked by a launcher that preloads torch when a fork no program waits for asks it
    to (SERVER §1): a seat's spare; its fork waits for ``preload_done`` when set."""

    preload_done: ClassVar[asyncio.Event | None] = None

    async def launch(self, *, hold: bool = False, after_preload: bool = False) -> None:
        await super().launch(hold=hold, after_preload=after_preload)
        if after_preload and PreloadingLauncherWorker.preload_done is not None:
            await PreloadingLauncherWorker.preload_done.wait()
        self.process = types.SimpleNamespace(preloaded=("torch",) if after_preload else ())


def test_an_idle_first_worker_forked_before_the_preload_gives_way_to_its_preloaded_spare() -> None:
    # The notebook's first cell: it comes seconds after the server is ready, when the
    # seat's spare (forked after the preload) is ready too; it runs there, not in the first
    # worker, which would import torch itself.
    async def test(pool: Pool, events: Events) -> None:
        await settled(pool)
        seat = pool.seats[0]
        assert seat.worker is not None and seat.worker.process.preloaded == ("torch",)
        assert [r["reason"] for r in events.named("worker_retired")] == ["preload"]
        first = next(w for w in made if not w.after_preload)
        assert first.killed and seat.state is SeatState.IDLE
        assert seat.spare is not None and seat.spare.after_preload  # the next one: as before
        await one_program(pool)  # after a program, workers retire for their limit as before
        assert [r["reason"] for r in events.named("worker_retired")] == [
            "preload",
            "request_limit",
        ]

    made: list[StandInWorker] = []

    def worker(**options: Any) -> StandInWorker:
        made.append(PreloadingLauncherWorker(**options))
        return made[-1]

    PreloadingLauncherWorker.preload_done = None
    run_pool(test, reuse=1, worker=worker)  # type: ignore[arg-type]


def test_a_first_worker_that_took_a_program_or_preloaded_as_much_keeps_its_seat() -> None:
    async def busy(pool: Pool, events: Events) -> None:
        gate = PreloadingLauncherWorker.preload_done
        async with pool.checkout(1.0) as seat:  # a first cell before the preload is done
            assert seat.worker is not None and not seat.worker.after_preload
            assert gate is not None and seat.spare is None
            gate.set()
            await settled(pool)
            assert seat.spare is not None and seat.spare.process.preloaded == ("torch",)
            assert seat.state is SeatState.BUSY and not seat.worker.killed  # it runs there
            assert events.named("worker_retired") == []
            pool.release(seat, pool.retirement(seat, None))
        await settled(pool)
        assert [r["reason"] for r in events.named("worker_retired")] == ["request_limit"]

    PreloadingLauncherWorker.preload_done = asyncio.Event()  # the spare's fork waits for it
    try:
        run_pool(busy, reuse=1, worker=PreloadingLauncherWorker)
    finally:
        PreloadingLauncherWorker.preload_done = None

    async def same_preload(pool: Pool, events: Events) -> None:
        await settled(pool)  # no launcher preloaded anything: nothing to gain
        assert pool.seats[0].spare is not None and events.named("worker_retired") == []

    run_pool(same_preload, reuse=1)


def test_a_reused_worker_or_no_spare_workers_keeps_no_spare() -> None:
    async def test(pool: Pool, events: Events) -> None:
        await one_program(pool)
        assert pool.seats[0].spare is None and pool.seats[0].spare_start is None

    run_pool(test, reuse=0)
    run_pool(test, reuse=2)


def test_a_gpu_seats_spare_is_launched_ahead_but_configured_only_when_it_takes_over() -> None:
    async def test(pool: Pool, events: Events) -> None:
        await settled(pool)
        seat = pool.seats[0]
        spare = seat.spare
        assert spare is not None and spare.launches == 1 and spare.info is None  # no CUDA yet
        await one_program(pool)
        assert seat.worker is spare and spare.info is not None
        assert not spare.configured_ahead  # its program waited: it does not warm up

    run_pool(test, reuse=1, mode="fake-gpu")


def test_a_spare_lives_in_the_other_sandbox_and_serves_only_what_its_identity_allows() -> None:
    async def test(pool: Pool, events: Events) -> None:
        await settled(pool)
        seat = pool.seats[0]
        first_box = seat.sandbox
        assert first_box is not None and seat.spare_sandbox not in (None, first_box)
        await one_program(pool, "alice")  # alice ran in the first sandbox
        assert seat.sandbox is not first_box and seat.spare_sandbox is first_box
        await one_program(pool, "bob")  # a spare from a sandbox nobody used: bob's now
        assert first_box.identity == "alice" and seat.sandbox is first_box  # alice's again
        taken = seat.worker
        async with pool.checkout(1.0) as seat:
            await pool.serve_identity(seat, "bob")  # alice's HOME and caches: never bob's
            assert seat.worker is not taken and seat.worker.identity == "bob"  # type: ignore[union-attr]
            assert taken is not None and taken.killed and seat.sandbox is not first_box
            pool.release(seat, pool.retirement(seat, None))
        await settled(pool)
        retired = [r["reason"] for r in events.named("worker_retired")]
        assert retired == ["request_limit", "request_limit", "identity", "request_limit"]

    run_pool(test, reuse=1, sandbox="bubblewrap")


def test_shutdown_ends_spares_spares_still_starting_and_workers_forked_ahead() -> None:
    made: list[Any] = []
    seats: list[Seat] = []

    class Recorded(StandInWorker):
        def __init__(self, **options: Any) -> None:
            super().__init__(**options)
            made.append(self)

    async def test(pool: Pool, events: Events) -> None:
        await settled(pool)
        seats.extend(pool.seats)
        await one_program(pool)
        async with pool.checkout(1.0) as seat:
            pool.release(seat, pool.retirement(seat, None))
        await asyncio.sleep(0)  # the next spare is starting when the pool closes

    run_pool(test, reuse=1, worker=Recorded)
    assert len(made) >= 3 and all(worker.killed for worker in made)
    assert any(worker.held for worker in made)  # one was never released
    assert all(seat.spare is None and seat.held is None for seat in seats)
    assert all(seat.spare_start is None or seat.spare_start.done() for seat in seats)


def test_a_spare_that_fails_to_start_is_logged_and_the_seat_starts_a_worker_as_before() -> None:
    async def test(pool: Pool, events: Events) -> None:
        await settled(pool)
        seat = pool.seats[0]
        seat.spare.die()  # type: ignore[union-attr]
        await one_program(pool)
        assert seat.state is SeatState.IDLE and seat.worker is not None
        assert seat.worker.gone is None
        assert [r["phase"] for r in events.named("worker_failed")] == ["respawn"]

    run_pool(test, reuse=1)


# ------------------------------------------- the worker after the spare, forked ahead


def test_a_cpu_seat_forks_the_worker_after_its_spare_ahead_and_releases_it_as_the_spare() -> None:
    async def test(pool: Pool, events: Events) -> None:
        await settled(pool)
        seat = pool.seats[0]
        for _ in range(3):
            held, spare = seat.held, seat.spare
            assert held is not None and held.held and held is not spare
            assert held.seat_sandbox is seat.sandbox  # the running worker's, left alone
            assert held.released_into == [] and held.info is None
            await one_program(pool)
            assert seat.worker is spare and seat.spare is held  # no second launch for it
            assert held.launches == 1 and not held.held and held.info is not None
            assert held.configured_ahead  # configured while no program waits: it warms up
            assert held.released_into == [seat.spare_sandbox]  # emptied, then told to go
            assert held.generation == seat.generation + 1
        assert seat.held is not None and seat.held.seat_sandbox is seat.sandbox

    run_pool(test, reuse=1, sandbox="bubblewrap")


def test_a_worker_forked_ahead_that_died_while_held_is_killed_and_the_spare_launched_anew() -> None:
    async def test(pool: Pool, events: Events) -> None:
        await settled(pool)
        seat = pool.seats[0]
        held = seat.held
        assert held is not None
        held.die()
        await one_program(pool)
        assert held.killed and seat.spare is not None and seat.spare is not held
        assert seat.spare.launches == 1 and not seat.spare.held
        assert seat.state is SeatState.IDLE and seat.worker is not None

    run_pool(test, reuse=1)


def test_a_worker_forked_ahead_in_a_sandbox_closed_for_another_identity_is_killed_first() -> None:
    async def test(pool: Pool, events: Events) -> None:
        await settled(pool)
        seat = pool.seats[0]
        await one_program(pool, "alice")
        await one_program(pool, "alice")  # the seat's first sandbox serves alice again
        held = seat.held
        assert held is not None and held.seat_sandbox is seat.sandbox
        async with pool.checkout(1.0) as seat:
            await pool.serve_identity(seat, "bob")  # alice's sandbox closes
            assert held.killed and seat.held is None
            pool.release(seat, pool.retirement(seat, None))
        await settled(pool)
        assert seat.spare is not None and seat.spare is not held and not seat.spare.killed
        assert seat.held is not None and not seat.held.killed

    run_pool(test, reuse=1, sandbox="bubblewrap")


def test_a_gpu_seat_forks_nothing_ahead_of_its_spare() -> None:
    async def test(pool: Pool, events: Events) -> None:
        await settled(pool)
        await one_program(pool)
        assert pool.seats[0].spare is not None and pool.seats[0].held is None

    run_pool(test, reuse=1, mode="fake-gpu")


# ------------------------------------- a CPU seat hands over at the exit report (issue 31)


class SlowExit(StandInWorker):
    """A worker that takes its time to go once killed: it runs code on while ``runs_on`` is
    set (``procfs.exiting`` reads it), then its kill returns only once ``exited`` is set
    (the kernel tearing down a process that maps torch). Each launch records how many of
    its seat's other workers could still run code and whether one of them lived in its
    sandbox directory."""

    made: ClassVar[list[SlowExit]] = []
    slow = False  # set by a test once its pool has started
    runs_on = False  # a killed worker still runs code
    exited: asyncio.Event
    launched_beside: ClassVar[list[tuple[int, bool]]] = []

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.kill_started = False
        SlowExit.made.append(self)

    def may_run_code(self) -> bool:
        """Launched and not held (a worker forked ahead runs nothing until released), and
        not killed, or killed but still running on."""
        started = bool(self.launches) and not self.held
        return started and not self.killed and (SlowExit.runs_on or not self.kill_started)

    def begin(self) -> None:
        others = [w for w in SlowExit.made if w is not self and w.may_run_code()]
        box = self.options.get("seat_sandbox")
        shares = box is not None and any(w.options.get("seat_sandbox") is box for w in others)
        SlowExit.launched_beside.append((len(others), shares))

    async def kill(self, grace: float) -> None:
        self.kill_started = True
        if SlowExit.slow:
            await SlowExit.exited.wait()
        await super().kill(grace)


def exiting(pid: int) -> bool:
    """``procfs.exiting`` for stand-ins: a killed one runs no code unless ``runs_on``."""
    worker = next(w for w in SlowExit.made if w.pid == pid)
    return not worker.may_run_code()


async def announced_program(pool: Pool) -> Any:
    """A one-shot program whose worker's exit report was believed; the worker it ran on."""
    async with pool.checkout(1.0) as seat:
        await pool.serve_identity(seat, "alice")
        ran = seat.worker
        ran.exit_announced = True  # type: ignore[union-attr]
        pool.release(seat, pool.retirement(seat, None))
    return ran


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.002)
    raise AssertionError("the pool never got there")


@pytest.fixture
def slow_exits(monkeypatch: pytest.MonkeyPatch) -> None:
    SlowExit.made = []
    SlowExit.launched_beside = []
    SlowExit.slow = SlowExit.runs_on = False
    monkeypatch.setattr(pool_spares.procfs, "exiting", exiting)


async def slowed_seat(pool: Pool, *, runs_on: bool = True) -> Seat:
    """The pool's seat once it has settled; from then on a killed worker runs code on
    (while ``runs_on``) and its kill waits for ``SlowExit.exited``."""
    await settled(pool)
    SlowExit.exited = asyncio.Event()
    SlowExit.slow = True
    SlowExit.runs_on = runs_on
    return pool.seats[0]


def run_slow(test: Callable[[Pool, Events], Awaitable[None]], **options: Any) -> None:
    """``run_pool`` with one-shot ``SlowExit`` workers; after ``test`` (passed or failed)
    workers go at once, so the pool closes."""

    async def ending_fast(pool: Pool, events: Events) -> None:
        try:
            await test(pool, events)
        finally:
            SlowExit.slow = SlowExit.runs_on = False
            if hasattr(SlowExit, "exited"):
                SlowExit.exited.set()

    run_pool(ending_fast, reuse=1, worker=SlowExit, **options)


def spare_starting(seat: Seat) -> bool:
    started = seat.spare_start is not None and not seat.spare_start.done()
    return started or seat.spare is not None


@pytest.mark.usefixtures("slow_exits")
@pytest.mark.parametrize("sandbox", ["none", "bubblewrap"])
def test_a_cpu_seat_hands_over_at_its_exit_report_and_starts_a_spare_once_the_old_runs_no_code(
    sandbox: str,
) -> None:
    async def test(pool: Pool, events: Events) -> None:
        seat = await slowed_seat(pool)
        spare = seat.spare
        old = await announced_program(pool)
        await until(lambda: seat.worker is spare and seat.state is SeatState.IDLE)
        assert old.kill_started and not old.killed  # ready while the old one is killed
        await asyncio.sleep(0.02)
        assert not spare_starting(seat)  # the old one may still run code in its directory
        SlowExit.runs_on = False  # the kill took: the kernel tears it down from now on
        await until(lambda: seat.spare is not None)
        assert not old.killed  # the next spare started beside that teardown
        assert seat.spare.options.get("seat_sandbox") is old.options.get("seat_sandbox")  # type: ignore[union-attr]
        assert seat.spare.released_into == [old.seat_sandbox]  # type: ignore[union-attr]  # forked ahead
        SlowExit.exited.set()
        await settled(pool)
        assert old.killed and not seat.leaving
        ready = events.named("worker_ready")
        assert ready[-1]["started_ahead"] is True and ready[-1]["generation"] == 2

    run_slow(test, sandbox=sandbox)
    # every worker started beside at most one other of its seat that could run code, and
    # never in such a one's directory
    assert SlowExit.launched_beside and all(
        others <= 1 and not shares for others, shares in SlowExit.launched_beside
    )


@pytest.mark.usefixtures("slow_exits")
def test_a_seat_hands_over_again_only_once_its_last_leaving_worker_runs_no_code() -> None:
    async def test(pool: Pool, events: Events) -> None:
        seat = await slowed_seat(pool)
        first = await announced_program(pool)
        await until(lambda: seat.state is SeatState.IDLE)
        second = await announced_program(pool)  # while the first still runs code
        await asyncio.sleep(0.02)
        assert seat.state is SeatState.REPLACING and not second.kill_started
        assert [w for w in SlowExit.made if w.may_run_code()] == [first, second]
        SlowExit.runs_on = False
        await until(lambda: seat.state is SeatState.IDLE and second.kill_started)
        SlowExit.exited.set()
        await settled(pool)
        assert first.killed and second.killed and not seat.leaving

    run_slow(test)
    assert all(others <= 1 for others, _shares in SlowExit.launched_beside)


@pytest.mark.usefixtures("slow_exits")
def test_a_gpu_seat_waits_for_its_worker_to_be_gone_even_after_its_exit_report() -> None:
    async def test(pool: Pool, events: Events) -> None:
        seat = await slowed_seat(pool, runs_on=False)
        spare = seat.spare
        old = await announced_program(pool)
        await asyncio.sleep(0.02)
        assert seat.worker is not spare and seat.state is SeatState.REPLACING
        SlowExit.exited.set()  # the lease and the CUDA context wait for the exit (SERVER §5)
        await settled(pool)
        assert old.killed and seat.worker is spare

    run_slow(test, mode="fake-gpu")


@pytest.mark.usefixtures("slow_exits")
def test_shutdown_waits_for_the_kill_of_a_worker_that_handed_its_seat_over() -> None:
    async def test(pool: Pool, events: Events) -> None:
        await slowed_seat(pool, runs_on=False)
        await announced_program(pool)
        asyncio.get_running_loop().call_later(0.05, SlowExit.exited.set)

    run_slow(test)
    assert len(SlowExit.made) >= 2 and all(w.killed for w in SlowExit.made if w.launches)
