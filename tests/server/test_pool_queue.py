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


def test_identities_waiting_take_turns_and_each_ones_requests_keep_their_order() -> None:
    """Team soak: bob's one job waited behind all 24 of alice's (22.8 s)."""

    async def main() -> None:
        queue = SeatQueue()
        waits = {}
        for name, identity in (("a1", "alice"), ("a2", "alice"), ("a3", "alice"), ("b1", "bob")):
            waits[name] = asyncio.ensure_future(queue.wait(5, name, lambda seat: None, identity))
        await asyncio.sleep(0)
        waits["c1"] = asyncio.ensure_future(queue.wait(5, "c1", lambda seat: None, "carol"))
        await asyncio.sleep(0)
        # in turn: alice, bob, carol, then alice's other two
        assert queue.positions() == {"a1": 0, "b1": 1, "c1": 2, "a2": 3, "a3": 4}
        # where a new request would wait, before it does (a job's first `queued` phase)
        assert [queue.position_for(who) for who in ("alice", "bob", "carol", "dan")] == [5, 4, 4, 3]
        order = []
        for index in range(5):
            seat = Seat(f"cpu/w{index}", None)
            assert queue.hand_over(seat)
            await asyncio.sleep(0)
            order += [name for name, wait in waits.items() if wait.done() and name not in order]
        assert order == ["a1", "b1", "c1", "a2", "a3"]
        assert queue.waiting == 0 and queue.positions() == {}

    asyncio.run(main())


def test_an_identity_served_goes_after_those_still_waiting() -> None:
    async def main() -> None:
        queue = SeatQueue()
        a1 = asyncio.ensure_future(queue.wait(5, "a1", lambda seat: None, "alice"))
        await asyncio.sleep(0)
        assert queue.hand_over(Seat("cpu/w0", None)) and await a1  # alice's turn is used
        a2 = asyncio.ensure_future(queue.wait(5, "a2", lambda seat: None, "alice"))
        b1 = asyncio.ensure_future(queue.wait(5, "b1", lambda seat: None, "bob"))
        await asyncio.sleep(0)
        assert queue.positions() == {"a2": 0, "b1": 1}  # alice came first this time
        b1.cancel()  # a wait that leaves takes its identity's turn with it
        await asyncio.sleep(0)
        assert queue.positions() == {"a2": 0}
        queue.hand_over(Seat("cpu/w1", None))
        assert (await a2).id == "cpu/w1"

    asyncio.run(main())
