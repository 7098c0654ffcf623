"""Closing a pool: replacements and spare starts cancelled, the kills of workers that
handed their seats over at their exit report awaited, then every worker stopped
politely within the time left, else killed under its lease (spares and workers forked
ahead, which ran no program, are killed), then the seats' sandboxes closed (SERVER.md
§12)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from kcoral_server.pool.seat import Seat, SeatState
from kcoral_server.processes.handle import WorkerHandle


async def close_seats(
    seats: list[Seat],
    timeout: float,
    stop: Callable[[WorkerHandle, float], Awaitable[bool]],
    kill: Callable[[WorkerHandle], Awaitable[None]],
) -> None:
    """Close every seat within about ``timeout`` seconds: ``stop`` (polite, given the time
    left) each live worker, ``kill`` those that do not exit and those already gone."""
    sandboxes = [
        box for seat in seats for box in (seat.sandbox, seat.spare_sandbox) if box is not None
    ]
    for box in sandboxes:  # a preload under way ends now; the forks waiting for it fail
        box.abandon()
    replacing = [
        task
        for seat in seats
        for task in (seat.replacement, seat.spare_start, seat.held_start)
        if task is not None and not task.done()
    ]
    for task in replacing:
        task.cancel()
    # a worker that handed its seat over at its exit report is being killed: let that end
    leaving = [
        task
        for seat in seats
        for task in (seat.departure, *seat.leaving)
        if task is not None and not task.done()
    ]
    deadline = time.monotonic() + timeout
    if replacing or leaving:  # a cancelled start cleans up after itself (processes, dirs)
        await asyncio.wait([*replacing, *leaving], timeout=timeout)

    async def close_seat(seat: Seat) -> None:
        handle = seat.worker
        seat.state = SeatState.CLOSED
        spare, seat.spare = seat.spare, None
        held, seat.held = seat.held, None
        # The seat's worker first: it may still hold its GPU's lease (one that retired as
        # the drain began, whose spare never took over), and a spare is killed under that
        # lease. Killing the spare first waited for the lease for ever (fleet soak).
        if handle is not None:
            await close_worker(handle)
        for waiting in (spare, held):
            if waiting is not None:  # it ran no program: nothing to wait for
                await kill(waiting)

    async def close_worker(handle: WorkerHandle) -> None:
        if handle.gone is None:
            remaining = max(0.1, deadline - time.monotonic())
            if await stop(handle, remaining):
                return
        await kill(handle)

    await asyncio.gather(*(close_seat(seat) for seat in seats), return_exceptions=True)
    if sandboxes:  # their fork servers exit now that their workers have
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(None, box.close) for box in sandboxes))
