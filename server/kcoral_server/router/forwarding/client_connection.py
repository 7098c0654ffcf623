"""What the router learns of a client's HTTP/1.1 connection that Tornado does not tell it:
a request body that breaks while it streams (ROUTER §8.5), and a client that hung up while
its request waits for a slot (ROUTER §7).

A body that breaks:

Tornado decodes a chunked body itself and, on a framing error (a bad chunk size, a missing
CRLF), writes a bare ``HTTP/1.1 400 Bad Request`` and tells the handler only that the
connection closed: the client gets no ``ERROR`` body and no ``X-Request-ID``, and the router
would log the request as a client disconnect. Tornado offers no hook for this, so this
module is the one place that reaches into its HTTP/1.1 connection: ``report_body_failures``
gives the request's connection a subclass whose chunked-body reader calls the handler back
with the error, lets it answer, and then ends the exchange as a closed stream (so Tornado
writes nothing after the answer). Who can reach it: any client of the router's HTTP port.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import tornado.http1connection
import tornado.httputil
import tornado.iostream

from kcoral_server.router.listener import peer_hung_up

BodyFailed = Callable[[str], Awaitable[None]]


class _ReportingConnection(tornado.http1connection.HTTP1Connection):
    kcoral_body_failed: BodyFailed | None = None

    async def _read_chunked_body(self, delegate: Any) -> None:
        try:
            await super()._read_chunked_body(delegate)
        except tornado.httputil.HTTPInputError as exc:
            report = self.kcoral_body_failed
            if report is None:
                raise
            await report(str(exc))
            raise tornado.iostream.StreamClosedError() from exc


def report_body_failures(connection: Any, on_failure: BodyFailed) -> None:
    """Call ``on_failure(reason)`` when the request body on ``connection`` is malformed.

    A connection that is not Tornado's HTTP/1.1 one (none in production) is left alone.
    """
    if type(connection) is tornado.http1connection.HTTP1Connection:
        connection.__class__ = _ReportingConnection
    if isinstance(connection, _ReportingConnection):
        connection.kcoral_body_failed = on_failure


#: how often a request waiting for a slot checks that its client is still there
HANG_UP_CHECK_SECONDS = 0.5


def hung_up(connection: Any) -> bool:
    """Whether the client of ``connection`` has closed it (or shut down its sending side).

    Tornado notices a closed connection only when it reads or writes, and it does neither
    while a request waits in ``prepare`` for a slot: a client that left stayed queued until
    a slot freed, was then sent to a node and cancelled at once (metrics soak)."""
    stream = getattr(connection, "stream", None)
    if stream is None:
        return False
    if stream.closed():
        return True
    sock = getattr(stream, "socket", None)
    if sock is None or isinstance(sock, ssl.SSLSocket):
        return False  # not a plain socket: left to Tornado
    try:
        if peer_hung_up(sock):  # even with bytes of the request still unread before the end
            return True
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False  # open, nothing to read
    except (OSError, ValueError):
        return True  # reset, or its descriptor is gone


def notice_hang_up(handler: Any, waiting: asyncio.Future[Any]) -> asyncio.Task[None]:
    """A task that calls ``handler.client_hung_up()`` once the client of ``handler``'s
    request hangs up while ``waiting`` (its wait for a slot) is not done."""

    async def watch() -> None:
        while not waiting.done():
            await asyncio.sleep(HANG_UP_CHECK_SECONDS)
            if not waiting.done() and hung_up(handler.request.connection):
                handler.client_hung_up()
                return

    return asyncio.get_running_loop().create_task(watch())
