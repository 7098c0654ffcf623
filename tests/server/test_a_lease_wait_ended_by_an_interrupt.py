"""A session's interrupt ends its worker's wait for the GPUs' lease (``LeaseHolder.interrupt``,
EXTENSIONS §11): the worker is told so at once instead of a grant, its place goes to the
next waiter, and nothing stays held, also when the grant and the interrupt come in the same
tick. The real server: ``test_an_interrupt_while_a_session_waits_for_its_gpus.py``."""

from __future__ import annotations

import asyncio

from kcoral_server.gpu.lease import LeaseArbiter
from kcoral_server.gpu.worker_lease import LeaseHolder


class Worker:
    """What the holder tells one worker: grants and withdrawn waits."""

    def __init__(self) -> None:
        self.granted = 0
        self.withdrawn = 0


def holder_for(worker: Worker, arbiter: LeaseArbiter) -> LeaseHolder:
    def grant() -> None:
        worker.granted += 1

    def withdrawn() -> None:
        worker.withdrawn += 1

    holder = LeaseHolder(arbiter, [0], grant=grant, refused=print, withdrawn=withdrawn)
    holder.begin_request("r", "alice")
    return holder


async def asking(arbiter: LeaseArbiter) -> tuple[LeaseHolder, Worker]:
    worker = Worker()
    holder = holder_for(worker, arbiter)
    holder.worker_asks(lambda: False)
    await asyncio.sleep(0)
    return holder, worker


async def in_line() -> tuple[LeaseArbiter, LeaseHolder, LeaseHolder, Worker, LeaseHolder, Worker]:
    """GPU 0 held by a blocker, then two waiting in line behind it (the first is the one
    interrupted): the arbiter, the blocker, and each waiter with its worker."""
    arbiter = LeaseArbiter([0])
    blocker, _ = await asking(arbiter)
    waiting, worker = await asking(arbiter)
    behind, after = await asking(arbiter)
    return arbiter, blocker, waiting, worker, behind, after


def test_an_interrupt_ends_the_wait_at_once_and_the_next_waiter_gets_the_gpu() -> None:
    async def main() -> None:
        arbiter, blocker, waiting, worker, behind, after = await in_line()
        waiting.interrupt()
        waiting.interrupt()  # a second interrupt answers nothing more
        assert (worker.withdrawn, worker.granted) == (1, 0)
        assert not waiting.waiting and arbiter.waiting() == 1
        blocker.release()
        await asyncio.sleep(0.01)
        assert after.granted == 1 and arbiter.holds(behind, [0]) and not waiting.held

    asyncio.run(main())


def test_an_interrupt_in_the_tick_of_the_grant_gives_the_gpu_on_and_answers_once() -> None:
    async def main() -> None:
        arbiter, blocker, waiting, worker, behind, after = await in_line()
        blocker.release()  # the arbiter grants ``waiting`` now; its task has not run yet
        waiting.interrupt()
        await asyncio.sleep(0.01)
        assert (worker.withdrawn, worker.granted) == (1, 0) and not waiting.held
        assert after.granted == 1 and arbiter.holds(behind, [0])

    asyncio.run(main())


def test_an_interrupted_requests_next_ask_is_withdrawn_unqueued_and_the_next_request_waits() -> (
    None
):
    async def main() -> None:
        arbiter = LeaseArbiter([0])
        blocker, _ = await asking(arbiter)
        waiting, worker = await asking(arbiter)
        waiting.interrupt()
        waiting.worker_asks(lambda: False)  # its teardown asks again
        assert (worker.withdrawn, worker.granted) == (2, 0) and arbiter.waiting() == 0
        await asyncio.sleep(0)  # its program ends; a next one comes
        waiting.begin_request("next", "alice")
        waiting.worker_asks(lambda: False)
        await asyncio.sleep(0)
        assert waiting.waiting and arbiter.waiting() == 1
        blocker.release()
        await asyncio.sleep(0.01)
        assert worker.granted == 1 and waiting.held

    asyncio.run(main())


def test_an_interrupt_of_a_worker_holding_the_lease_keeps_it() -> None:
    async def main() -> None:
        arbiter = LeaseArbiter([0])
        holding, worker = await asking(arbiter)
        holding.interrupt()  # its program runs and takes the interrupt as KeyboardInterrupt
        assert (worker.withdrawn, worker.granted) == (0, 1) and arbiter.holds(holding, [0])

    asyncio.run(main())
