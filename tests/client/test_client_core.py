"""The client core through the in-memory transport, and both flavours behaving identically.

Every scenario runs once through ``Client`` and once through ``AsyncClient`` over a
``MockTransport`` scripted with the same answers; the value (or exception) and every
request sent must be equal. Decoding, negotiation, errors, checks and warnings are the
core's, so this is where they are tested; the flavours' shells meet a real server in
``tests/remote/test_client_flavours_live.py``.
"""

from __future__ import annotations

import asyncio
import json
import warnings
from collections.abc import Callable
from typing import Any

import cloudpickle
import pytest
from server_answers import REQUEST_ID, cache_miss, completed

import kcoral
from kcoral import AsyncClient, Client, Program
from kcoral.connection.transport import AsyncTransport, MockTransport, Request, Response, Transport
from kcoral.errors import KCoralError, ProtocolError, TransportError
from kcoral.protocol.multipart import boundary_from_content_type, parse_multipart

URL = "http://kcoral.test"
JOB_ID = "6f1a2b3c-4d5e-4c53-9d0e-0b5c1f7e3a0d"


def answer(body: object, status: int = 200, **headers: str) -> Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Response(status, {"Content-Type": "application/json", **headers}, data)


def error(status: int, kind: str, message: str) -> Response:
    return answer(
        {"status": "ERROR", "request_id": REQUEST_ID, "error": {"kind": kind, "message": message}},
        status,
    )


INFO = {"kcoral": kcoral.__version__, "protocol": 1, "features": ["jobs", "serialization"]}


def two_blob_program() -> Program:
    program = Program()
    program.upload(kind="bytes", value=b"first")
    program.upload(kind="bytes", value=b"second")
    return program


class Script:
    """Answers in order; a ``BaseException`` in the list is raised by the transport."""

    def __init__(self, *answers: Response | BaseException) -> None:
        self.answers = list(answers)

    def __call__(self, request: Request) -> Response:
        item = self.answers.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item


def sent(request: Request) -> tuple[Any, ...]:
    """A request as comparable data: method, path, headers and the multipart parts."""
    headers = {k: v for k, v in request.headers.items() if k != "Content-Type"}
    parts: list[tuple[str, bytes]] = []
    if request.chunks is not None:
        boundary = boundary_from_content_type(request.headers["Content-Type"])
        body = memoryview(request.body())
        parts = [(p.name, bytes(p.data)) for p in parse_multipart(body, boundary)]
        assert len(body) == request.length
    return request.method, request.path, sorted(headers.items()), parts


def outcome(value: Callable[[], Any]) -> tuple[str, Any]:
    try:
        result = value()
    except Exception as exc:
        return "raised", (type(exc), str(exc), getattr(exc, "kind", None))
    return "returned", result


def through_sync(script: Script, call: Callable[[Any], Any], **options: Any) -> tuple[Any, ...]:
    transport = MockTransport(script)
    client = Client(URL, transport=transport, **options)
    result = outcome(lambda: call(client))
    return result, [sent(r) for r in transport.requests]


def through_async(script: Script, call: Callable[[Any], Any], **options: Any) -> tuple[Any, ...]:
    transport = MockTransport(script)
    client = AsyncClient(URL, transport=transport, **options)

    async def run() -> Any:
        value = call(client)
        return await value if asyncio.iscoroutine(value) else value

    result = outcome(lambda: asyncio.run(run()))
    return result, [sent(r) for r in transport.requests]


def normalized(value: tuple[str, Any]) -> tuple[str, Any]:
    """Results compare by their fields; jobs by id and request id."""
    kind, thing = value
    if isinstance(thing, kcoral.ProgramResult):
        return kind, (repr(thing), thing.results, thing.stdout)
    if hasattr(thing, "request_id") and hasattr(thing, "id"):
        return kind, (type(thing).__name__.removeprefix("Async"), thing.id, thing.request_id)
    return kind, thing


