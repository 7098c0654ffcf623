"""A tiny Tornado server in a background thread that answers with canned responses."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pytest
import tornado.httpserver
import tornado.netutil
import tornado.web
from tornado.ioloop import IOLoop

from kcoral.protocol.multipart import boundary_from_content_type, parse_multipart


@dataclass
class Canned:
    status: int = 200
    body: bytes = b""
    content_type: str | None = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    hang: bool = False  # never answer; record when the client closes the connection
    #: answer once this is set (``hung`` is set while it waits)
    wait_for: threading.Event | None = None


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, list[str]]
    body: bytes
    #: the client's end of the TCP connection (address, port): a new connection has a new
    #: port, while the id of a closed stream's object can be reused by the next one
    connection: tuple[str, int]

    def header(self, name: str) -> str | None:
        values = self.headers.get(name.lower())
        return values[0] if values else None

    def parts(self) -> list[tuple[str, str, bytes]]:
        boundary = boundary_from_content_type(self.header("Content-Type"))
        return [
            (part.name, part.content_type, bytes(part.data))
            for part in parse_multipart(self.body, boundary)
        ]


class CannedServer:
    def __init__(self) -> None:
        self.responses: deque[Canned] = deque()
        self.requests: list[Recorded] = []
        self.hung = threading.Event()
        self.closed = threading.Event()
        self.url = ""
        self._loop: IOLoop | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._ready = threading.Event()

    def add(self, body: Any = b"", status: int = 200, **kwargs: Any) -> None:
        if not isinstance(body, bytes):
            body = json.dumps(body).encode()
        self.responses.append(Canned(status=status, body=body, **kwargs))

    def start(self) -> CannedServer:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        assert self._loop is not None
        self._loop.add_callback(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(asyncio.new_event_loop())
        self._loop = IOLoop.current()
        app = tornado.web.Application([(r"/.*", _Handler, {"server": self})])
        sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
        http = tornado.httpserver.HTTPServer(app)
        http.add_sockets(sockets)
        self.url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
        self._ready.set()
        self._loop.start()
        http.stop()


class _Handler(tornado.web.RequestHandler):
    def initialize(self, server: CannedServer) -> None:
        self.canned_server = server
        self._gone: asyncio.Future[None] | None = None

    def on_connection_close(self) -> None:
        if self._gone is not None and not self._gone.done():
            self._gone.set_result(None)

    async def _answer(self) -> None:
        server = self.canned_server
        headers: dict[str, list[str]] = {}
        for name, value in self.request.headers.get_all():
            headers.setdefault(name.lower(), []).append(value)
        server.requests.append(
            Recorded(
                self.request.method or "",
                self.request.path,
                headers,
                self.request.body,
                self.request.connection.context.address,
            )
        )
        canned = server.responses.popleft() if server.responses else Canned(status=599)
        if canned.hang:
            self._gone = asyncio.get_running_loop().create_future()
            server.hung.set()
            await self._gone
            server.closed.set()
            return
        if canned.wait_for is not None:
            server.hung.set()
            await asyncio.get_running_loop().run_in_executor(None, canned.wait_for.wait)
        self.set_status(canned.status)
        self.clear_header("Content-Type")
        if canned.content_type is not None:
            self.set_header("Content-Type", canned.content_type)
        for name, value in canned.headers.items():
            self.add_header(name, value)
        self.finish(canned.body)

    async def get(self) -> None:
        await self._answer()

    async def post(self) -> None:
        await self._answer()


@pytest.fixture
def canned_server():
    server = CannedServer().start()
    yield server
    server.stop()
