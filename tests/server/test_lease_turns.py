"""Identities take turns for GPU leases (SERVER §5): one identity's queued set requests no
longer hold another's lease behind all of them (team soak on 4 fake GPUs: bob's 0.1 s job
waited 13.5 s behind nine of alice's ``--gpus 4`` jobs while its queue position said 1), and
turns go by the time each identity held the GPU lately, not by its number of grants.

The arbiter runs on a test clock: a waiter "holds" its lease for the seconds it is given by
moving that clock on, so the order of grants follows from the holds chosen, never from how
fast this machine runs. With holds of 0 every identity has held nothing, and turns go round
as they did by grants.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
from kcoral_server.gpu.lease import LeaseArbiter

FOUR = [0, 1, 2, 3]


class HoldClock:
    """Monotonic seconds that move only when a waiter holds its lease."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Queue:
    """Waiters on one arbiter; each holds its lease for the seconds it is given (on the
    test clock) once granted, and ``served`` lists the owners in the order they were
    granted. Every grant is checked exclusive: no GPU granted is held by another waiter."""

    def __init__(self, arbiter: LeaseArbiter, clock: HoldClock) -> None:
        self.arbiter = arbiter
        self.clock = clock
        self.served: list[str] = []
        self.tasks: list[asyncio.Task] = []
        self._held_by: dict[int, str] = {}

    async def add(self, owner: str, identity: str | None, hold: float = 0.0, **wanted) -> None:
        async def take() -> None:
            gpus = await self.arbiter.acquire(owner, identity=identity, request_id=owner, **wanted)
            assert not set(gpus) & set(self._held_by), f"{owner} shares {self._held_by}"
            self._held_by.update(dict.fromkeys(gpus, owner))
            self.served.append(owner)
            self.clock.now += hold
            for gpu in gpus:
                del self._held_by[gpu]
            self.arbiter.release(owner)

        self.tasks.append(asyncio.ensure_future(take()))
        await asyncio.sleep(0)  # queued now, in this order

    async def all_served(self) -> list[str]:
        await asyncio.gather(*self.tasks)
        return self.served


def still_arbiter(gpu_ids: list[int]) -> tuple[LeaseArbiter, Queue]:
    """An arbiter whose clock moves only by the holds its waiters are given."""
    clock = HoldClock()
    arbiter = LeaseArbiter(gpu_ids, clock=clock)
    return arbiter, Queue(arbiter, clock)


def test_another_identitys_single_lease_is_served_after_one_set_of_a_queued_burst() -> None:
    async def scenario() -> list[str]:
        arbiter, waiters = still_arbiter(FOUR)
        await arbiter.acquire("alice-running", count=4, identity="alice")
        for i in range(3):
            await waiters.add(f"alice-{i}", "alice", count=4)
        await waiters.add("bob", "bob", gpus=[1])
        arbiter.release("alice-running")
        return await waiters.all_served()

    # alice's next set, then bob's turn, then the rest of alice's burst
    assert asyncio.run(scenario()) == ["alice-0", "bob", "alice-1", "alice-2"]


def test_an_identity_just_served_takes_its_next_turn_after_every_other_waiting_one() -> None:
    async def scenario() -> list[str]:
        arbiter, waiters = still_arbiter([0])
        await arbiter.acquire("first", [0], identity="carol")
        for owner in ["alice-0", "alice-1", "alice-2", "bob-0", "carol-0", "bob-1"]:
            await waiters.add(owner, owner.split("-")[0], gpus=[0])
        arbiter.release("first")
        return await waiters.all_served()

    assert asyncio.run(scenario()) == ["alice-0", "bob-0", "carol-0", "alice-1", "bob-1", "alice-2"]


