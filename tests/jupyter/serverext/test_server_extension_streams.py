"""The live-output relay (``GET kcoral/api/jobs/{id}/events``) ends its stream from the
KCoral server when the browser's stream closes, so abandoned streams (the panel selects
another job, the tab closes) never hold the connections the other routes need; and at most
``max_event_streams`` relays run at once. A real Jupyter server with the extension, the
browser played by raw loopback connections, and a stand-in KCoral server (a Tornado app)
that counts the event streams it holds open and never writes to them after the first
event, so only the relay can end them."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest
import tornado.httpclient
import tornado.web
from stand_in_http import serving_app
from traitlets.config import Config

pytestmark = pytest.mark.timeout(180)

WAIT_SECONDS = 60.0  # how long a condition may take to come true, not a measured time


class Upstream:
    """What the stand-in server saw (written on its thread, read by the test)."""

    open_streams = 0
    closed_streams = 0


class _Health(tornado.web.RequestHandler):
    def get(self) -> None:
        load = {"request_capacity": 1, "requests_in_progress": 0, "requests_waiting": 0}
        self.write({"status": "ok", "gpu_count": 0, "load": load, "target": {}, "versions": {}})


class _Info(tornado.web.RequestHandler):
    def get(self) -> None:
        self.write({"kcoral": "0", "protocol": 1, "features": ["jobs"], "device": "cpu"})


class _Jobs(tornado.web.RequestHandler):
    def get(self) -> None:
        self.finish(json.dumps([]))


class _Job(tornado.web.RequestHandler):
    def get(self, job_id: str) -> None:
        self.write({"job_id": job_id, "status": "RUNNING"})


class _Events(tornado.web.RequestHandler):
    """One event, then silence until the connection closes: no keep-alive write that
    would find a dead connection on its own."""

    def initialize(self) -> None:
        self.ended = asyncio.Event()

    async def get(self, job_id: str) -> None:
        Upstream.open_streams += 1
        self.set_header("Content-Type", "text/event-stream")
        self.write(f": stream of {job_id}\n\n")
        await self.flush()
        await self.ended.wait()

    def on_connection_close(self) -> None:
        Upstream.open_streams -= 1
        Upstream.closed_streams += 1
        self.ended.set()


@pytest.fixture(scope="module")
def upstream_url() -> Iterator[str]:
    routes = [
        (r"/health", _Health),
        (r"/v1/info", _Info),
        (r"/v1/jobs", _Jobs),
        (r"/v1/jobs/([^/]+)", _Job),
        (r"/v1/jobs/([^/]+)/events", _Events),
    ]
    with serving_app(lambda: tornado.web.Application(routes)) as url:
        yield url


@pytest.fixture
def jp_server_config(upstream_url: str) -> Config:
    return Config(
        {
            "ServerApp": {"jpserver_extensions": {"kcoral_jupyter": True}},
            "KCoralExtension": {
                "request_timeout": 20.0,
                "servers": [{"name": "gpu", "url": upstream_url, "token": "t"}],
            },
        }
    )


async def _until(condition: Callable[[], bool], what: str) -> None:
    """Until ``condition()`` (not waiting's ``wait_for``: this sleeps on the event loop,
    which serves the Jupyter server under test)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        assert time.monotonic() < deadline, f"never came true: {what}"
        await asyncio.sleep(0.05)


class Browser:
    """A browser's stream of the panel, on a raw loopback connection it can drop."""

    def __init__(self, port: int, base_url: str, auth: dict[str, str]) -> None:
        self.port, self.base_url, self.auth = port, base_url, auth["Authorization"]
        self.writers: list[asyncio.StreamWriter] = []

    async def follow(self, job_id: str) -> bytes:
        """Open the job's stream and read up to its first event; the status line and
        headers with it."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writers.append(writer)
        writer.write(
            f"GET {self.base_url}kcoral/api/jobs/{job_id}/events HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{self.port}\r\nAuthorization: {self.auth}\r\n\r\n".encode()
        )
        await writer.drain()
        read: Awaitable[bytes] = reader.readuntil(f": stream of {job_id}\n\n".encode())
        return await asyncio.wait_for(read, WAIT_SECONDS)

    def drop(self, count: int | None = None) -> None:
        """Close ``count`` streams (all by default), as a closed tab does."""
        for writer in self.writers[:count]:
            writer.close()
        del self.writers[:count]


@pytest.fixture
def browser(http_server_client, jp_http_port, jp_base_url, jp_auth_header) -> Iterator[Browser]:
    opened = Browser(jp_http_port, jp_base_url, jp_auth_header)
    yield opened
    opened.drop()


async def test_abandoned_streams_end_upstream_and_the_other_routes_still_answer(
    jp_fetch, jp_serverapp, browser
) -> None:
    extension = jp_serverapp.web_app.settings["kcoral_extension"]
    closed_before = Upstream.closed_streams
    # More than the 10 connections of Tornado's shared client, which the other routes use.
    for index in range(12):
        head = await browser.follow(f"job-{index}")
        assert head.startswith(b"HTTP/1.1 200 ")
    assert Upstream.open_streams == 12 and extension.open_event_streams == 12
    browser.drop()
    await _until(lambda: Upstream.open_streams == 0, "the KCoral server's streams closed")
    await _until(lambda: extension.open_event_streams == 0, "the relays ended")
    assert Upstream.closed_streams - closed_before == 12
    servers = json.loads((await jp_fetch("kcoral", "api", "servers")).body)["servers"]
    assert servers[0]["health"]["status"] == "ok" and "error" not in servers[0]
    jobs = json.loads((await jp_fetch("kcoral", "api", "jobs")).body)
    assert jobs == {"jobs": [], "errors": []}


async def test_a_stream_beyond_the_cap_is_answered_503_in_words_until_one_closes(
    jp_fetch, jp_serverapp, browser
) -> None:
    extension = jp_serverapp.web_app.settings["kcoral_extension"]
    extension.max_event_streams = 2
    await browser.follow("first")
    await browser.follow("second")
    with pytest.raises(tornado.httpclient.HTTPClientError) as refused:
        await jp_fetch("kcoral", "api", "jobs", "third", "events")
    assert refused.value.code == 503
    error = json.loads(refused.value.response.body)["error"]
    assert error["kind"] == "busy"
    assert error["message"].startswith("2 live output streams are open, the most this Jupyter")
    assert "c.KCoralExtension.max_event_streams" in error["message"]
    assert Upstream.open_streams == 2  # the refused one never reached the KCoral server
    browser.drop(1)
    await _until(lambda: extension.open_event_streams == 1, "the dropped relay ended")
    head = await browser.follow("third")
    assert head.startswith(b"HTTP/1.1 200 ")
    browser.drop()
    await _until(lambda: Upstream.open_streams == 0, "the KCoral server's streams closed")
