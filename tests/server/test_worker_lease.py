"""A worker's lease as the front-end holds it (``kcoral_server.gpu.worker_lease``): granted at
once on a CPU, queued at the arbiter on a GPU, refused under a quarantine, GPU sets, and
the request's lease clock. The real workers asking for it: ``test_leases.py``."""

from __future__ import annotations

import asyncio

import pytest
from kcoral_server.gpu.lease import GpuQuarantined, LeaseArbiter
from kcoral_server.gpu.worker_lease import LeaseHolder
from kcoral_server.processes.handle import startup_reply


class Worker:
    """What the holder tells the worker: grants, and a refusal."""

    def __init__(self) -> None:
        self.granted = 0
        self.refused: list[str] = []
        self.gone = False


def holder_for(worker: Worker, arbiter: LeaseArbiter | None, gpus: list[int]) -> LeaseHolder:
    def grant() -> None:
        worker.granted += 1

    return LeaseHolder(arbiter, gpus, grant=grant, refused=worker.refused.append)


async def waiting_behind_another() -> tuple[LeaseArbiter, LeaseHolder, Worker, LeaseHolder]:
    """GPU 0 held by one holder, and a worker whose holder asked for it next: the arbiter,
    the blocker, and the waiting worker with its holder."""
    arbiter = LeaseArbiter([0])
    blocker = holder_for(Worker(), arbiter, [0])
    blocker.worker_asks(lambda: False)
    await asyncio.sleep(0)
    worker = Worker()
    holder = holder_for(worker, arbiter, [0])
    holder.worker_asks(lambda: worker.gone)
    return arbiter, blocker, worker, holder


def test_a_worker_without_gpus_is_granted_at_once() -> None:
    async def main() -> None:
        worker = Worker()
        holder = holder_for(worker, None, [])
        holder.worker_asks(lambda: worker.gone)
        assert worker.granted == 1 and not holder.held and not holder.waiting

    asyncio.run(main())


def test_a_gpu_worker_waits_for_the_holder_before_it_and_its_wait_is_timed() -> None:
    async def main() -> None:
        arbiter = LeaseArbiter([0])
        first, second = Worker(), Worker()
        one, two = holder_for(first, arbiter, [0]), holder_for(second, arbiter, [0])
        phases: list[str] = []
        two.observe(phases.append)
        for holder, worker in ((one, first), (two, second)):
            holder.begin_request(f"r-{id(holder)}")
            holder.worker_asks(lambda worker=worker: worker.gone)
        await asyncio.sleep(0.01)
        assert (first.granted, second.granted) == (1, 0) and one.held and two.waiting
        one.release()
        await asyncio.sleep(0.01)
        assert second.granted == 1 and two.held and not one.held
        assert phases == ["lease_wait", "lease_held"]
        wait, held = two.end_request()
        assert wait > 0 and held >= 0
        two.release()
        assert arbiter.holder(0) is None

    asyncio.run(main())


def test_a_worker_that_is_gone_when_granted_keeps_the_lease_unanswered() -> None:
    async def main() -> None:
        arbiter, blocker, worker, holder = await waiting_behind_another()
        worker.gone = True
        blocker.release()
        await asyncio.sleep(0.01)
        assert holder.held and worker.granted == 0  # whoever cleans up releases it
        holder.release()
        assert arbiter.holder(0) is None

    asyncio.run(main())


def test_a_quarantined_gpu_refuses_the_waiting_worker() -> None:
    async def main() -> None:
        arbiter, _blocker, worker, holder = await waiting_behind_another()
        await asyncio.sleep(0)
        arbiter.quarantine([0])
        await asyncio.sleep(0.01)
        assert holder.quarantined and len(worker.refused) == 1 and worker.granted == 0

    asyncio.run(main())


def test_a_gpu_set_becomes_the_holders_gpus_and_a_cancelled_wait_leaves_nothing() -> None:
    async def main() -> None:
        arbiter = LeaseArbiter([0, 1, 2])
        holder = holder_for(Worker(), arbiter, [])
        assert await holder.take_set(2, "set") == [0, 1]
        assert holder.gpu_ids == [0, 1] and holder.held and arbiter.holds(holder, [0, 1])
        other = holder_for(Worker(), arbiter, [])
        waiting = asyncio.ensure_future(other.take_set(2, "later"))
        await asyncio.sleep(0.01)
        assert arbiter.waiting() == 1
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert arbiter.waiting() == 0 and not other.held
        holder.release()
        arbiter.quarantine([0, 1])
        with pytest.raises(GpuQuarantined):
            await holder_for(Worker(), arbiter, []).take_set(2, "too many")

    asyncio.run(main())


class ReplyLater:
    """A worker channel whose ``WorkerReady`` comes when the test says (``reply``)."""

    def __init__(self) -> None:
        self.ready: asyncio.Future[tuple[str, list[int]]] = asyncio.Future()

    async def receive(self, timeout: float | None) -> tuple[str, list[int]]:
        return await asyncio.wait_for(asyncio.shield(self.ready), timeout)


def test_a_start_up_waiting_for_a_busy_gpus_lease_does_not_time_out_for_that_wait() -> None:
    async def main() -> None:
        arbiter = LeaseArbiter([0])
        busy, starting = Worker(), Worker()
        program = holder_for(busy, arbiter, [0])
        program.worker_asks(lambda: busy.gone)  # another worker's program holds GPU 0
        new = holder_for(starting, arbiter, [0])
        channel = ReplyLater()
        reply = asyncio.ensure_future(startup_reply(channel, new, timeout=0.2))  # type: ignore[arg-type]
        new.worker_asks(lambda: starting.gone)  # its CUDA initialisation asks for the lease
        await asyncio.sleep(0.6)  # three start-up timeouts, all of them spent waiting
        assert not reply.done() and new.waiting
        program.release()
        await asyncio.sleep(0.01)
        assert starting.granted == 1
        channel.ready.set_result(("ready", []))
        assert await reply == ("ready", [])

    asyncio.run(main())


def test_a_start_up_that_does_not_wait_for_the_lease_still_times_out() -> None:
    async def main() -> None:
        holder = holder_for(Worker(), LeaseArbiter([0]), [0])
        with pytest.raises(TimeoutError):
            await startup_reply(ReplyLater(), holder, timeout=0.05)  # type: ignore[arg-type]

    asyncio.run(main())
