"""A seat's new worker, retried with back-off (server/kcoral_server/pool/replacement.py, SERVER.md
§6)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kcoral_server.pool import replacement as pool_replacement
from kcoral_server.pool.replacement import start_with_backoff
from kcoral_server.pool.seat import Seat, SeatState


class Events:
    def __init__(self) -> None:
        self.names: list[str] = []

    def emit(self, event: str, level: str = "INFO", **fields: Any) -> None:
        self.names.append(event)


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The back-off pauses asked for (none is waited out)."""
    asked: list[float] = []

    async def pause(seconds: float) -> None:
        asked.append(seconds)

    monkeypatch.setattr(pool_replacement.asyncio, "sleep", pause)
    return asked


def test_failed_starts_are_retried_with_doubling_pauses_up_to_the_maximum(
    pauses: list[float],
) -> None:
    outcomes = iter([False] * 7 + [True])
    events = Events()
    seat = Seat("cpu/w0", None)

    async def start() -> bool:
        return next(outcomes)

    asyncio.run(start_with_backoff(seat, "crashed", start, lambda: False, events))
    assert pauses == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert events.names == ["worker_replace_failed"] * 7


def test_a_closing_pool_stops_retrying_and_closes_the_seat(pauses: list[float]) -> None:
    closing = False
    seat = Seat("cpu/w0", None)

    async def start() -> bool:
        nonlocal closing
        closing = True  # the pool closes while this start fails
        return False

    asyncio.run(start_with_backoff(seat, "timeout", start, lambda: closing, Events()))
    assert seat.state is SeatState.CLOSED
    assert pauses == [1.0]
