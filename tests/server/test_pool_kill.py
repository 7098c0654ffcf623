"""Ending a worker under its GPUs' lease (server/kcoral_server/pool/kill.py, SERVER.md §5, §8, §11).

The attack: a worker killed without the lease could still run on a GPU that the next
program already leased, and read that program's memory."""

from __future__ import annotations

import asyncio
from typing import Any

from kcoral_server.gpu.lease import LeaseArbiter
from kcoral_server.pool.kill import kill_under_lease, quarantine_unconfirmed


class Lease:
    def __init__(self) -> None:
        self.held = False
        self.withdrawn = False
        self.released = False

    def withdraw(self) -> None:
        self.withdrawn = True

    def release(self) -> None:
        self.released = True


class Handle:
    """A worker between programs: it does not hold its GPU's lease."""

    def __init__(self, arbiter: LeaseArbiter, unconfirmed: str | None = None) -> None:
        self.arbiter = arbiter
        self.gpu_ids = [0]
        self.lease = Lease()
        self.request_id = None
        self.seat_id, self.generation, self.pid = "gpu0/w0", 1, 4242
        self.cleanup_unconfirmed = unconfirmed
        self.holder_during_kill: object | None = None

    async def kill(self, grace: float) -> None:
        self.holder_during_kill = self.arbiter.holder(0)


class Events:
    def __init__(self) -> None:
        self.records: list[tuple[str, dict[str, Any]]] = []

    def emit(self, event: str, level: str = "INFO", **fields: Any) -> None:
        self.records.append((event, fields))


def test_a_worker_is_killed_while_the_pool_holds_its_gpu_and_the_gpu_is_free_after() -> None:
    async def main() -> None:
        arbiter = LeaseArbiter([0])
        handle = Handle(arbiter)
        await kill_under_lease(handle, arbiter, grace=0.1)  # type: ignore[arg-type]
        assert handle.holder_during_kill is not None  # nobody else's program ran on it
        assert arbiter.holder(0) is None
        assert handle.lease.withdrawn and handle.lease.released

    asyncio.run(main())


def test_the_gpu_of_a_worker_whose_end_is_unconfirmed_is_never_leased_again() -> None:
    arbiter = LeaseArbiter([0])
    events = Events()
    confirmed = Handle(arbiter)
    assert not quarantine_unconfirmed(confirmed, arbiter, events)  # type: ignore[arg-type]
    assert events.records == [] and arbiter.quarantined == set()
    unconfirmed = Handle(arbiter, "process 4242 survived SIGKILL")
    assert quarantine_unconfirmed(unconfirmed, arbiter, events)  # type: ignore[arg-type]
    assert arbiter.quarantined == {0}
    ((event, fields),) = events.records
    assert event == "devices_quarantined" and fields["quarantined"] == [0]
    assert fields["error"] == "process 4242 survived SIGKILL"
