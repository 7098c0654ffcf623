"""``client.session()`` (EXTENSIONS §11): both flavours through ``MockTransport`` send the
same requests and end the session on leaving the block; then against a real server, state
survives from one ``execute`` to the next and an ended session says why."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from kcoral import AsyncClient, Client, Program
from kcoral.connection.transport import MockTransport, Request, Response
from kcoral.errors import KCoralError, ProtocolError

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


def remember(value: int) -> Program:
    """A program that stores `value` in the session namespace and returns what was there."""
    program = Program()
    module = program.upload(kind="module", source=REMEMBER, id="m")
    fn = program.get_function(module=module, name="remember", id="fn")
    program.return_(key="previous", value=program.run(fn=fn, args=[value], id="r"))
    return program


def test_against_a_real_server_state_survives_between_executes(server_factory) -> None:
    server = server_factory()
    with Client(server.url) as client:
        with client.session() as session:
            assert session.execute(remember(1)).results["previous"] is None
            assert session.execute(remember(2)).results["previous"] == 1
            assert session.submit(remember(4)).result(timeout=60).results["previous"] == 2
            assert client.attach_session(session.id).info()["programs"] == 3
        with pytest.raises(KCoralError) as ended:
            session.execute(remember(3))
        assert ended.value.status_code == 410
        assert "ended by its owner" in str(ended.value)


REMEMBER_AFTER_A_BARE_IMPORT = """
import kcoral
def remember(value):
    previous = kcoral.session.namespace.get("value")
    kcoral.session.namespace["value"] = value
    return previous
"""


def test_a_program_reaches_the_session_namespace_after_a_bare_import_kcoral(
    server_factory,
) -> None:
    # The README writes ``kcoral.session.namespace``; after ``import kcoral`` alone that was
    # an AttributeError (the package imports its submodules only when asked).
    program = Program()
    module = program.upload(kind="module", source=REMEMBER_AFTER_A_BARE_IMPORT, id="m")
    fn = program.get_function(module=module, name="remember", id="fn")
    program.return_(key="previous", value=program.run(fn=fn, args=[7], id="r"))
    with Client(server_factory().url) as client, client.session() as session:
        assert session.execute(program).results["previous"] is None
        assert session.execute(program).results["previous"] == 7


def test_against_a_real_server_the_async_flavour_keeps_state_too(server_factory) -> None:
    server = server_factory()

    async def run() -> list[object]:
        async with AsyncClient(server.url) as client:
            async with client.session() as session:
                first = await session.execute(remember(5))
                second = await session.execute(remember(6))
                job = await session.submit(remember(7))
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


SLEEP = """
import time
def sleep():
    time.sleep(60)
"""


def _sleep() -> Program:
    program = Program()
    module = program.upload(kind="module", source=SLEEP, id="m")
    fn = program.get_function(module=module, name="sleep", id="fn")
    program.run(fn=fn, args=[], id="r")
    return program


def _until_running(session, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while session.info()["state"] != "RUNNING":
        assert time.monotonic() < deadline, session.record
        time.sleep(0.05)


def test_sessions_lists_the_callers_sessions_newest_first(server_factory) -> None:
    server = server_factory("--max-sessions", "2")
    with Client(server.url) as client:
        assert client.sessions() == []
        with client.session() as first, client.session() as second:
            listed = client.sessions()
            assert [record["session_id"] for record in listed] == [second.id, first.id]
            assert all(record["state"] == "IDLE" for record in listed)
        assert {record["state"] for record in client.sessions()} == {"ENDED"}


def test_interrupt_stops_the_running_program_and_the_session_keeps_its_state(
    server_factory,
) -> None:
    server = server_factory()
    with Client(server.url) as client, client.session() as session:
        assert session.execute(remember(8)).results["previous"] is None
        assert session.interrupt()["state"] == "IDLE"  # nothing runs: answered all the same
        job = session.submit(_sleep())
        _until_running(session)
        assert session.interrupt()["session_id"] == session.id
        result = job.result(timeout=60)
        assert result.status == "FAILED" and "KeyboardInterrupt" in str(result.error)
        assert session.execute(remember(9)).results["previous"] == 8


def test_the_async_flavour_lists_and_interrupts_sessions_too(server_factory) -> None:
    server = server_factory()

    async def run() -> tuple[list[str], str, str]:
        async with AsyncClient(server.url) as client, client.session() as session:
            listed = [record["session_id"] for record in await client.sessions()]
            job = await session.submit(_sleep())
            while (await session.info())["state"] != "RUNNING":
                await asyncio.sleep(0.05)
            record = await session.interrupt()
            result = await job.result(timeout=60)
            return listed, record["session_id"], result.status

    listed, interrupted, status = asyncio.run(run())
    assert len(listed) == 1 and listed == [interrupted] and status == "FAILED"


def test_a_session_list_that_is_not_an_array_of_objects_is_refused() -> None:
    for body in ({"sessions": []}, [RECORD, "x"]):
        transport = MockTransport(lambda _request, body=body: _answer(body))
        with pytest.raises(ProtocolError, match="session list"):
            Client(URL, transport=transport).sessions()


def test_a_session_id_that_is_not_one_path_segment_is_refused_before_anything_is_sent(
    server_factory,
) -> None:
    # Before, the URL was normalized: attach_session("../jobs") read GET /v1/jobs as a
    # session record (ProtocolError), and client.job(".") read the job list as a job state.
    server = server_factory()
    with Client(server.url) as client:
        for bad_id in ("../jobs", ".", "..", "a/b", "x?y=1", "", "%2e%2e"):
            with pytest.raises(ValueError, match="invalid session id"):
                client.attach_session(bad_id)
            with pytest.raises(ValueError, match="invalid job id"):
                client.job(bad_id).status()
        with pytest.raises(TypeError, match="session_id must be a str"):
            client.attach_session(5)  # type: ignore[arg-type]


def test_an_async_session_used_before_it_started_says_so_and_sends_nothing(
    server_factory,
) -> None:
    # Before, its requests went to /v1/sessions//execute (and //jobs, /v1/sessions/ for
    # info and interrupt) and failed 'HTTP 404: not found', as if the server had lost it.
    server = server_factory()

    async def run() -> list[str]:
        messages = []
        async with AsyncClient(server.url) as client:
            session = client.session()  # started by `async with` or `await .start()`
            function = session.function()(_echo)
            calls = (
                lambda: session.execute(remember(1)),
                lambda: session.submit(remember(1)),
                session.info,
                session.interrupt,
                lambda: function.remote(1, run_async=True),
            )
            for call in calls:
                with pytest.raises(RuntimeError, match="has not started") as caught:
                    await call()
                messages.append(str(caught.value))
            assert await client.sessions() == []  # nothing reached the server
            await session.start()
            assert (await session.execute(remember(2))).status == "COMPLETED"
            await session.close()
        return messages

    assert set(asyncio.run(run())) == {
        "this AsyncSession has not started: use 'async with client.session() as session' "
        "or 'await session.start()'"
    }


def _echo(value):
    return value
