"""Whether a worker retires after its program, and a kept worker's clean report
(server/kcoral_server/pool/retirement.py, SERVER.md §4, §6)."""

from __future__ import annotations

import asyncio
from typing import Any

from kcoral_server.pool.retirement import reason_to_retire, retirement
from kcoral_server.pool.seat import Seat
from kcoral_server.processes import ipc
from kcoral_server.processes.channel import WorkerGone


def test_the_runs_own_reason_wins_over_the_reuse_limit() -> None:
    seat = Seat("cpu/w0", None, served=1)
    assert retirement(seat, "timeout", 2) == "timeout"
    assert retirement(seat, None, 2) == "request_limit"
    assert retirement(Seat("cpu/w0", None, served=0), None, 2) is None


def test_no_limit_and_a_sessions_seat_never_retire_for_the_count() -> None:
    assert retirement(Seat("cpu/w0", None, served=10_000), None, 0) is None
    pinned = Seat("cpu/w0", None, served=5, pinned=lambda reason: None)
    assert retirement(pinned, None, 1) is None
    assert retirement(pinned, "crashed", 1) == "crashed"


class Lease:
    released = False

    def release(self) -> None:
        self.released = True


class Channel:
    def __init__(self, answer: Any) -> None:
        self.answer = answer

    async def receive(self, timeout: float | None) -> tuple[Any, list[int]]:
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer, []


class Handle:
    def __init__(self, answer: Any) -> None:
        self.channel = Channel(answer)
        self.lease = Lease()


def test_a_kept_worker_is_clean_only_when_it_says_ready() -> None:
    ready = Handle(ipc.WorkerReady(pid=1))
    assert asyncio.run(reason_to_retire(ready)) is None  # type: ignore[arg-type]
    assert ready.lease.released  # the lease it forgot after its program is freed
    gone = Handle(WorkerGone("channel closed"))
    assert asyncio.run(reason_to_retire(gone)) == "crashed"  # type: ignore[arg-type]
    talking = Handle(ipc.ProgramFinished(status="COMPLETED"))
    assert asyncio.run(reason_to_retire(talking)) == "crashed"  # type: ignore[arg-type]
    assert not talking.lease.released


def test_a_worker_that_cannot_empty_its_sandbox_retires_for_that_reason() -> None:
    retiring = Handle(ipc.WorkerRetiring(reason=ipc.SANDBOX_CLEANUP))
    assert asyncio.run(reason_to_retire(retiring)) == "sandbox_cleanup"  # type: ignore[arg-type]
    assert not retiring.lease.released  # it is retired under its lease, like a crash
    # the program runs in the worker and could send this frame: no other reason is believed
    made_up = Handle(ipc.WorkerRetiring(reason="timeout"))
    assert asyncio.run(reason_to_retire(made_up)) == "crashed"  # type: ignore[arg-type]
