"""A stand-in HTTP server on loopback, in a thread, for tests that play a server the client
talks to: the standard library's (one that knows only the published protocol, one that
records what it was sent, one that cuts its answers short), a Tornado application (one
that streams), or a listener that accepts connections and never answers (``silent``).
``StandIn`` is the standard library's handler with what every such stand-in wants: a JSON
answer in one call, the body read, and no access log in the test's output."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import socket
import threading
from collections.abc import Callable, Iterator, Mapping

import tornado.httpserver
import tornado.netutil
import tornado.web


class StandIn(http.server.BaseHTTPRequestHandler):
    """A stand-in server's handler: subclasses write ``do_GET`` and the like with
    ``send_json``, and log nothing (the test's output shows only what failed)."""

    def send_json(
        self, document: object, status: int = 200, headers: Mapping[str, str] | None = None
    ) -> None:
        """Answer ``document`` as JSON with ``status`` and any extra ``headers``."""
        body = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def read_body(self) -> bytes:
        """The request's body, as its ``Content-Length`` declares it (none: empty)."""
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve ``handler`` on a free loopback port; yields ``http://127.0.0.1:PORT``."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def serving_app(make_app: Callable[[], tornado.web.Application]) -> Iterator[str]:
    """Serve the application ``make_app()`` returns on a free loopback port, from an event
    loop in its own thread; yields ``http://127.0.0.1:PORT``."""
    sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")  # listening from here on
    loop = asyncio.new_event_loop()
    started, stop = threading.Event(), asyncio.Event()

    async def serve() -> None:
        server = tornado.httpserver.HTTPServer(make_app())
        server.add_sockets(sockets)
        started.set()
        await stop.wait()
        server.stop()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    try:
        assert started.wait(30), "the stand-in server did not start"
        yield f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        loop.close()


@contextlib.contextmanager
def silent() -> Iterator[str]:
    """A loopback listener that accepts connections, reads nothing and never answers (a
    stopped process, a hung proxy); yields ``http://127.0.0.1:PORT``."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for connection in accepted:
            connection.close()
        listener.close()
