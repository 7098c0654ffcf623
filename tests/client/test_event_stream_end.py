"""The end of a job's event stream (``kcoral.connection.event_stream``): after the
``finished`` event the client reads the stream's end, so the connection is reused and the
request counts as completed, not as a client that left; a server that keeps the stream open
after ``finished`` (streaming on, or silent) cannot hold the caller: it is hung up on."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator

import pytest
import tornado.web
from stand_in_http import serving_app

import kcoral

FINISHED = "id: 1\nevent: phase\ndata: " + json.dumps({"phase": "finished", "status": "COMPLETED"})
FINISHED += "\n\n"

pytestmark = pytest.mark.timeout(60)


class StreamServer:
    """Serves ``/v1/jobs/{how}/events`` on loopback: ``ends`` after the finished event,
    ``goes-on`` with a comment line every 10 ms, ``stalls`` silently until the client leaves.
    Records each stream's client port and whether the client left before the end."""

    def __init__(self) -> None:
        self.ports: list[int] = []
        self.left: list[str] = []
        self.url = ""

    def app(self) -> tornado.web.Application:
        owner = self

        class Events(tornado.web.RequestHandler):
            def initialize(self) -> None:
                self.gone = asyncio.Event()

            def on_connection_close(self) -> None:
                self.gone.set()

            async def get(self, how: str) -> None:
                owner.ports.append(self.request.connection.context.address[1])
                self.set_header("Content-Type", "text/event-stream")
                self.write(FINISHED)
                await self.flush()
                if how == "ends":
                    self.finish()
                    return
                while not self.gone.is_set():
                    if how == "goes-on":
                        self.write(": still here\n\n")
                        await self.flush()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.gone.wait(), 0.01)
                owner.left.append(how)

        return tornado.web.Application([(r"/v1/jobs/([^/]+)/events", Events)])


@pytest.fixture
def streams() -> Iterator[StreamServer]:
    server = StreamServer()
    with serving_app(server.app) as server.url:
        yield server


def test_a_stream_that_ends_after_finished_keeps_its_connection_for_the_next_wait(
    streams: StreamServer,
) -> None:
    with kcoral.Client(streams.url) as client:
        client.job("ends").wait()
        client.job("ends").wait()
        assert [event.kind for event in client.job("ends").events()] == ["phase"]
    assert len(streams.ports) == 3 and len(set(streams.ports)) == 1  # one connection
    assert streams.left == []


@pytest.mark.parametrize("how", ["goes-on", "stalls"])
def test_a_server_that_keeps_the_stream_open_after_finished_cannot_hold_a_wait(
    streams: StreamServer, how: str
) -> None:
    with kcoral.Client(streams.url) as client:
        client.job(how).wait()  # returns: the end is waited for a bounded time only
        events = list(client.job(how).events())
    assert [event.finished for event in events] == [True]
    assert len(set(streams.ports)) == 2  # the hung-up connection is not reused
