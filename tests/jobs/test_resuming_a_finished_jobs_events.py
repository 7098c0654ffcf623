"""Resuming a finished job's events after its last one ends the iteration with nothing
(EXTENSIONS §5): nothing follows the ``finished`` phase.

A script that kept the id of the last event it handled and reads on with
``job.events(last_event_id=...)`` got ``TransportError: ... the event stream keeps ending``
once that event was ``finished``: the server's stream for it has nothing to send and ends,
as a dropped one does, and the client reconnected until it gave up.
"""

from __future__ import annotations

import asyncio

import pytest
from job_helpers import module_program
from stand_in_http import StandIn, serving

import kcoral
from kcoral.errors import ProtocolError

PRINTS = """
def f():
    print("hello")
    return 1
"""


def test_a_finished_jobs_events_resumed_after_its_last_end_with_nothing(kcoral_server) -> None:
    with kcoral.Client(kcoral_server.url) as client:
        job = client.submit(module_program(PRINTS, "f"))
        seen = list(job.events())
        assert seen[-1].finished
        last = seen[-1].id
        assert [event.id for event in job.events(last_event_id=last - 1)] == [last]
        assert list(job.events(last_event_id=last)) == []
        assert list(client.job(job.id).events(last_event_id=last + 5)) == []


def test_an_async_finished_jobs_events_resumed_after_its_last_end_with_nothing(
    kcoral_server,
) -> None:
    async def run() -> tuple[int, list[int], list[int]]:
        async with kcoral.AsyncClient(kcoral_server.url) as client:
            job = await client.submit(module_program(PRINTS, "f"))
            seen = [event async for event in job.events()]
            last = seen[-1].id
            before = [event.id async for event in job.events(last_event_id=last - 1)]
            after = [event.id async for event in job.events(last_event_id=last)]
            return last, before, after

    last, before, after = asyncio.run(run())
    assert before == [last] and after == []


class _FinishedWithoutEvents(StandIn):
    """A broken (or hostile) server: the job has finished, and its stream is empty."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path.endswith("/events"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_json({"job_id": JOB_ID, "status": "COMPLETED"})


JOB_ID = "0f6b2d1e-5a3c-4e8f-9b7d-2c1a0e9f8d7c"


def test_a_finished_jobs_stream_read_from_the_start_without_an_event_is_a_protocol_error() -> None:
    # Read from the start, a finished job's stream holds at least its `finished` event: one
    # that holds none ended the iteration as if the job had said nothing and never finished.
    with serving(_FinishedWithoutEvents) as url, kcoral.Client(url) as client:
        with pytest.raises(ProtocolError, match="the job has finished but its event stream"):
            list(client.job(JOB_ID).events())
        assert list(client.job(JOB_ID).events(last_event_id=3)) == []  # resumed: nothing
