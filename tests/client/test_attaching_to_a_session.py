"""``attach_session(id)`` of both clients (EXTENSIONS §11, CLIENT_API §12): an existing
session of the caller, read from the server. ``AsyncClient`` had none: a script that
started a session with one client could not pick it up from an ``asyncio`` program. Against
a real server started with a token file as the README says, and against a malicious server
(a real Tornado server on loopback answering what the test tells it)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from server_process import client_token_file
from test_client_sessions import remember

from kcoral import AsyncClient, Client
from kcoral.client_sessions import AsyncSession
from kcoral.errors import KCoralError, ProtocolError

ALICE, BOB = "alice-attach-token-0123456789", "bob-attach-token-0123456789"
SESSION_ID = "6f1a2b3c-4d5e-4c53-9d0e-0b5c1f7e3a0d"
OTHER_ID = "0b5c1f7e-3a0d-4c53-9d0e-6f1a2b3c4d5e"


def test_an_async_client_picks_up_a_session_another_client_started(
    server_factory, tmp_path: Path
) -> None:
    tokens = client_token_file(tmp_path, f"alice {ALICE}\nbob {BOB}\n")
    server = server_factory("--auth-token-file", str(tokens))

    async def attach_and_run(session_id: str) -> tuple[AsyncSession, object, str]:
        async with AsyncClient(server.url, token=ALICE) as client:
            async with await client.attach_session(session_id) as attached:
                previous = (await attached.execute(remember(2))).results["previous"]
                state = (await attached.info())["state"]
            return attached, previous, state

    with Client(server.url, token=ALICE) as client:
        session = client.session()
        assert session.execute(remember(1)).results["previous"] is None
        attached, previous, state = asyncio.run(attach_and_run(session.id))
        assert (attached.id, previous, state) == (session.id, 1, "IDLE")
        assert attached.record["state"] == "ENDED"  # the block ended it
        with pytest.raises(KCoralError) as ended:
            session.execute(remember(3))
        assert ended.value.status_code == 410


def test_another_token_holder_cannot_attach_to_a_session(server_factory, tmp_path: Path) -> None:
    tokens = client_token_file(tmp_path, f"alice {ALICE}\nbob {BOB}\n")
    server = server_factory("--auth-token-file", str(tokens))

    async def attach_as_bob(session_id: str) -> KCoralError:
        async with AsyncClient(server.url, token=BOB) as bob:
            with pytest.raises(KCoralError) as refused:
                await bob.attach_session(session_id)
            return refused.value

    with Client(server.url, token=ALICE) as alice, alice.session() as session:
        refused = asyncio.run(attach_as_bob(session.id))
        assert refused.status_code == 404
        assert session.execute(remember(1)).status == "COMPLETED"  # alice's session lives on


@pytest.mark.parametrize("bad_id", ["../jobs", ".", "a/b", "x?y=1", "", "%2e%2e"])
def test_an_async_attach_refuses_an_id_that_is_not_one_path_segment_and_sends_nothing(
    canned_server, bad_id: str
) -> None:
    async def attach() -> None:
        async with AsyncClient(canned_server.url) as client:
            await client.attach_session(bad_id)

    with pytest.raises(ValueError, match="invalid session id"):
        asyncio.run(attach())
    assert canned_server.requests == []


def attach_both_ways(url: str) -> list[Exception]:
    """What ``attach_session(SESSION_ID)`` raises, from a ``Client`` then an ``AsyncClient``."""
    raised: list[Exception] = []
    with Client(url) as client, pytest.raises(ProtocolError) as blocking:
        client.attach_session(SESSION_ID)
    raised.append(blocking.value)

    async def attach() -> None:
        async with AsyncClient(url) as client:
            await client.attach_session(SESSION_ID)

    with pytest.raises(ProtocolError) as flavour:
        asyncio.run(attach())
    raised.append(flavour.value)
    return raised


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ([SESSION_ID], "session record: expected a JSON object"),
        ({"state": "IDLE"}, "the session record has no valid session_id: None"),
        (
            {"session_id": "../jobs/" + "x" * 28, "state": "IDLE"},
            "the session record has no valid session_id: '../jobs/xxxx",
        ),
        (
            {"session_id": OTHER_ID, "state": "IDLE"},
            f"asked for session {SESSION_ID}, the server answered the record of session {OTHER_ID}",
        ),
    ],
)
def test_a_malicious_servers_session_record_is_a_protocol_error_and_nothing_is_sent_under_it(
    canned_server, record: object, message: str
) -> None:
    # Another session's record made session.id that session's: the caller's programs, and
    # the end of its `with` block (a DELETE with the caller's token), went to a session it
    # never named.
    canned_server.add(record)
    canned_server.add(record)
    for raised in attach_both_ways(canned_server.url):
        assert str(raised).startswith(message), raised
    sent = [(request.method, request.path) for request in canned_server.requests]
    assert sent == [("GET", f"/v1/sessions/{SESSION_ID}")] * 2
