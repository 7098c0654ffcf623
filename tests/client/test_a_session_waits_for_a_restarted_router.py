"""A session's request answered by a restarted router's 503 ``session not found yet``
(ROUTER §13: answered before anything reached a node) is asked again, as its
``Retry-After`` says, for at most ``FIND_WAIT_SECONDS`` (EXTENSIONS §11); a wait past a
moment says so in one line; past the bound the router's own answer is raised; any other
503 is raised at once. Both flavours through ``MockTransport``; the real router's restart
is tests/router/test_a_session_right_after_a_router_restart.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest

from kcoral import AsyncClient, Client
from kcoral.client_sessions import NOT_FOUND_YET, Session
from kcoral.connection.transport import MockTransport, Request, Response
from kcoral.errors import KCoralError

URL = "http://kcoral.test"
SESSION_ID = "6f1a2b3c-4d5e-4c53-9d0e-0b5c1f7e3a0d"
RECORD = {"session_id": SESSION_ID, "owner": "default", "state": "IDLE", "programs": 0}
NOT_YET = f"{NOT_FOUND_YET}: the router started 0 s ago, and the node that holds it may not"


def refusal(kind: str, message: str, retry_after: str | None = "0") -> Response:
    headers = {"Content-Type": "application/json"}
    if retry_after is not None:
        headers["Retry-After"] = retry_after
    body = {"error": {"kind": kind, "message": message}, "request_id": "r"}
    return Response(503, headers, json.dumps(body).encode())


def server(refusals: list[Response]) -> Callable[[Request], Response]:
    """Answers the session's record, after the given refusals of its requests."""

    def answer(request: Request) -> Response:
        if request.path.startswith("/v1/sessions/") and refusals:
            return refusals.pop(0)
        status = 201 if request.path == "/v1/sessions" else 200  # created, or read
        return Response(status, {"Content-Type": "application/json"}, json.dumps(RECORD).encode())

    return answer


def session_of(transport: MockTransport) -> Session:
    return Session(Client(URL, transport=transport), RECORD)


def test_a_session_asks_again_while_the_restarted_router_has_not_found_it() -> None:
    transport = MockTransport(server([refusal("no_node", NOT_YET) for _ in range(3)]))
    session = session_of(transport)
    session.on_wait = lambda line: None
    assert session.info()["state"] == "IDLE"
    assert len(transport.requests) == 4


def test_a_wait_past_a_moment_says_what_it_waits_for_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    transport = MockTransport(server([refusal("no_node", NOT_YET, "1") for _ in range(2)]))
    session_of(transport).info()  # no on_wait: the line goes to stderr
    assert capsys.readouterr().err == (
        f"kcoral: session {SESSION_ID[:8]}: the router just started and has not found it yet "
        "(its node may be reconnecting); asking again for up to 10 s\n"
    )


def test_past_the_bound_the_routers_own_answer_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kcoral.client_sessions.FIND_WAIT_SECONDS", 0.5)
    transport = MockTransport(server([refusal("no_node", NOT_YET, "3600") for _ in range(50)]))
    session = session_of(transport)
    session.on_wait = lambda line: None
    with pytest.raises(KCoralError) as refused:
        session.info()  # a Retry-After of an hour waits no longer than the bound
    assert (refused.value.status_code, refused.value.message) == (503, NOT_YET)
    assert refused.value.retry_after == 3600
    assert len(transport.requests) == 2


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("busy", "server saturated: no worker free"),  # a node's: it may have begun the program
        ("no_node", "the router is shutting down"),
        ("no_node", "node only, which holds it, is not connected to the router"),
    ],
)
def test_any_other_503_is_raised_at_once(kind: str, message: str) -> None:
    transport = MockTransport(server([refusal(kind, message)]))
    with pytest.raises(KCoralError) as refused:
        session_of(transport).interrupt()
    assert refused.value.message == message
    assert len(transport.requests) == 1


def test_an_async_session_asks_again_too() -> None:
    transport = MockTransport(server([refusal("no_node", NOT_YET, "1") for _ in range(2)]))

    said: list[str] = []

    async def scenario() -> dict[str, object]:
        async with AsyncClient(URL, transport=transport) as client:
            session = client.session()
            session.on_wait = said.append  # before the start, as after it
            async with session:
                return await session.info()

    assert asyncio.run(scenario())["state"] == "IDLE"
    assert len(said) == 1 and said[0].startswith(f"session {SESSION_ID[:8]}: the router just")
    sent = [(request.method, request.path) for request in transport.requests]
    assert sent.count(("GET", f"/v1/sessions/{SESSION_ID}")) == 3  # twice refused, then read


def test_attaching_to_a_session_asks_again_too(capsys: pytest.CaptureFixture[str]) -> None:
    transport = MockTransport(server([refusal("no_node", NOT_YET, "1") for _ in range(2)]))
    session = Client(URL, transport=transport).attach_session(SESSION_ID)
    assert (session.id, session.record["state"]) == (SESSION_ID, "IDLE")
    assert (
        capsys.readouterr().err
        == (  # the wait passed a moment: one line says why
            f"kcoral: session {SESSION_ID[:8]}: the router just started and has not found it yet "
            "(its node may be reconnecting); asking again for up to 10 s\n"
        )
    )
    assert len(transport.requests) == 3  # twice refused, then read


def test_attaching_raises_any_other_503_at_once() -> None:
    transport = MockTransport(server([refusal("no_node", "the router is shutting down")]))
    with pytest.raises(KCoralError) as refused:
        Client(URL, transport=transport).attach_session(SESSION_ID)
    assert refused.value.message == "the router is shutting down"
    assert len(transport.requests) == 1


def test_attaching_with_an_async_client_asks_again_too(capsys: pytest.CaptureFixture[str]) -> None:
    transport = MockTransport(server([refusal("no_node", NOT_YET, "1") for _ in range(2)]))

    async def attach() -> tuple[str, object]:
        async with AsyncClient(URL, transport=transport) as client:
            session = await client.attach_session(SESSION_ID)
            return session.id, session.record["state"]

    assert asyncio.run(attach()) == (SESSION_ID, "IDLE")
    assert (
        capsys.readouterr().err
        == (  # the same one line as the blocking client's
            f"kcoral: session {SESSION_ID[:8]}: the router just started and has not found it yet "
            "(its node may be reconnecting); asking again for up to 10 s\n"
        )
    )
    assert len(transport.requests) == 3  # twice refused, then read


def test_attaching_with_an_async_client_raises_any_other_503_at_once() -> None:
    transport = MockTransport(server([refusal("no_node", "the router is shutting down")]))

    async def attach() -> None:
        async with AsyncClient(URL, transport=transport) as client:
            await client.attach_session(SESSION_ID)

    with pytest.raises(KCoralError) as refused:
        asyncio.run(attach())
    assert refused.value.message == "the router is shutting down"
    assert len(transport.requests) == 1
