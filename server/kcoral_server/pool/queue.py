"""How a request gets a seat: at once when one is idle, else in a queue that serves the
identities waiting in turn, each one's requests first come, first served (SERVER.md §4,
EXTENSIONS §5 queue positions).

``SeatQueue`` holds the requests waiting; a seat that becomes idle goes to the oldest
request of the identity whose turn it is, and that identity's next turn comes after every
other waiting identity's. With one identity (a bare token, no token) this is the plain
first-come queue it was; with several, one token holder's burst no longer holds the others
behind it (team soak: bob's one trivial job waited 22.8 s behind 24 of alice's).
``Checkout`` is ``Pool.checkout``'s context: the seat on entry, the request counted done on
exit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from kcoral_server.execution.control import handed_over, served_in_turn
from kcoral_server.execution.responses import NO_FREE_WORKER
from kcoral_server.pool.seat import Seat, SeatState, seat_to_take

if TYPE_CHECKING:
    from kcoral_server.pool.pool import Pool


class NoWorker(Exception):
    """No worker within the wait timeout, or the server is shutting down (503 ``busy``)."""


class SeatQueue:
    """The requests waiting for a seat: per identity oldest first, the identities in turn."""

    def __init__(self) -> None:
        #: identity -> its waiting requests, oldest first; the dict's order is the turns'
        self._turns: dict[str, deque[asyncio.Future[Seat]]] = {}
        self._owners: dict[asyncio.Future[Seat], object] = {}
        #: called (no arguments) whenever the queue of waiting requests changes
        self.listeners: list[Callable[[], None]] = []

    @property
    def waiting(self) -> int:
        return sum(1 for queue in self._turns.values() for w in queue if not w.done())

    def positions(self) -> dict[object, int]:
        """Owner -> number of requests served before it (in the turns' order, as now
        known), for waits that named an owner."""
        queues = [[w for w in queue if not w.done()] for queue in self._turns.values()]
        positions: dict[object, int] = {}
        for ahead, waiter in enumerate(served_in_turn(queues)):
            owner = self._owners.get(waiter)
            if owner is not None:
                positions[owner] = ahead
        return positions

    def position_for(self, identity: str) -> int:
        """How many waiting requests would be served before a new one of ``identity``: its
        own, one of every other identity's per turn of its own, and one more of each
        identity whose turn comes before its (every one's, for an identity not waiting)."""
        mine, others, earlier = 0, [], True
        for who, queue in self._turns.items():
            waiting = sum(1 for w in queue if not w.done())
            if who == identity:
                mine, earlier = waiting, False
            else:
                others.append((waiting, earlier))
        return mine + sum(min(n, mine) + (first and n > mine) for n, first in others)

    def _changed(self) -> None:
        for listener in list(self.listeners):
            listener()

    async def wait(
        self,
        timeout: float,
        owner: object | None,
        unused: Callable[[Seat], None],
        identity: str = "",
    ) -> Seat:
        """The seat handed to this wait of ``identity``'s; ``NoWorker`` after ``timeout`` or
        when the queue is failed. Cancelling the wait leaves the queue and always raises: a
        seat handed over before the wait's task ran again goes back through ``unused`` (its
        worker took nothing)."""

        def waited() -> NoWorker:  # the flag's value too: how long it waited (team soak)
            return NoWorker(f"{NO_FREE_WORKER} ({timeout:g} s)")

        future: asyncio.Future[Seat] = asyncio.get_running_loop().create_future()
        self._turns.setdefault(identity, deque()).append(future)
        if owner is not None:
            self._owners[future] = owner
        self._changed()
        try:
            return await handed_over(future, timeout, waited, unused)
        finally:
            self._owners.pop(future, None)
            queue = self._turns.get(identity)
            if queue is not None:
                with contextlib.suppress(ValueError):
                    queue.remove(future)
                if not queue:
                    del self._turns[identity]
            self._changed()

    def serve(self, seats: list[Seat]) -> None:
        """Hand the idle seats the seat rule gives (``seat_to_take``) to the waiting requests
        in turn (``hand_over``); a seat handed over is busy from now on."""
        handed: list[Seat] = []
        while self._turns and (seat := seat_to_take(seats, handed)) is not None:
            if not self.hand_over(seat):
                return
            seat.state = SeatState.BUSY
            handed.append(seat)

    def hand_over(self, seat: Seat) -> bool:
        """Give ``seat`` to the oldest waiting request of the identity whose turn it is (that
        identity then waits for every other one's turn); False when none waits."""
        for identity, queue in list(self._turns.items()):
            while queue and queue[0].done():
                queue.popleft()
            del self._turns[identity]
            if not queue:
                continue
            waiter = queue.popleft()
            if queue:
                self._turns[identity] = queue  # its next turn: after the others'
            waiter.set_result(seat)
            return True
        return False

    def fail_all(self, why: str) -> None:
        """Every waiting request gets ``NoWorker(why)``."""
        turns, self._turns = self._turns, {}
        for queue in turns.values():
            for waiter in queue:
                if not waiter.done():
                    waiter.set_exception(NoWorker(why))


class Checkout:
    """``Pool.checkout``'s context: the seat on entry, the request counted done on exit (a
    plain class, not a generator: it is on every request's path)."""

    __slots__ = ("_identity", "_owner", "_pool", "_timeout", "_wait", "seat")

    def __init__(
        self,
        pool: Pool,
        timeout: float,
        owner: object | None,
        wait: Callable[[Awaitable[Seat]], Awaitable[Seat]] | None,
        identity: str = "",
    ) -> None:
        self._pool = pool
        self._timeout = timeout
        self._owner = owner
        self._wait = wait
        self._identity = identity
        self.seat: Seat | None = None

    async def __aenter__(self) -> Seat:
        pool = self._pool
        seat = pool.try_acquire()
        if seat is None:
            waiting = pool.acquire(self._timeout, owner=self._owner, identity=self._identity)
            seat = await (self._wait(waiting) if self._wait is not None else waiting)
        self.seat = seat
        return seat

    async def __aexit__(self, *exc_info: object) -> None:
        if self.seat is not None:
            self._pool.finish_request(self.seat)
