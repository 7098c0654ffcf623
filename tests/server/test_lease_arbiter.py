"""The lease arbiter on its own: FIFO per GPU, atomic arrival-ordered sets, history."""

from __future__ import annotations

import asyncio

import pytest
from kcoral_server.gpu.lease import GpuQuarantined, LeaseArbiter


def run(coro):
    return asyncio.run(coro)


def test_waiters_for_one_gpu_are_served_in_arrival_order() -> None:
    async def scenario() -> list[str]:
        arbiter = LeaseArbiter([0])
        order: list[str] = []
        await arbiter.acquire("a", [0], request_id="ra")

        async def take(owner: str) -> None:
            await arbiter.acquire(owner, [0], request_id=f"r{owner}")
            order.append(owner)
            arbiter.release(owner)

        tasks = [asyncio.ensure_future(take(o)) for o in ("b", "c", "d")]
        await asyncio.sleep(0)
        assert arbiter.waiting(0) == 3
        arbiter.release("a")
        await asyncio.gather(*tasks)
        return order

    assert run(scenario()) == ["b", "c", "d"]


def test_a_set_is_granted_atomically_and_younger_single_leases_wait_behind_it() -> None:
    async def scenario() -> None:
        arbiter = LeaseArbiter([0, 1])
        await arbiter.acquire("holder", [1])
        set_task = asyncio.ensure_future(arbiter.acquire("set", count=2))
        await asyncio.sleep(0)
        late = asyncio.ensure_future(arbiter.acquire("late", [0]))
        await asyncio.sleep(0)
        # GPU 0 is free, but the older set request keeps its place: nothing partial.
        assert arbiter.holder(0) is None and not set_task.done() and not late.done()
        arbiter.release("holder")
        assert await set_task == (0, 1)
        assert not late.done()
        arbiter.release("set")
        assert await late == (0,)

    run(scenario())


def test_a_set_takes_the_first_free_gpus_in_configured_order() -> None:
    async def scenario() -> tuple[int, ...]:
        arbiter = LeaseArbiter([3, 1, 2])
        await arbiter.acquire("x", [1])
        return await arbiter.acquire("set", count=2)

    assert run(scenario()) == (3, 2)


def test_a_cancelled_waiter_leaves_the_queue_and_holds_nothing() -> None:
    async def scenario() -> None:
        arbiter = LeaseArbiter([0])
        await arbiter.acquire("a", [0])
        waiter = asyncio.ensure_future(arbiter.acquire("b", [0]))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        arbiter.release("a")
        assert arbiter.holder(0) is None and arbiter.waiting() == 0

    run(scenario())


def test_history_keeps_the_last_256_holders_and_names_who_held_when() -> None:
    async def scenario() -> None:
        arbiter = LeaseArbiter([0])
        for i in range(300):
            await arbiter.acquire(i, [0], request_id=f"r{i}")
            arbiter.release(i)
        history = arbiter.history(0)
        assert len(history) == 256
        assert history[-1].request_id == "r299" and history[-1].end is not None
        record = history[10]
        assert arbiter.request_at(0, record.start) == record.request_id

    run(scenario())


def test_acquiring_a_held_gpu_again_is_reentrant() -> None:
    async def scenario() -> None:
        arbiter = LeaseArbiter([0])
        assert await arbiter.acquire("a", [0]) == (0,)
        assert await arbiter.acquire("a", [0]) == (0,)
        assert len(arbiter.history(0)) == 1

    run(scenario())


def test_a_quarantined_gpu_is_never_granted_again_and_its_waiters_are_refused() -> None:
    async def scenario() -> None:
        arbiter = LeaseArbiter([0, 1])
        await arbiter.acquire("stuck", [0])
        waiter = asyncio.ensure_future(arbiter.acquire("waiter", [0]))
        await asyncio.sleep(0)
        arbiter.quarantine([0])
        with pytest.raises(GpuQuarantined):
            await waiter
        arbiter.release("stuck")  # the holder lets go, yet nobody gets GPU 0 again
        with pytest.raises(GpuQuarantined):
            await arbiter.acquire("late", [0])
        assert await arbiter.acquire("other", [1]) == (1,)

    run(scenario())


def test_a_set_needing_a_quarantined_gpu_is_refused_and_smaller_sets_skip_it() -> None:
    async def scenario() -> None:
        arbiter = LeaseArbiter([0, 1, 2])
        await arbiter.acquire("holder", [2])
        pair = asyncio.ensure_future(arbiter.acquire("pair", count=3))
        await asyncio.sleep(0)
        arbiter.quarantine([0])
        with pytest.raises(GpuQuarantined):
            await pair
        arbiter.release("holder")
        assert sorted(await arbiter.acquire("set", count=2)) == [1, 2]

    run(scenario())


class CountingArbiter(LeaseArbiter):
    """Counts the waiters a grant's pass looks at (each is checked once for quarantine)."""

    looked_at = 0

    def _unmeetable(self, wanted: tuple[int, ...] | None, count: int) -> bool:
        self.looked_at += 1
        return super()._unmeetable(wanted, count)


def test_a_grant_stops_looking_once_every_gpu_is_held_or_blocked() -> None:
    async def scenario() -> None:
        arbiter = CountingArbiter([0, 1])
        await arbiter.acquire("first", [0])
        await arbiter.acquire("second", [1])
        waiters = [
            asyncio.ensure_future(arbiter.acquire(f"w{k}", [k % 2], identity=f"user-{k % 5}"))
            for k in range(500)
        ]
        await asyncio.sleep(0)
        arbiter.looked_at = 0
        arbiter.release("first")  # one waiter gets GPU 0; GPU 1 stays held
        assert arbiter.holder(0) == "w0"
        # the one granted, and one after it that GPU 0 blocks; not the 500 of the queue
        assert arbiter.looked_at <= 3
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)

    run(scenario())


def test_a_quarantine_refuses_every_waiter_needing_the_gpu_however_far_back() -> None:
    async def scenario() -> None:
        arbiter = LeaseArbiter([0, 1])
        await arbiter.acquire("holder", [0, 1])
        waiters = [
            asyncio.ensure_future(arbiter.acquire(f"w{k}", [k % 2], identity=f"user-{k % 3}"))
            for k in range(300)
        ]
        await asyncio.sleep(0)
        arbiter.quarantine([0])
        outcomes = await asyncio.gather(*waiters[0::2], return_exceptions=True)
        assert all(isinstance(outcome, GpuQuarantined) for outcome in outcomes)
        assert arbiter.waiting() == 150  # GPU 1's waiters, still queued behind its holder
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        assert arbiter.waiting() == 0

    run(scenario())
