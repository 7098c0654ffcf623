"""A ``with client.session()`` block that raised, whose session's end fails too (its server
gone): the block's error is the one raised, with a note that the session was not ended.
Both flavours, through ``MockTransport``."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from kcoral import AsyncClient, Client, Program
from kcoral.connection.transport import MockTransport, Request, Response
from kcoral.errors import TransportError

URL = "http://kcoral.test"
SESSION_ID = "6f1a2b3c-4d5e-4c53-9d0e-0b5c1f7e3a0d"


def _gone_after_create(request: Request) -> Response:
    """Creates the session, then answers nothing: the server died."""
    if request.path == "/v1/sessions":
        record = {"session_id": SESSION_ID, "state": "IDLE"}
        return Response(201, {"Content-Type": "application/json"}, json.dumps(record).encode())
    raise TransportError(f"{request.method} {request.path} failed: Connection refused")


def _check(error: BaseException) -> None:
    assert isinstance(error, TransportError), error
    assert str(error).startswith(f"POST /v1/sessions/{SESSION_ID}/execute failed"), error
    if sys.version_info >= (3, 11):  # exceptions take notes from 3.11
        assert error.__notes__ == [
            f"kcoral: session {SESSION_ID} was not ended (DELETE /v1/sessions/{SESSION_ID} "
            "failed: Connection refused); if its server still runs, it ends after its idle "
            "timeout"
        ]


def test_a_sync_session_block_that_raised_raises_its_own_error_when_the_end_fails_too() -> None:
    # Before: the DELETE's TransportError replaced the execute's, and a script's last line
    # named the session's end instead of what went wrong.
    with pytest.raises(TransportError) as raised:
        with Client(URL, transport=MockTransport(_gone_after_create)) as client:
            with client.session() as session:
                session.execute(Program())
    _check(raised.value)


def test_an_async_session_block_that_raised_raises_its_own_error_when_the_end_fails_too() -> None:
    async def run() -> None:
        async with AsyncClient(URL, transport=MockTransport(_gone_after_create)) as client:
            async with client.session() as session:
                await session.execute(Program())

    with pytest.raises(TransportError) as raised:
        asyncio.run(run())
    _check(raised.value)


def test_a_session_block_that_ended_well_still_raises_a_failed_end() -> None:
    # Nothing to keep: the end's own failure is what the caller must hear.
    with pytest.raises(TransportError, match="DELETE"):
        with Client(URL, transport=MockTransport(_gone_after_create)) as client:
            with client.session():
                pass