def test_a_set_request_is_not_starved_by_another_identitys_stream_of_single_leases() -> None:
    async def scenario() -> list[str]:
        arbiter, waiters = still_arbiter(FOUR)
        await arbiter.acquire("bob-running", [0], identity="bob")
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
        arbiter, waiters = still_arbiter([0, 1])
        await arbiter.acquire("first", count=2, identity="alice")
        await waiters.add("set", "alice", count=2)
        await waiters.add("one", "alice", gpus=[1])
        await waiters.add("zero", "alice", gpus=[0])
        arbiter.release("first")
        return await waiters.all_served()

    assert asyncio.run(scenario()) == ["set", "one", "zero"]


def test_worker_start_ups_go_first_and_take_no_turn_from_the_users() -> None:
    async def scenario() -> list[str]:
        arbiter, waiters = still_arbiter([0])
        await arbiter.acquire("first", [0], identity="alice")
        for owner, identity in [
            ("alice-0", "alice"),
            ("bob-0", "bob"),
            ("alice-1", "alice"),
            ("start-up-0", None),  # a worker's CUDA start, of no request
            ("start-up-1", None),
        ]:
            await waiters.add(owner, identity, gpus=[0])
        arbiter.release("first")
        return await waiters.all_served()

    # the start-ups move no one's turn; as one more identity they went between the users
    # (alice-0, bob-0, start-up-0, alice-1, start-up-1)
    assert asyncio.run(scenario()) == ["start-up-0", "start-up-1", "alice-0", "bob-0", "alice-1"]


def test_worker_start_ups_are_not_held_back_by_the_time_start_ups_held_before() -> None:
    async def scenario() -> list[str]:
        arbiter, waiters = still_arbiter([0])
        # a slow CUDA start-up once held the GPU 30 s: charged to "no identity", it put
        # every later start-up behind the users that held it less
        await waiters.add("slow-start-up", None, hold=30.0, gpus=[0])
        await waiters.all_served()
        await arbiter.acquire("first", [0], identity="alice")
        for owner, identity in [("alice-0", "alice"), ("bob-0", "bob"), ("start-up", None)]:
            await waiters.add(owner, identity, hold=1.0, gpus=[0])
        arbiter.release("first")
        return await waiters.all_served()

    assert asyncio.run(scenario()) == ["slow-start-up", "start-up", "alice-0", "bob-0"]


def grants_between(served: list[str], identity: str) -> list[int]:
    """How many grants others took between each two of ``identity``'s."""
    mine = [place for place, owner in enumerate(served) if owner.startswith(identity)]
    return [after - before - 1 for before, after in itertools.pairwise(mine)]


def test_an_identity_holding_long_grants_takes_no_more_gpu_time_than_one_holding_short_ones() -> (
    None
):
    async def scenario() -> list[str]:
        arbiter, waiters = still_arbiter([0])
        await arbiter.acquire("first", [0], identity="carol")
        for i in range(3):
            await waiters.add(f"alice-{i}", "alice", hold=2.0, gpus=[0])
        for i in range(450):
            await waiters.add(f"bob-{i}", "bob", hold=0.01, gpus=[0])
        arbiter.release("first")
        return await waiters.all_served()

    served = asyncio.run(scenario())
    assert served[0] == "alice-0"  # neither had held it: turn order
    # one of alice's 2 s grants is worth 200 of bob's 10 ms ones (198 once the time bob
    # takes to hold them has faded alice's a little); before, bob got 1 between two of hers
    assert [195 <= between <= 200 for between in grants_between(served, "alice")] == [True] * 2


def test_an_identity_that_held_the_gpu_for_long_is_still_served_while_another_never_pauses() -> (
    None
):
    async def scenario() -> list[str]:
        arbiter, waiters = still_arbiter([0])
        await arbiter.acquire("first", [0], identity="carol")
        await waiters.add("alice-long", "alice", hold=1000.0, gpus=[0])
        await waiters.add("alice-next", "alice", hold=1.0, gpus=[0])
        for i in range(400):
            await waiters.add(f"bob-{i}", "bob", hold=1.0, gpus=[0])
        arbiter.release("first")
        return await waiters.all_served()

    served = asyncio.run(scenario())
    # bob holding without a break never counts more than 87 s lately (1/ln 2 half-lives),
    # and alice's 1000 s halve every 60 s: below that after 212 s, so she is served after
    # about 212 of bob's 1 s grants, before his 400 grants end
    assert served[0] == "alice-long"
    assert 150 < served.index("alice-next") < 300


