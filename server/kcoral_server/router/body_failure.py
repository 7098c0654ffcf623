"""Answer a client whose request body breaks while it streams (ROUTER §8.5).

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

from collections.abc import Awaitable, Callable
from typing import Any

import tornado.http1connection
import tornado.httputil
import tornado.iostream

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
