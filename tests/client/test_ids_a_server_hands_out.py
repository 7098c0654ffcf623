"""A job or session id that a server hands out is one URL path segment, or the answer is a
``ProtocolError`` (a malicious server answering our client, CLIENT_API §2): the client
puts the id in the paths of the job's or session's later requests, so ``../sessions/ID``
would have sent a job's cancel (``DELETE``), with the user's token, to another route of
that address. A caller's ids were checked so already; the server's only for ``/``."""

from __future__ import annotations

import asyncio
import json

import pytest
from server_answers import REQUEST_ID

import kcoral
from kcoral import AsyncClient, Client, Program
from kcoral.connection.transport import MockTransport, Request, Response
from kcoral.errors import ProtocolError

URL = "http://kcoral.test"
INFO = {"kcoral": kcoral.__version__, "protocol": 1, "features": ["jobs", "sessions"]}
HOSTILE_IDS = ["..", "../sessions/6f1a2b3c", "j?x=1", "j#1", "j%2F..", "j\n1"]


def answer(body: object, status: int = 200) -> Response:
    return Response(status, {"Content-Type": "application/json"}, json.dumps(body).encode())


class Script:
    def __init__(self, *answers: Response) -> None:
        self.answers = list(answers)

    def __call__(self, request: Request) -> Response:
        return self.answers.pop(0)


@pytest.mark.parametrize("job_id", HOSTILE_IDS)
def test_a_job_id_that_is_not_one_path_segment_is_a_protocol_error(job_id: str) -> None:
    accepted = answer({"job_id": job_id, "request_id": REQUEST_ID, "status": "QUEUED"}, 202)
    transport = MockTransport(Script(answer(INFO), accepted))
    with pytest.raises(ProtocolError, match="no valid job_id"):
        Client(URL, transport=transport).submit(Program())
    assert len(transport.requests) == 2  # nothing sent under the id


@pytest.mark.parametrize("session_id", ["../jobs/" + "x" * 28, "a" * 35 + "/", "a" * 35 + "?"])
def test_a_session_id_that_is_not_one_path_segment_is_a_protocol_error(session_id: str) -> None:
    record = {"session_id": session_id, "owner": "default", "state": "IDLE"}
    blocking = MockTransport(Script(answer(record, 201)))
    with pytest.raises(ProtocolError, match="no valid session_id"):
        Client(URL, transport=blocking).session()
    flavour = MockTransport(Script(answer(record, 201)))

    async def start() -> None:
        async with AsyncClient(URL, transport=flavour).session():
            pass

    with pytest.raises(ProtocolError, match="no valid session_id"):
        asyncio.run(start())
    assert [len(blocking.requests), len(flavour.requests)] == [1, 1]