def test_one_identitys_waiters_keep_their_arrival_order_whatever_the_holds() -> None:
    async def scenario() -> list[str]:
        arbiter, waiters = still_arbiter([0, 1])
        await arbiter.acquire("first", count=2, identity="carol")
        await waiters.add("alice-0", "alice", hold=3.0, gpus=[0])
        await waiters.add("bob-0", "bob", hold=0.5, gpus=[0])
        await waiters.add("alice-set", "alice", hold=1.0, count=2)
        await waiters.add("bob-1", "bob", hold=0.5, gpus=[1])
        await waiters.add("alice-1", "alice", hold=0.1, gpus=[1, 0])
        await waiters.add("alice-2", "alice", hold=0.1, gpus=[0])
        arbiter.release("first")
        return await waiters.all_served()

    served = asyncio.run(scenario())
    # each of alice's waiters wants a GPU of the one before it, which it never overtakes
    assert [owner for owner in served if owner.startswith("alice")] == [
        "alice-0",
        "alice-set",
        "alice-1",
        "alice-2",
    ]
    assert [owner for owner in served if owner.startswith("bob")] == ["bob-0", "bob-1"]


@pytest.mark.parametrize(("gpu", "first"), [(0, "bob"), (1, "alice")])
def test_turns_count_the_time_held_on_the_gpu_waited_for_not_on_the_others(
    gpu: int, first: str
) -> None:
    async def scenario() -> list[str]:
        arbiter, waiters = still_arbiter([0, 1])
        await arbiter.acquire("alice-before", [0], identity="alice")
        await arbiter.acquire("bob-before", [1], identity="bob")
        waiters.clock.now += 10.0  # alice held GPU 0 for 10 s, bob GPU 1
        arbiter.release("alice-before")
        arbiter.release("bob-before")
        await arbiter.acquire("first", [gpu], identity="carol")
        await waiters.add("alice", "alice", gpus=[gpu])
        await waiters.add("bob", "bob", gpus=[gpu])
        arbiter.release("first")
        return await waiters.all_served()

    assert asyncio.run(scenario())[0] == first


def test_a_set_is_charged_its_hold_on_every_gpu_of_it() -> None:
    async def scenario() -> list[str]:
        arbiter, waiters = still_arbiter([0, 1])
        await arbiter.acquire("alice-set", count=2, identity="alice")
        waiters.clock.now += 10.0
        arbiter.release("alice-set")
        await arbiter.acquire("bob-before", [1], identity="bob")
        waiters.clock.now += 1.0
        arbiter.release("bob-before")
        await arbiter.acquire("first", count=2, identity="carol")
        await waiters.add("alice", "alice", gpus=[1])
        await waiters.add("bob", "bob", gpus=[1])
        arbiter.release("first")
        return await waiters.all_served()

    # alice's set held GPU 1 for 10 s, bob for 1 s
    assert asyncio.run(scenario()) == ["bob", "alice"]


def test_a_set_waiter_goes_after_those_that_held_the_gpus_less_than_its_identity() -> None:
    async def scenario() -> list[str]:
        arbiter, waiters = still_arbiter([0, 1])
        await arbiter.acquire("alice-before", [1], identity="alice")
        waiters.clock.now += 10.0
        arbiter.release("alice-before")
        await arbiter.acquire("first", count=2, identity="carol")
        await waiters.add("alice-set", "alice", count=2)
        await waiters.add("bob", "bob", gpus=[0])
        arbiter.release("first")
        return await waiters.all_served()

    # an "any 2" set may take either GPU: alice's 10 s on GPU 1 count against it, and bob
    # (who held neither) is served first even though he wants GPU 0 only
    assert asyncio.run(scenario()) == ["bob", "alice-set"]
