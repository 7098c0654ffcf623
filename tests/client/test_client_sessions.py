"""``client.session()`` (EXTENSIONS §11): both flavours through ``MockTransport`` send the
same requests and end the session on leaving the block; then against a real server, state
survives from one ``execute`` to the next and an ended session says why."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from kcoral import AsyncClient, Client, Program
from kcoral.connection.transport import MockTransport, Request, Response
from kcoral.errors import KCoralError

URL = "http://kcoral.test"
SESSION_ID = "6f1a2b3c-4d5e-4c53-9d0e-0b5c1f7e3a0d"
REQUEST_ID = "0b5c1f7e-3a0d-4c53-9d0e-6f1a2b3c4d5e"
RECORD = {"session_id": SESSION_ID, "owner": "default", "state": "IDLE", "programs": 0}


def _answer(body: object, status: int = 200) -> Response:
    return Response(status, {"Content-Type": "application/json"}, json.dumps(body).encode())


def _server(request: Request) -> Response:
    if request.path == "/v1/sessions":
        return _answer(RECORD, 201)
    if request.path == f"/v1/sessions/{SESSION_ID}/execute":
        body = {
            "status": "COMPLETED",
            "request_id": REQUEST_ID,
            "queue_ms": 0.1,
            "elapsed_ms": 1,
            "lease_wait_ms": 0.0,
            "lease_held_ms": 0.0,
            "stdout": "",
            "stderr": "",
            "stdout_truncated": False,
            "stderr_truncated": False,
            "results": {},
        }
        return _answer(body)
    return _answer({**RECORD, "state": "ENDED", "end_reason": "deleted"})


def _sent(transport: MockTransport) -> list[tuple[str, str, bytes]]:
    return [
        (r.method, r.path, r.body() if r.path == "/v1/sessions" else b"")
        for r in transport.requests
    ]


EXPECTED = [
    ("POST", "/v1/sessions", b'{"gpu_count": 1, "idle_timeout_seconds": 30}'),
    ("POST", f"/v1/sessions/{SESSION_ID}/execute", b""),
    ("DELETE", f"/v1/sessions/{SESSION_ID}", b""),
]


def test_a_sync_session_runs_programs_on_its_path_and_ends_when_the_block_ends() -> None:
    transport = MockTransport(_server)
    with Client(URL, transport=transport) as client:
        with client.session(gpu_count=1, idle_timeout=30) as session:
            assert session.id == SESSION_ID
            assert session.execute(Program()).status == "COMPLETED"
        assert session.record["state"] == "ENDED"
    assert _sent(transport) == EXPECTED


def test_an_async_session_sends_exactly_what_the_sync_one_sends() -> None:
    transport = MockTransport(_server)

    async def run() -> str:
        async with AsyncClient(URL, transport=transport) as client:
            async with client.session(gpu_count=1, idle_timeout=30) as session:
                result = await session.execute(Program())
            return result.status

    assert asyncio.run(run()) == "COMPLETED"
    assert _sent(transport) == EXPECTED


@pytest.mark.parametrize("options", [{"gpu_count": 0}, {"idle_timeout": -1}, {"gpu_count": True}])
def test_bad_session_options_are_refused_before_anything_is_sent(options: dict) -> None:
    transport = MockTransport(_server)
    with pytest.raises(ValueError):
        Client(URL, transport=transport).session(**options)
    with pytest.raises(ValueError):
        AsyncClient(URL, transport=transport).session(**options)
    assert transport.requests == []


REMEMBER = """
import kcoral.session
def remember(value):
    previous = kcoral.session.namespace.get("value")
    kcoral.session.namespace["value"] = value
    return previous
"""


def _remember(value: int) -> Program:
    program = Program()
    module = program.upload(kind="module", source=REMEMBER, id="m")
    fn = program.get_function(module=module, name="remember", id="fn")
    program.return_(key="previous", value=program.run(fn=fn, args=[value], id="r"))
    return program


def test_against_a_real_server_state_survives_between_executes(server_factory) -> None:
    server = server_factory()
    with Client(server.url) as client:
        with client.session() as session:
            assert session.execute(_remember(1)).results["previous"] is None
            assert session.execute(_remember(2)).results["previous"] == 1
            assert session.submit(_remember(4)).result(timeout=60).results["previous"] == 2
            assert client.attach_session(session.id).info()["programs"] == 3
        with pytest.raises(KCoralError) as ended:
            session.execute(_remember(3))
        assert ended.value.status_code == 410
        assert "ended by its owner" in str(ended.value)


def test_against_a_real_server_the_async_flavour_keeps_state_too(server_factory) -> None:
    server = server_factory()

    async def run() -> list[object]:
        async with AsyncClient(server.url) as client:
            async with client.session() as session:
                first = await session.execute(_remember(5))
                second = await session.execute(_remember(6))
                job = await session.submit(_remember(7))
                third = await job.result(timeout=60)
        return [first.results["previous"], second.results["previous"], third.results["previous"]]

    assert asyncio.run(run()) == [None, 5, 6]


def test_a_remote_function_of_a_session_keeps_its_state_between_calls(server_factory) -> None:
    server = server_factory()
    with Client(server.url) as client, client.session() as session:

        @session.function()
        def count() -> list[int]:
            import os

            import kcoral.session

            calls = kcoral.session.namespace.get("calls", 0) + 1
            kcoral.session.namespace["calls"] = calls
            return [calls, os.getpid()]

        answers = [count.remote(), count.remote(), count.remote()]
    assert [calls for calls, _pid in answers] == [1, 2, 3]
    assert len({pid for _calls, pid in answers}) == 1 and answers[0][1] != os.getpid()


def test_an_async_sessions_remote_function_runs_in_the_session(server_factory) -> None:
    server = server_factory()

    async def run() -> list[int]:
        async with AsyncClient(server.url) as client, client.session() as session:

            @session.function()
            def count() -> int:
                import kcoral.session

                calls = kcoral.session.namespace.get("calls", 0) + 1
                kcoral.session.namespace["calls"] = calls
                return calls

            return [await count.remote(run_async=True), await count.remote(run_async=True)]

    assert asyncio.run(run()) == [1, 2]
