"""``Cancellation.unless``: a request's wait that its cancel ends, and that ends with the
task waiting in it."""

from __future__ import annotations

import asyncio
import gc

import pytest
from kcoral_server.execution.control import Cancellation
from kcoral_server.execution.responses import RequestFailed


async def _forever(ended: list[str]) -> None:
    try:
        await asyncio.Event().wait()
    finally:
        ended.append("cleaned up")


def test_the_awaitable_answers_when_nothing_is_cancelled() -> None:
    async def scenario() -> int:
        async def answer() -> int:
            return 42

        return await Cancellation().unless(answer())

    assert asyncio.run(scenario()) == 42


def test_a_cancel_of_the_request_cancels_the_awaitable_and_raises_request_failed() -> None:
    ended: list[str] = []

    async def scenario() -> None:
        cancellation = Cancellation()
        asyncio.get_running_loop().call_later(0.01, cancellation.cancel, "client_cancel")
        await cancellation.unless(_forever(ended))

    with pytest.raises(RequestFailed):
        asyncio.run(scenario())
    assert ended == ["cleaned up"]


def test_cancelling_the_waiting_task_cancels_the_awaitable_before_the_wait_ends() -> None:
    ended: list[str] = []

    async def scenario() -> tuple[bool, list[str]]:
        waiting = asyncio.ensure_future(Cancellation().unless(_forever(ended)))
        await asyncio.sleep(0.01)
        waiting.cancel()
        await asyncio.wait({waiting})
        seen_at_end = list(ended)  # before the loop gets another turn
        return waiting.cancelled(), seen_at_end

    cancelled, seen_at_end = asyncio.run(scenario())
    assert cancelled
    assert seen_at_end == ["cleaned up"]


def test_an_awaitable_that_fails_while_its_waiter_is_cancelled_leaves_no_unretrieved_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def fails_when_cancelled() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise OSError("gone") from None

    async def scenario() -> None:
        waiting = asyncio.ensure_future(Cancellation().unless(fails_when_cancelled()))
        await asyncio.sleep(0.01)
        waiting.cancel()
        await asyncio.wait({waiting})

    asyncio.run(scenario())
    gc.collect()
    assert "never retrieved" not in caplog.text
