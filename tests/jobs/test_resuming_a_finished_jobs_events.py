"""Resuming a finished job's events after its last one ends the iteration with nothing
(EXTENSIONS §5): nothing follows the ``finished`` phase.

A script that kept the id of the last event it handled and reads on with
``job.events(last_event_id=...)`` got ``TransportError: ... the event stream keeps ending``
once that event was ``finished``: the server's stream for it has nothing to send and ends,
as a dropped one does, and the client reconnected until it gave up.
"""

from __future__ import annotations

import asyncio

from job_helpers import module_program

import kcoral

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
