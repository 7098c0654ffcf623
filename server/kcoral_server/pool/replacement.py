"""A seat's new worker after the old one retired, crashed or failed to start: retried with
exponential back-off until one starts or the pool closes (SERVER.md §6)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from kcoral_server.pool.seat import Seat, SeatState
from kcoral_server.storage.event_log import EventLog

BACKOFF_START_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 30.0


async def start_with_backoff(
    seat: Seat,
    reason: str,
    start: Callable[[], Awaitable[bool]],
    closing: Callable[[], bool],
    events: EventLog,
) -> None:
    """``start`` a worker for ``seat`` until it succeeds (``start`` makes the seat idle),
    waiting twice as long after each failure, at most ``BACKOFF_MAX_SECONDS``; the seat is
    ``CLOSED`` when the pool closes first."""
    delay = BACKOFF_START_SECONDS
    while not closing():
        if await start():
            return
        events.emit(
            "worker_replace_failed",
            "ERROR",
            worker_id=seat.id,
            gpu_id=seat.gpu_id,
            reason=reason,
            error="worker failed to start",
        )
        # the seat stays FAILED while it backs off: no request waits for it (seat_to_take)
        await asyncio.sleep(delay)
        delay = min(delay * 2, BACKOFF_MAX_SECONDS)
    seat.state = SeatState.CLOSED
