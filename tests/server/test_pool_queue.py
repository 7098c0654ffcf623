"""Requests waiting for a seat (server/kcoral_server/pool/queue.py, SERVER.md §4, EXTENSIONS §5)."""

from __future__ import annotations

import asyncio

import pytest
from kcoral_server.pool.queue import NoWorker, SeatQueue
from kcoral_server.pool.seat import Seat


def test_a_freed_seat_goes_to_the_oldest_waiting_request() -> None:
    async def main() -> None:
        queue = SeatQueue()
        first = asyncio.ensure_future(queue.wait(5, "first", lambda seat: None))
        second = asyncio.ensure_future(queue.wait(5, "second", lambda seat: None))
        await asyncio.sleep(0)
        assert queue.positions() == {"first": 0, "second": 1}
        seat_a, seat_b = Seat("cpu/w0", None), Seat("cpu/w1", None)
        assert queue.hand_over(seat_a) and queue.hand_over(seat_b)
        assert await first is seat_a and await second is seat_b
        assert not queue.hand_over(seat_a)  # nobody waits any more
        assert queue.waiting == 0

    asyncio.run(main())


def test_the_queue_listeners_hear_each_change() -> None:
    async def main() -> None:
        queue = SeatQueue()
        heard: list[int] = []
        queue.listeners.append(lambda: heard.append(queue.waiting))
        waiting = asyncio.ensure_future(queue.wait(5, None, lambda seat: None))
        await asyncio.sleep(0)
        queue.hand_over(Seat("cpu/w0", None))
        await waiting
        assert heard == [1, 0]

    asyncio.run(main())


def test_a_wait_that_times_out_or_is_failed_gets_no_worker() -> None:
    async def main() -> None:
        queue = SeatQueue()
        with pytest.raises(NoWorker, match="worker-wait-timeout-seconds"):
            await queue.wait(0.01, None, lambda seat: None)
        failed = asyncio.ensure_future(queue.wait(5, None, lambda seat: None))
        await asyncio.sleep(0)
        queue.fail_all("server is shutting down")
        with pytest.raises(NoWorker, match="shutting down"):
            await failed
        assert queue.waiting == 0

    asyncio.run(main())


def test_a_seat_handed_to_a_wait_cancelled_in_the_same_tick_is_never_lost() -> None:
    async def main() -> None:
        queue = SeatQueue()
        returned: list[Seat] = []
        waiting = asyncio.ensure_future(queue.wait(5, "gone", returned.append))
        await asyncio.sleep(0)
        seat = Seat("cpu/w0", None)
        queue.hand_over(seat)
        waiting.cancel()  # in the same tick as the hand-over
        try:
            got: Seat | None = await waiting
        except asyncio.CancelledError:
            got = None
        # exactly one of them has the seat: the wait that returned, or ``unused``
        assert (got is seat) != (returned == [seat])
        assert queue.positions() == {} and queue.waiting == 0

    asyncio.run(main())


def test_a_wait_cancelled_before_any_hand_over_leaves_the_queue() -> None:
    async def main() -> None:
        queue = SeatQueue()
        returned: list[Seat] = []
        waiting = asyncio.ensure_future(queue.wait(5, "gone", returned.append))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert not queue.hand_over(Seat("cpu/w0", None))  # nobody waits for it
        assert returned == [] and queue.positions() == {}

    asyncio.run(main())
