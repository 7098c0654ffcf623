"""What every HTTP handler of a KCoral server and of a router answers alike, whatever
Tornado's own defaults would be.

* No ``Etag``: a conditional GET still gets 200 and the whole body (PROTOCOL §12), never
  Tornado's bodiless 304.
* A path argument (a job or session id) whose percent-decoded bytes are not UTF-8 is kept,
  not refused: it names no job or session anyone was given, so the route answers it as an
  unknown id (404 ``not_found``), after the browser guard and the token check like any
  request. Tornado's own refusal came before both, as a 400 the server's ``write_error``
  could only call an ``engine`` fault and the router's was an HTML page (fuzz audit).
* Tornado's own errors (a method outside ``ALLOWED``, an unexpected exception) are
  ``ERROR`` bodies (PROTOCOL §7.4), and a 405 names the route's methods in ``Allow``
  (PROTOCOL §2). The router's were Tornado's HTML page without ``Allow``.
* A caller past the browser guard and the token check that is answered before its whole
  body was read gets a lingering close (``lingering_close``), never a reset under the answer.
* The request's summary in Tornado's access line (and its warnings) shows the path's
  control characters escaped: Tornado reads the request line as Latin-1 and takes the bytes
  0x80-0x9F, C1 controls, which a terminal acts on (0x9B is CSI: erase the line, hide the
  rest), so anyone who can connect could rewrite the line of its own refusal.
"""

from __future__ import annotations

from asyncio import Future
from typing import Any, cast

import tornado.web
from tornado.http1connection import HTTP1Connection  # what Tornado's HTTPServer hands us

from kcoral.protocol.headers import REQUEST_ID_HEADER
from kcoral.protocol.strict_json import dumps_compact
from kcoral_server.front_door.browser_guard import BROWSER_HEADERS
from kcoral_server.front_door.lingering_close import linger_on_close
from kcoral_server.storage.event_log import escape_controls


class KCoralRequestHandler(tornado.web.RequestHandler):
    """Base of every handler the server and the router serve."""

    #: the methods the route answers; any other gets 405 with ``Allow``
    ALLOWED: tuple[str, ...] = ("GET",)
    #: this request's id (set in ``initialize``), echoed in every answer
    request_id: str

    def compute_etag(self) -> None:
        return None

    def set_default_headers(self) -> None:
        # Every answer, refusals and relayed ones included (``clear()`` sets these again):
        # a page that loads it as a script or frames it gets nothing (browser_guard).
        for name, value in BROWSER_HEADERS:
            self.set_header(name, value)

    def _request_summary(self) -> str:
        return escape_controls(super()._request_summary())

    #: set once the caller passed the browser guard and the token check: only then is the
    #: rest of a body answered early read away (``lingering_close``); anyone else's never is
    linger_allowed = False

    def finish(self, chunk: str | bytes | dict[str, Any] | None = None) -> Future[None]:
        # Answered before the body was read to its end: Tornado closes the connection once
        # the answer is out, and that close must not reset it under the answer.
        connection = self.request.connection
        if self.linger_allowed and isinstance(connection, HTTP1Connection) and not self._finished:
            if not getattr(connection, "_read_finished", True):
                linger_on_close(connection.stream)
        return super().finish(chunk)

    def decode_argument(self, value: bytes, name: str | None = None) -> str:
        try:
            return super().decode_argument(value, name)
        except tornado.web.HTTPError:  # bytes that are not UTF-8
            return value.decode("utf-8", errors="replace")

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        if status_code == 405:
            self.set_header("Allow", ", ".join(self.ALLOWED))
        kind = {404: "not_found", 405: "method_not_allowed"}.get(status_code, "engine")
        message = {404: "not found", 405: "method not allowed"}.get(
            status_code, "internal server error"
        )
        self.set_header(REQUEST_ID_HEADER, self.request_id)
        self.set_header("Content-Type", "application/json")
        error = {"kind": kind, "message": message}
        body = {"status": "ERROR", "request_id": self.request_id, "error": error}
        self.finish(dumps_compact(body))


#: the largest body an endpoint reads that takes a small JSON body or none (the server's
#: every endpoint but ``/execute`` and the job submissions; the router's ``/health``,
#: ``/metrics`` and unknown paths)
SMALL_BODY_BYTES = 64 * 1024
# Tornado must never answer a body it will not read after we have answered (its own raw
# 400 for a length over its limit would follow ours on the connection).
UNLIMITED = 1 << 62
#: PROTOCOL §7.1's fixed 413 text (the server's ``/execute`` appends the sizes, EXTENSIONS §10)
TOO_LARGE_MESSAGE = "request exceeds the configured size limit"


def over_limit(limit: int, declared: int | None) -> str:
    """What a 413 says after its fixed text (EXTENSIONS §10): ``N bytes, limit M bytes``, or
    for a chunked body that passed the limit (``declared`` None) ``over the limit of M
    bytes``. Server and router alike."""
    return (
        f"{declared} bytes, limit {limit} bytes" if declared else f"over the limit of {limit} bytes"
    )


def declared_length(value: str | None) -> int | None:
    """The ``Content-Length`` as a number; None when absent or not one (Tornado refuses a
    malformed one itself)."""
    if value is None:
        return None
    try:
        return int(value.strip())
    except ValueError:
        return None


def bound_body(handler: tornado.web.RequestHandler, limit: int, timeout_seconds: float) -> bool:
    """Let ``handler``'s request send at most ``limit`` body bytes within
    ``timeout_seconds`` (Tornado refuses a longer chunked body). False: its declared length
    is larger, the body is never read, and the caller answers 413 before it."""
    connection = cast(HTTP1Connection, handler.request.connection)
    declared = declared_length(handler.request.headers.get("Content-Length"))
    if declared is not None and declared > limit:
        connection.set_max_body_size(UNLIMITED)
        return False
    connection.set_max_body_size(limit)
    connection.set_body_timeout(timeout_seconds)
    return True
