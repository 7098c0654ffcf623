"""Identities take turns for GPU leases (SERVER §5), as they do for seats (SERVER §4): one
identity's queued set requests no longer hold another's lease behind all of them. Team
soak on 4 fake GPUs: bob's 0.1 s job waited 13.5 s behind nine of alice's ``--gpus 4`` jobs
while its queue position said 1."""

from __future__ import annotations

import asyncio

from kcoral_server.gpu.lease import LeaseArbiter

FOUR = [0, 1, 2, 3]


class Queue:
    """Waiters on one arbiter; each gives its lease back as soon as it is granted, and
    ``served`` lists the owners in the order they were granted."""

    def __init__(self, arbiter: LeaseArbiter) -> None:
        self.arbiter = arbiter
        self.served: list[str] = []
        self.tasks: list[asyncio.Task] = []

    async def add(self, owner: str, identity: str | None, **wanted) -> None:
        async def take() -> None:
            await self.arbiter.acquire(owner, identity=identity, request_id=owner, **wanted)
            self.served.append(owner)
            self.arbiter.release(owner)

        self.tasks.append(asyncio.ensure_future(take()))
        await asyncio.sleep(0)  # queued now, in this order

    async def all_served(self) -> list[str]:
        await asyncio.gather(*self.tasks)
        return self.served


def test_another_identitys_single_lease_is_served_after_one_set_of_a_queued_burst() -> None:
    async def scenario() -> list[str]:
        arbiter = LeaseArbiter(FOUR)
        await arbiter.acquire("alice-running", count=4, identity="alice")
        waiters = Queue(arbiter)
        for i in range(3):
            await waiters.add(f"alice-{i}", "alice", count=4)
        await waiters.add("bob", "bob", gpus=[1])
        arbiter.release("alice-running")
        return await waiters.all_served()

    # alice's next set, then bob's turn, then the rest of alice's burst
    assert asyncio.run(scenario()) == ["alice-0", "bob", "alice-1", "alice-2"]


def test_an_identity_just_served_takes_its_next_turn_after_every_other_waiting_one() -> None:
    async def scenario() -> list[str]:
        arbiter = LeaseArbiter([0])
        await arbiter.acquire("first", [0], identity="carol")
        waiters = Queue(arbiter)
        for owner in ["alice-0", "alice-1", "alice-2", "bob-0", "carol-0", "bob-1"]:
            await waiters.add(owner, owner.split("-")[0], gpus=[0])
        arbiter.release("first")
        return await waiters.all_served()

    assert asyncio.run(scenario()) == ["alice-0", "bob-0", "carol-0", "alice-1", "bob-1", "alice-2"]


def test_a_set_request_is_not_starved_by_another_identitys_stream_of_single_leases() -> None:
    async def scenario() -> list[str]:
        arbiter = LeaseArbiter(FOUR)
        await arbiter.acquire("bob-running", [0], identity="bob")
        waiters = Queue(arbiter)
        await waiters.add("alice-set", "alice", count=4)
        for i in range(8):
            await waiters.add(f"bob-{i}", "bob", gpus=[i % 4])
        arbiter.release("bob-running")
        return await waiters.all_served()

    served = asyncio.run(scenario())
    # GPUs 1-3 were free all along: the set still came before every single lease queued
    # after it
    assert served[0] == "alice-set"


def test_one_identitys_waiters_are_served_in_arrival_order() -> None:
    async def scenario() -> list[str]:
        arbiter = LeaseArbiter([0, 1])
        await arbiter.acquire("first", count=2, identity="alice")
        waiters = Queue(arbiter)
        await waiters.add("set", "alice", count=2)
        await waiters.add("one", "alice", gpus=[1])
        await waiters.add("zero", "alice", gpus=[0])
        arbiter.release("first")
        return await waiters.all_served()

    assert asyncio.run(scenario()) == ["set", "one", "zero"]


def test_worker_start_ups_take_turns_as_one_more_identity() -> None:
    async def scenario() -> list[str]:
        arbiter = LeaseArbiter([0])
        await arbiter.acquire("first", [0], identity="alice")
        waiters = Queue(arbiter)
        for owner, identity in [
            ("alice-0", "alice"),
            ("alice-1", "alice"),
            ("start-up-0", None),  # a worker's CUDA start, of no request
            ("start-up-1", None),
        ]:
            await waiters.add(owner, identity, gpus=[0])
        arbiter.release("first")
        return await waiters.all_served()

    assert asyncio.run(scenario()) == ["alice-0", "start-up-0", "alice-1", "start-up-1"]
