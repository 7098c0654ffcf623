"""Each stateless seat's next worker, started while its current one runs (SERVER §6).

With one fresh worker per program (``--max-requests-per-worker 1``, the default), forking
the next worker takes longer than a short program, so a seat that had to start it after
its program would keep the next request waiting. ``SpareWorkers`` starts it ahead; it takes
over once the current worker is gone (``Pool._replace``), or on a CPU seat as soon as that
worker's exit report was believed (``takes_over_early``): the old worker is then killed
beside its successor (``see_off``) and the next spare starts once it runs no more code.
On a CPU seat the worker after the spare is forked ahead too (``Seat.held``): moving into
its cgroups waits ~10 ms for the kernel, which then overlaps the running program; it waits,
running nothing, until it is released as the next spare (``_release``). A seat's first
worker, forked before its launcher's preload (SERVER §1), gives way to its spare once that
is ready if it is still idle and unused (``_gives_way``): the first program then finds
torch imported.

Who can reach what: a spare lives in the seat's other sandbox directory, never the running
program's (``Seat.spare_sandbox``; the workspace and ``/tmp`` are emptied before each fresh
worker, SERVER §14), runs nothing before it takes over, and passes ``Pool.serve_identity``
like any worker, so it serves only an identity its sandbox's HOME and caches allow. A GPU
seat's spare is launched but configured only at take-over: CUDA is initialised under the
lease then, never beside a running program (SERVER §5). A worker forked ahead lives in the
running program's sandbox directory but runs nothing and is non-dumpable until released
(``forked_worker.become_worker``): that program can kill it (it is then replaced), never
read it; the directory is emptied before its release. Each spare counts as a worker in
the default memory share (``limits.worker_seats``); shutdown kills spares
(``shutdown.close_seats``).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from kcoral_server.pool.handles import HandleMaker
from kcoral_server.pool.seat import Seat, SeatState, preloaded
from kcoral_server.pool.startup import emit_failed
from kcoral_server.processes import limits, procfs
from kcoral_server.processes.channel import WorkerGone
from kcoral_server.processes.handle import WorkerHandle
from kcoral_server.processes.launch import preload_for, workers_are_spawned
from kcoral_server.processes.start import WorkerInfo, WorkerStartError

if TYPE_CHECKING:
    from kcoral_server.pool.pool import Pool

#: how often ``see_off`` looks whether a killed worker is exiting (it is, within microseconds)
EXITING_POLL_SECONDS = 0.001


class SpareWorkers:
    """Starts and hands over the spares of one pool's seats."""

    def __init__(self, pool: Pool) -> None:
        self.handles: HandleMaker = pool.handles
        self.events = pool.events
        self.kill = pool.kill
        #: ``limits.keeps_spare_workers``: one fresh worker per program, and not turned off
        self.enabled = limits.keeps_spare_workers(pool.config)
        #: a CPU worker has nothing to initialise under a lease: configured ahead as well
        self.configure_ahead = pool.mode == "cpu"
        #: the pool still admits programs (not closing, nothing quarantined)
        self.admitting = lambda: not pool.closing and pool.quarantine_reason is None
        #: retires a seat's worker for a reason and replaces it (``Pool.schedule_replacement``)
        self.replace = pool.schedule_replacement
        #: what the fork servers import before they fork a spare (SERVER §1), said once
        self.preload = () if workers_are_spawned() else preload_for(pool.config)

    def keep(self, seat: Seat) -> None:
        """Start ``seat``'s spare in the background unless it has one (or a session holds
        the seat, or the pool stops admitting)."""
        starting = seat.spare_start is not None and not seat.spare_start.done()
        if not self.enabled or seat.pinned is not None or seat.spare is not None or starting:
            return
        if seat.departure is not None and not seat.departure.done():
            return  # its sandbox directory is the leaving worker's: ``see_off`` starts it
        if self.admitting():
            if self.preload:  # the first spare's fork server preloads now, if it has not
                self.events.emit("worker_preload_started", modules=list(self.preload))
                self.preload = ()
            seat.spare_start = asyncio.ensure_future(self._start(seat))

    async def _start(self, seat: Seat) -> None:
        held, launching = _take_held(seat)
        self._hold_next(seat)  # the one after: its fork overlaps this one's start
        released = await self._release(seat, held, launching)
        handle = released or self.handles.for_seat(seat, spare=True)
        try:
            if released is None:  # not forked ahead
                await handle.launch(after_preload=True)
            if self.configure_ahead:
                handle.configured_ahead = True  # no program waits for it: it warms up
                await handle.configure()
        except Exception as exc:  # whatever it was: logged, and the seat starts one itself
            emit_failed(self.events, seat, handle.generation, "spare", exc)
            await self.kill(handle)
            return
        if not self.admitting() or seat.state is SeatState.CLOSED:
            await self.kill(handle)
            return
        seat.spare = handle
        if _gives_way(seat, handle):
            self.replace(seat, "preload")

    def _hold_next(self, seat: Seat) -> None:
        """Fork the worker after ``seat``'s next spare ahead, on a CPU seat (``Seat.held``):
        the fork and the move into its cgroups (~10 ms waiting for the kernel) then happen
        while the current worker runs, not after it."""
        if not self.configure_ahead or seat.held is not None or not self.admitting():
            return
        if workers_are_spawned():
            return  # only a fork can wait before it runs anything
        handle = self.handles.for_seat_after_next(seat)
        if handle is not None:
            seat.held = handle
            seat.held_start = asyncio.ensure_future(handle.launch(hold=True, after_preload=True))

    async def drop_held(self, seat: Seat) -> None:
        """Kill ``seat``'s worker forked ahead, before its sandbox directory is closed (the
        seat serves another identity): the directory's fork server stops only once its last
        child is gone."""
        held, launching = _take_held(seat)
        if launching is not None:
            await asyncio.wait([launching])  # a fork in flight is not cancellable
        if held is not None:
            await self.kill(held)

    async def _release(
        self, seat: Seat, held: WorkerHandle | None, launching: asyncio.Task | None
    ) -> WorkerHandle | None:
        """``held``, the seat's worker forked ahead, as its spare-to-be: its sandbox
        directory (the one the spare must use, whose worker is gone) emptied and the worker
        told to go on. None when there is none, or it is not in that directory, or it
        failed (killed quietly: the spare is then launched as before)."""
        if held is None:
            return None
        try:
            if launching is not None:
                await asyncio.shield(launching)
            if held.seat_sandbox is not seat.spare_sandbox:
                raise WorkerStartError("its sandbox is no longer the spare's")
            await held.os_process.release(held.seat_sandbox)
        except Exception:  # any failure: killed quietly, the spare is launched as before
            await self.kill(held)
            return None
        except asyncio.CancelledError:  # shutdown: nobody else knows it any more
            if launching is not None:
                with contextlib.suppress(BaseException):
                    await launching
            await self.kill(held)
            raise
        held.generation = seat.generation + 1
        return held

    def takes_over_early(self, old: WorkerHandle) -> bool:
        """Whether ``old``'s spare may take its seat over before ``old`` is gone: on a CPU
        seat (no lease, no CUDA context to keep apart) whose worker's exit report was
        believed (``exit_report``: its descendants are dead and it calls ``os._exit``), so
        the next program need not wait the ~15 ms the kernel takes to tear it down."""
        return self.enabled and self.configure_ahead and old.exit_announced and not old.gpu_ids

    async def see_off(self, seat: Seat, old: WorkerHandle) -> None:
        """Kill ``old`` (SIGKILL at once, its end confirmed in the background, SERVER §8)
        and, once it can run no more code, start ``seat``'s next spare, which empties and
        reuses ``old``'s sandbox directory: the kernel's teardown of ``old`` (~15 ms with
        torch mapped) and the spare's fork then overlap instead of following each other."""
        kill = asyncio.ensure_future(self.kill(old))
        seat.leaving.add(kill)
        kill.add_done_callback(seat.leaving.discard)
        pid = old.pid  # None: it has no process, so nothing of it runs
        while pid is not None and not kill.done() and not procfs.exiting(pid):
            await asyncio.sleep(EXITING_POLL_SECONDS)
        seat.departure = None  # this task: ``keep`` waits for it
        self.keep(seat)

    async def take(self, seat: Seat) -> tuple[WorkerHandle, WorkerInfo] | None:
        """``seat``'s spare, ready to become its worker (its current one is gone): awaited
        while it still starts, configured now where that initialises a GPU, with the seat's
        next generation; its sandbox becomes the seat's. None when there is none or it
        fails (logged): the caller starts a worker as before."""
        if seat.spare_start is not None and not seat.spare_start.done():
            with contextlib.suppress(Exception):  # ``_start`` logs its failures itself
                await asyncio.shield(seat.spare_start)
        spare, seat.spare = seat.spare, None
        if spare is None:
            return None
        seat.sandbox, seat.spare_sandbox = seat.spare_sandbox, seat.sandbox
        seat.generation += 1
        spare.generation = seat.generation
        try:
            info = spare.info or await spare.configure()
            if spare.gone is not None:
                raise spare.gone
        except (WorkerStartError, WorkerGone, OSError) as exc:
            emit_failed(self.events, seat, seat.generation, "respawn", exc)
            await self.kill(spare)
            return None
        return spare, info


def _gives_way(seat: Seat, spare: WorkerHandle) -> bool:
    """Whether ``seat``'s worker, idle and unused, gives way to ``spare``, which its
    launcher forked after preloading more (torch, SERVER §1): a seat's first worker is
    forked before the preload so that the server is ready at once; a first program that
    comes after its spare is ready then finds torch imported instead of importing it."""
    worker = seat.worker
    if worker is None or seat.state is not SeatState.IDLE or seat.served:
        return False
    return set(preloaded(spare)) > set(preloaded(worker))


def _take_held(seat: Seat) -> tuple[WorkerHandle | None, asyncio.Task | None]:
    """``seat``'s worker forked ahead and its launch, which the seat no longer holds."""
    held, launching = seat.held, seat.held_start
    seat.held = seat.held_start = None
    return held, launching
