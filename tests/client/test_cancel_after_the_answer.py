"""A cancel that lands after a request's answer was read cuts nothing of the next request.

``AsyncClient`` cuts a cancelled request's connection so that the server cancels its
program (EXTENSIONS §9). A task cancelled just after its answer was read (a
``wait_for`` timeout or a ``gather`` failure in the same instant) used to cut the
connection anyway, though it was back in the keep-alive pool, where the client's next
request had already taken it: that request failed, and on a real server its program was
cancelled. Real loopback HTTP server (``canned_server``), real urllib3 pool.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from kcoral import AsyncClient
from kcoral.connection.http import HttpTransport
from kcoral.connection.transport import Request, Response, ThreadedAsyncTransport

HEALTHY = {"status": "ok"}


class _HeldAfterTheAnswer(HttpTransport):
    """Its first request reads the whole answer (the connection goes back to the pool),
    then holds its thread until ``let_go``: the task awaiting it has not seen it end."""

    def __init__(self, url: str) -> None:
        super().__init__(url, headers={}, connect_timeout_seconds=10, max_connections=1)
        self.answered = threading.Event()
        self.let_go = threading.Event()

    def handle_request(self, request: Request) -> Response:
        response = super().handle_request(request)
        if not self.answered.is_set():
            self.answered.set()
            self.let_go.wait()
        return response


def test_a_task_cancelled_after_its_answer_leaves_the_next_request_on_its_connection_alone(
    canned_server,
):
    canned_server.add(HEALTHY)
    second_may_answer = threading.Event()
    canned_server.add(HEALTHY, wait_for=second_may_answer)
    inner = _HeldAfterTheAnswer(canned_server.url)
    outcome: list[object] = []

    def second_request() -> None:
        try:
            outcome.append(inner.handle_request(Request("GET", "/health")))
        except Exception as exc:  # what the cut does to it: recorded, then asserted
            outcome.append(exc)

    async def scenario() -> None:
        transport = ThreadedAsyncTransport(inner, max_workers=2)
        async with AsyncClient(canned_server.url, transport=transport) as client:
            first = asyncio.ensure_future(client.health())
            await asyncio.to_thread(inner.answered.wait)
            # The next request takes the pooled connection and waits for its answer.
            second = threading.Thread(target=second_request)
            second.start()
            await asyncio.to_thread(canned_server.hung.wait)
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            inner.let_go.set()
            second_may_answer.set()
            await asyncio.to_thread(second.join)

    asyncio.run(scenario())
    [answer] = outcome
    assert isinstance(answer, Response), answer
    assert answer.status == 200
    first, second = canned_server.requests
    assert first.connection == second.connection  # the same pooled connection, uncut
