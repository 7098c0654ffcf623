"""How a request gets a seat: at once when one is idle, else in a first-come queue
(SERVER.md §4, EXTENSIONS §5 queue positions).

``SeatQueue`` holds the requests waiting; a seat that becomes idle goes to the oldest of
them. ``Checkout`` is ``Pool.checkout``'s context: the seat on entry, the request counted
done on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from kcoral_server.execution.control import handed_over
from kcoral_server.execution.responses import NO_FREE_WORKER
from kcoral_server.pool.seat import Seat

if TYPE_CHECKING:
    from kcoral_server.pool.pool import Pool


class NoWorker(Exception):
    """No worker within the wait timeout, or the server is shutting down (503 ``busy``)."""


class SeatQueue:
    """The requests waiting for a seat, oldest first."""

    def __init__(self) -> None:
        self._waiters: deque[asyncio.Future[Seat]] = deque()
        self._owners: dict[asyncio.Future[Seat], object] = {}
        #: called (no arguments) whenever the queue of waiting requests changes
        self.listeners: list[Callable[[], None]] = []

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    def positions(self) -> dict[object, int]:
        """Owner -> number of requests ahead of it, for waits that named an owner."""
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

    def _changed(self) -> None:
        for listener in list(self.listeners):
            listener()

    async def wait(
        self, timeout: float, owner: object | None, unused: Callable[[Seat], None]
    ) -> Seat:
        """The seat handed to this wait; ``NoWorker`` after ``timeout`` or when the queue
        is failed. Cancelling the wait leaves the queue and always raises: a seat handed
        over before the wait's task ran again goes back through ``unused`` (its worker took
        nothing)."""
        future: asyncio.Future[Seat] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        if owner is not None:
            self._owners[future] = owner
        self._changed()
        try:
            return await handed_over(future, timeout, lambda: NoWorker(NO_FREE_WORKER), unused)
        finally:
            self._owners.pop(future, None)
            with contextlib.suppress(ValueError):
                self._waiters.remove(future)
            self._changed()

    def hand_over(self, seat: Seat) -> bool:
        """Give ``seat`` to the oldest waiting request; False when none waits."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(seat)
                return True
        return False

    def fail_all(self, why: str) -> None:
        """Every waiting request gets ``NoWorker(why)``."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(NoWorker(why))


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
