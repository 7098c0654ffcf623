"""Selectors on the client (EXTENSIONS §14, CLIENT_API §2.1): ``select=`` of ``execute``,
``submit``, ``session`` and remote functions in both flavours, through the in-memory
transport. The selector travels in ``X-KCoral-Select`` on every attempt (a cache-miss retry
too, next to the ``X-KCoral-Node`` echo), a malformed one raises before anything is sent,
and ``ProgramResult.node`` is the answer's ``X-KCoral-Node``. The same rules against a real
router and a real server: ``tests/router/test_router_selectors.py`` and
``tests/server/test_server_selectors.py``."""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

import pytest
from server_answers import REQUEST_ID, cache_miss, completed

import kcoral
from kcoral import AsyncClient, Client, Program
from kcoral.connection.transport import MockTransport, Request, Response
from kcoral.protocol.selector import SelectorError

URL = "http://kcoral.test"
SESSION_ID = "6f1a2b3c-4d5e-4c53-9d0e-0b5c1f7e3a0d"
INFO = {"kcoral": kcoral.__version__, "protocol": 1, "features": ["jobs", "sessions"]}


def answer(body: object, status: int = 200, **headers: str) -> Response:
    return Response(
        status, {"Content-Type": "application/json", **headers}, json.dumps(body).encode()
    )


def blob_program() -> Program:
    program = Program()
    program.upload(kind="bytes", value=b"a blob the server lacks")
    return program


def digest() -> str:
    return hashlib.sha256(b"a blob the server lacks").hexdigest()


class Script:
    def __init__(self, *answers: Response) -> None:
        self.answers = list(answers)

    def __call__(self, request: Request) -> Response:
        return self.answers.pop(0)


def select_headers(transport: MockTransport) -> list[str | None]:
    return [r.headers.get("X-KCoral-Select") for r in transport.requests]


@pytest.mark.parametrize("select", [{"pool": "big", "gpu": "h100"}, "gpu=h100, pool=big"])
def test_a_selector_goes_on_every_attempt_of_a_cache_miss_retry_in_its_canonical_form(
    select: Any,
) -> None:
    transport = MockTransport(
        Script(
            answer(cache_miss(digest()), **{"X-KCoral-Node": "n-1"}),
            answer(completed(), **{"X-KCoral-Node": "n-1"}),
        )
    )
    result = Client(URL, transport=transport).execute(blob_program(), select=select)
    assert select_headers(transport) == ["gpu=h100,pool=big", "gpu=h100,pool=big"]
    assert transport.requests[1].headers["X-KCoral-Node"] == "n-1"  # the echo goes along
    assert result.node == "n-1"


def test_program_result_node_is_the_answers_node_header_and_none_without_one() -> None:
    routed = MockTransport(Script(answer(completed(), **{"X-KCoral-Node": "gpu-node-7"})))
    assert Client(URL, transport=routed).execute(Program()).node == "gpu-node-7"
    direct = MockTransport(Script(answer(completed())))
    result = Client(URL, transport=direct).execute(Program())
    assert result.node is None and "node=" not in repr(result)
    assert direct.requests[0].headers.get("X-KCoral-Select") is None  # no selector: no header


@pytest.mark.parametrize(
    ("select", "error", "words"),
    [
        ("gpu", SelectorError, "must be key=value"),
        ({"GPU": "h100"}, SelectorError, "selector key"),
        ({"gpus": "two"}, SelectorError, "whole number"),
        ({"gpu": True}, SelectorError, "string or an integer"),
        ({"gpu": "h 100"}, SelectorError, "selector value"),
        ("x" * 600, SelectorError, "at most 512"),
        (["gpu=h100"], TypeError, "select must be a map"),
    ],
)
def test_a_bad_select_raises_a_clear_error_before_anything_is_sent(
    select: Any, error: type[Exception], words: str
) -> None:
    transport = MockTransport(Script())
    client = Client(URL, transport=transport)
    calls = [
        lambda: client.execute(Program(), select=select),
        lambda: client.submit(Program(), select=select),
        lambda: client.session(select=select),
        lambda: client.function(select=select),
        lambda: AsyncClient(URL, transport=transport).session(select=select),
    ]
    for call in calls:
        with pytest.raises(error) as raised:
            call()
        assert words in str(raised.value)
    assert issubclass(SelectorError, ValueError)
    assert transport.requests == []


def test_submit_and_remote_functions_send_their_selector() -> None:
    accepted = answer({"job_id": "j-1", "request_id": REQUEST_ID, "status": "QUEUED"}, 202)
    transport = MockTransport(
        Script(
            answer(INFO),
            accepted,
            answer(completed(results={"output": {"type": "integer", "value": 2}})),
        )
    )
    client = Client(URL, transport=transport)
    client.submit(Program(), select={"gpus": 2})

    @client.function(select="gpu=cpu")
    def add_one(x: int) -> int:
        return x + 1

    assert add_one.remote(1) == 2
    assert select_headers(transport) == [None, "gpus=2", "gpu=cpu"]


def session_record() -> dict[str, Any]:
    return {"session_id": SESSION_ID, "owner": "default", "state": "IDLE"}


def test_a_session_is_created_with_its_selector_and_its_programs_keep_it() -> None:
    transport = MockTransport(
        Script(
            answer(session_record(), 201),
            answer(completed()),
            answer(completed()),
            answer(completed()),
        )
    )
    client = Client(URL, transport=transport)
    session = client.session(select={"gpu": "h100"})
    session.execute(Program())
    session.execute(Program(), select="node=n-2")  # one program may say more

    @session.function()
    def nothing() -> None:
        return None

    nothing.execute()
    assert select_headers(transport) == ["gpu=h100", "gpu=h100", "node=n-2", "gpu=h100"]
    assert [r.path for r in transport.requests][1:] == [f"/v1/sessions/{SESSION_ID}/execute"] * 3
    assert session.select == {"gpu": "h100"}


def test_the_async_flavour_sends_the_same_selectors() -> None:
    transport = MockTransport(
        Script(
            answer(cache_miss(digest())),
            answer(completed(), **{"X-KCoral-Node": "n-3"}),
            answer(session_record(), 201),
            answer(completed()),
            answer({**session_record(), "state": "ENDED"}),
        )
    )
    client = AsyncClient(URL, transport=transport)

    async def run() -> str | None:
        result = await client.execute(blob_program(), select="gpu=a100")
        async with client.session(select="pool=big") as session:
            await session.execute(Program())
        return result.node

    assert asyncio.run(run()) == "n-3"
    # the session's end (DELETE) is no program: it carries no selector
    assert select_headers(transport) == ["gpu=a100", "gpu=a100", "pool=big", "pool=big", None]