SCENARIOS: dict[str, tuple[Callable[[], Script], Callable[[Any], Any]]] = {
    "health": (
        lambda: Script(answer({"status": "ok", "target": {"arch": "sm_90a"}})),
        lambda c: c.health(),
    ),
    "health refused": (lambda: Script(error(503, "busy", "queue full")), lambda c: c.health()),
    "health not ok": (lambda: Script(answer({"status": "starting"})), lambda c: c.health()),
    "target on a cpu server": (
        lambda: Script(answer({"status": "ok", "target": {}})),
        lambda c: c.target(),
    ),
    "no answer": (lambda: Script(TransportError("GET /health: reset")), lambda c: c.health()),
    "execute": (
        lambda: Script(answer(completed(results={"a": {"type": "integer", "value": 1}}))),
        lambda c: c.execute(Program(), timeout_seconds=30, gpu_count=2),
    ),
    "execute with cache misses": (
        lambda: Script(
            answer(cache_miss(*list(two_blob_program().blobs)[1:]), **{"X-KCoral-Node": "n-a"}),
            answer(cache_miss(*list(two_blob_program().blobs)[:1])),
            answer(completed()),
        ),
        lambda c: c.execute(two_blob_program()),
    ),
    "a third cache miss": (
        lambda: Script(*[answer(cache_miss(*two_blob_program().blobs))] * 3),
        lambda c: c.execute(two_blob_program()),
    ),
    "execute with pickle": (
        lambda: Script(answer(completed())),
        lambda c: c.execute(Program(), serialization="pickle"),
    ),
    "an unknown serialization": (
        lambda: Script(),
        lambda c: c.execute(Program(), serialization="xml"),
    ),
    "a bad gpu count": (lambda: Script(), lambda c: c.execute(Program(), gpu_count=9)),
    "not a program": (lambda: Script(), lambda c: c.execute({"instructions": []})),
    "execute refused": (
        lambda: Script(error(400, "parse", "Serialization format 'pickle' not allowed")),
        lambda c: c.execute(Program(), serialization="pickle"),
    ),
    "info": (lambda: Script(answer(INFO)), lambda c: c.info()),
    "submit": (
        lambda: Script(answer(INFO), answer({"job_id": JOB_ID, "request_id": REQUEST_ID}, 202)),
        lambda c: c.submit(Program(), serialization="pickle", output_limit_bytes=10),
    ),
    "submit without jobs": (
        lambda: Script(answer({**INFO, "features": []})),
        lambda c: c.submit(Program()),
    ),
    "submit without /v1/info": (
        lambda: Script(error(404, "not_found", "no such path")),
        lambda c: c.submit(Program()),
    ),
    "submit answered with a result": (
        lambda: Script(answer(INFO), answer(completed())),
        lambda c: c.submit(Program()),
    ),
    "jobs": (lambda: Script(answer([{"job_id": JOB_ID, "status": "QUEUED"}])), lambda c: c.jobs()),
    "jobs not a list": (lambda: Script(answer({"jobs": []})), lambda c: c.jobs()),
    "job status": (
        lambda: Script(answer({"job_id": JOB_ID, "status": "RUNNING"})),
        lambda c: c.job(JOB_ID).status(),
    ),
    "job cancel": (
        lambda: Script(answer({"job_id": JOB_ID, "status": "CANCELLED"})),
        lambda c: c.job(JOB_ID).cancel(),
    ),
    "an unknown job": (
        lambda: Script(error(404, "not_found", "no such job")),
        lambda c: c.job(JOB_ID).status(),
    ),
    "a bad job id": (lambda: Script(), lambda c: c.job("../x")),
    "plain request": (lambda: Script(answer(b"[]")), lambda c: c.request("GET", "/v1/jobs")),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_both_flavours_send_the_same_requests_and_give_the_same_answer(name: str) -> None:
    script, call = SCENARIOS[name]
    sync_result, sync_requests = through_sync(script(), call)
    async_result, async_requests = through_async(script(), call)
    if name == "plain request":  # a Response: compare its fields
        sync_result = ("returned", (sync_result[1].status, bytes(sync_result[1].data)))
        async_result = ("returned", (async_result[1].status, bytes(async_result[1].data)))
    assert normalized(sync_result) == normalized(async_result)
    assert sync_requests == async_requests


def test_the_core_builds_the_execute_request_once_and_negotiates_blobs() -> None:
    program = two_blob_program()
    first, second = program.blobs
    transport = MockTransport(
        Script(
            answer(cache_miss(second), **{"X-KCoral-Node": "node-a"}),
            answer(cache_miss(first)),
            answer(completed()),
        )
    )
    result = Client(URL, transport=transport).execute(program, serialization="json")
    assert result.completed
    attempts = [sent(r) for r in transport.requests]
    assert [[name for name, _ in a[3]] for a in attempts] == [
        ["program"],
        ["program", f"blob:{second}"],
        ["program", f"blob:{first}", f"blob:{second}"],
    ]
    programs = {a[3][0][1] for a in attempts}
    assert len(programs) == 1  # serialized once, identical bytes every attempt
    headers = [dict(a[2]) for a in attempts]
    assert [h.get("X-KCoral-Node") for h in headers] == [None, "node-a", None]
    assert all(h["X-KCoral-Serialization"] == "json" for h in headers)


def test_a_request_error_carries_its_status_kind_and_request_id() -> None:
    transport = MockTransport(Script(error(504, "timeout", "execution timed out")))
    with pytest.raises(KCoralError) as info:
        Client(URL, transport=transport).execute(Program())
    assert (info.value.status_code, info.value.kind, info.value.request_id) == (
        504,
        "timeout",
        REQUEST_ID,
    )


def test_a_broken_answer_is_a_protocol_error() -> None:
    transport = MockTransport(Script(answer(b"{not json")))
    with pytest.raises(ProtocolError):
        Client(URL, transport=transport).execute(Program())


def test_job_results_decode_as_execute_answers_for_both_flavours() -> None:
    result_body = completed(results={"a": {"type": "integer", "value": 7}})
    sync_job = Client(URL, transport=MockTransport(Script(answer(result_body)))).job(JOB_ID)
    assert sync_job.client.run_flow(sync_job.result_flow())["a"] == 7
    async_client = AsyncClient(URL, transport=MockTransport(Script(answer(result_body))))
    async_job = async_client.job(JOB_ID)
    assert asyncio.run(async_client.run_flow(async_job.result_flow()))["a"] == 7


@pytest.mark.parametrize("flavour", [Client, AsyncClient])
def test_both_flavours_check_their_arguments_alike(flavour: type) -> None:
    for bad, exception in (
        ({"base_url": 5}, TypeError),
        ({"base_url": "ftp://x"}, ValueError),
        ({"connect_timeout_seconds": 0}, ValueError),
        ({"connect_timeout_seconds": True}, ValueError),
        ({"headers": {"X-A": 1}}, TypeError),
        ({"token": 5}, TypeError),
        ({"max_connections": 0}, ValueError),
        ({"max_connections": 1.5}, TypeError),
    ):
        arguments = {"base_url": URL, **bad}
        with pytest.raises(exception):
            flavour(arguments.pop("base_url"), **arguments)


@pytest.mark.parametrize("flavour", [Client, AsyncClient])
def test_both_flavours_warn_once_on_a_server_of_another_version(flavour: type) -> None:
    transport = MockTransport(Script(answer({**INFO, "kcoral": "99.1.0"})))
    client = flavour(URL, transport=transport)

    def info() -> Any:
        value = client.info()
        return asyncio.run(value) if asyncio.iscoroutine(value) else value

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert info()["kcoral"] == "99.1.0"
        info()
    assert [w.category for w in caught] == [UserWarning]
    assert len(transport.requests) == 1


@pytest.mark.parametrize("flavour", [Client, AsyncClient])
def test_both_flavours_send_the_token_and_headers_and_never_show_them(
    flavour: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KCORAL_TOKEN", "from-env")
    client = flavour(URL, headers={"X-Request-ID": "abc"}, token="s3cret")
    assert client.headers["Authorization"] == "Bearer s3cret"
    assert client.headers["X-Request-ID"] == "abc"
    assert client.headers["User-Agent"] == f"kcoral/{kcoral.__version__}"
    assert flavour(URL).headers["Authorization"] == "Bearer from-env"
    assert "s3cret" not in repr(client)


@pytest.mark.parametrize("flavour", [Client, AsyncClient])
def test_a_token_read_with_its_newline_is_sent_without_it(
    flavour: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KCORAL_TOKEN", "from-env\r\n")
    assert flavour(URL, token=" s3cret\n").headers["Authorization"] == "Bearer s3cret"
    assert flavour(URL).headers["Authorization"] == "Bearer from-env"


@pytest.mark.parametrize("flavour", [Client, AsyncClient])
def test_a_token_no_header_can_carry_is_refused_naming_where_it_came_from_never_showing_it(
    flavour: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before, the HTTP library refused the header at the first request and printed it:
    # "Invalid header value b'Bearer s3cr\x00et'".
    for bad in ("s3cr\x00et", "s3cr et", "s3cr\u00e9t", "s3cr\net", "   "):
        with pytest.raises(ValueError, match=r"^token holds a character") as no:
            flavour(URL, token=bad)
        assert "s3cr" not in str(no.value)
    monkeypatch.setenv("KCORAL_TOKEN", "s3cr\x1bet")
    with pytest.raises(ValueError, match=r"^KCORAL_TOKEN holds a character") as no:
        flavour(URL)
    assert "s3cr" not in str(no.value)


def test_the_mock_transport_is_both_kinds_of_transport() -> None:
    transport = MockTransport(Script())
    assert isinstance(transport, Transport) and isinstance(transport, AsyncTransport)


def test_remote_functions_run_through_either_flavour_with_their_serialization() -> None:
    def double(x: int) -> int:
        return 2 * x

    for flavour in (Client, AsyncClient):
        transport = MockTransport(
            Script(answer(completed(results={"output": {"type": "integer", "value": 4}})))
        )
        function = flavour(URL, transport=transport).function()(double)
        assert function.remote(2) == 4
        (request,) = transport.requests
        assert request.headers["X-KCoral-Serialization"] == "json"


def test_a_header_named_in_another_case_replaces_the_clients_own_never_sent_twice() -> None:
    for given in ({"authorization": "Bearer other"}, {"AUTHORIZATION": "Bearer other"}):
        client = Client(URL, token="the-token", headers={**given, "user-agent": "mine/1"})
        sent = {name.lower(): value for name, value in client.headers.items()}
        assert len(sent) == len(client.headers)  # one of each name
        assert sent["authorization"] == "Bearer the-token"
        assert sent["user-agent"] == "mine/1"


def test_an_authorization_header_given_is_used_instead_of_kcoral_token(monkeypatch) -> None:
    monkeypatch.setenv("KCORAL_TOKEN", "from-the-environment")
    client = Client(URL, headers={"authorization": "Bearer written-by-the-caller"})
    assert dict(client.headers)["authorization"] == "Bearer written-by-the-caller"
    assert "Authorization" not in client.headers
    assert dict(Client(URL).headers)["Authorization"] == "Bearer from-the-environment"


def test_run_async_and_last_event_id_of_the_wrong_kind_are_refused_before_sending() -> None:
    # run_async="yes" returned a coroutine that a caller not awaiting it never ran, and
    # events(last_event_id="2") failed deep in the reading loop ("'<=' not supported").
    def double(x: int) -> int:
        return 2 * x

    transport = MockTransport(Script())
    client = Client(URL, transport=transport)
    function = client.function()(double)
    for call in (function.remote, function.execute):
        with pytest.raises(TypeError, match="run_async must be True or False, not 'yes'"):
            call(2, run_async="yes")
    job = client.job("0f2e3b4c-0000-4000-8000-000000000001")
    with pytest.raises(TypeError, match="last_event_id must be a whole number >= 0"):
        next(iter(job.events(last_event_id="2")))
    with pytest.raises(ValueError, match="last_event_id must be a whole number >= 0"):
        next(iter(job.events(last_event_id=-1)))
    assert transport.requests == []


@pytest.mark.parametrize("flavour", [kcoral.Client, kcoral.AsyncClient])
def test_a_client_refuses_to_be_pickled_saying_why_and_leaving_its_token_out(flavour) -> None:
    """A client passed to a multiprocessing pool, or found among a pickle-mode function's
    globals, failed as "cannot pickle '_thread.lock' object"."""
    import pickle

    client = flavour("http://127.0.0.1:1", token="secret-token-x")
    with pytest.raises(TypeError, match=f"a kcoral.{flavour.__name__} cannot be pickled") as no:
        pickle.dumps(client)
    assert "secret-token-x" not in str(no.value)
    with pytest.raises(TypeError, match="cannot be pickled"):
        cloudpickle.dumps(client)
