"""Shared handler behaviour: JSON errors, ``X-Request-ID``, ``Allow`` on 405, browser
refusals (``kcoral_server.front_door.browser_guard``), auth, and small bodies.

Who can reach what: anyone who reaches the port, a web page or a client without a token
included, sends a request head and a body to any path. Every handler streams its body
(``stream_request_body``), so the browser guard and the token check run on the head alone,
before one byte of the body is read: a refused request's body is never read (Tornado drops
it and closes the connection, ``Connection: close``). Only then does an endpoint read its
body, and every endpoint but ``/execute`` and the job submissions (which stream theirs into
a memfd, ``handlers.execute``) takes a small JSON body or none: at most ``SMALL_BODY_BYTES``
(a larger declared length is 413 at once), which must arrive within
``--body-timeout-seconds``. Before (audit F4), Tornado read any body up to
``--max-request-bytes`` into memory first, with no deadline, even for a client without a
token.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Any, cast

import tornado.web
from tornado.http1connection import HTTP1Connection  # what Tornado's HTTPServer hands us

from kcoral.protocol.headers import REQUEST_ID_HEADER, accept_request_id
from kcoral.protocol.strict_json import dumps_compact
from kcoral_server.execution.responses import Refusal
from kcoral_server.front_door.callers import DEFAULT, Identity
from kcoral_server.front_door.handler_defaults import (
    SMALL_BODY_BYTES,
    TOO_LARGE_MESSAGE,
    UNLIMITED,
    KCoralRequestHandler,
    bound_body,
    declared_length,
    over_limit,
)
from kcoral_server.front_door.token_reload import router_revoked

if TYPE_CHECKING:
    from kcoral_server.front_door.app import ServerState


UNAUTHORIZED = Refusal(401, "unauthorized", "missing or invalid bearer token", "rejected")


@tornado.web.stream_request_body
class BaseHandler(KCoralRequestHandler):
    """JSON bodies everywhere; ``ALLOWED`` methods, others get 405 with ``Allow``."""

    ALLOWED: tuple[str, ...] = ("GET",)
    PUBLIC = False  # True: no client token needed (EXTENSIONS §6)
    #: the most body bytes the endpoint reads (``small_body``); None: it reads its own
    MAX_BODY: int | None = SMALL_BODY_BYTES
    #: why ``MAX_BODY`` is what it is, where a 413 says it with the sizes (EXTENSIONS §10);
    #: None: the fixed text alone
    TOO_LARGE_NOTE: str | None = None

    def initialize(self, state: ServerState) -> None:
        self.state = state
        self.request_id = accept_request_id(self.request.headers.get_list(REQUEST_ID_HEADER))
        self.identity: Identity = DEFAULT  # set by prepare() from the bearer token
        #: set when prepare() refused the request (403 or 401)
        self.early_refusal: Refusal | None = None
        #: the body as it arrived (at most ``MAX_BODY`` bytes; complete in the method)
        self.small_body = bytearray()

    def set_default_headers(self) -> None:
        super().set_default_headers()
        self.set_header("Server", "kcoral")

    def prepare(self) -> None:
        """The checks on the request head, before any of the body is read (the module's
        docstring), then the endpoint's body limits."""
        self.check_head()
        connection = cast(HTTP1Connection, self.request.connection)
        if self._finished:  # refused: the body is never read
            connection.set_max_body_size(UNLIMITED)
        elif self.MAX_BODY is not None:
            self.limit_body(self.MAX_BODY)

    def limit_body(self, limit: int) -> None:
        """Read at most ``limit`` body bytes, within ``--body-timeout-seconds`` (413 at once
        for a longer declared length; Tornado refuses a longer chunked body)."""
        if bound_body(self, limit, float(self.state.config.body_timeout_seconds)):
            return
        message = TOO_LARGE_MESSAGE
        if self.TOO_LARGE_NOTE is not None:
            declared = declared_length(self.request.headers.get("Content-Length"))
            message += f": {over_limit(limit, declared)} ({self.TOO_LARGE_NOTE})"
        self.answer_early(413, "request_too_large", message)

    def answer_early(self, status: int, kind: str, message: str) -> None:
        """Answer before the body is read: Tornado then closes the connection (it does not
        read the body), and the client is told so."""
        self.set_header("Connection", "close")
        self.send_error_json(status, kind, message)

    def check_head(self) -> None:
        """Browser guard, token, method: answered here when one refuses."""
        self.set_header(REQUEST_ID_HEADER, self.request_id)
        # Web pages first (EXTENSIONS §6): even /health answers a foreign page nothing.
        refusal = self.state.browser_guard.refusal(self.request.headers)
        if refusal is not None:
            self.early_refusal = Refusal(403, "forbidden", refusal, "rejected")
            self.answer_early(403, "forbidden", refusal)
            return
        # A node's child answers nothing without its router secret, not even the public
        # endpoints: /health and /internal/worker-status carry the server instance id, the
        # one value a holder of the node token lacked to open slots under this node's id
        # (ROUTER §12). The supervisor's probes and the tunnel present the secret.
        if not self.PUBLIC or self.state.authenticator.tunnel_only:
            identity = self.authenticate()
            denied = (
                UNAUTHORIZED
                if identity is None
                else router_revoked(self.state, identity, self.request.headers)
            )
            if denied is not None:
                self.early_refusal = denied
                self.answer_early(denied.status, denied.kind, denied.message)
                return
            assert identity is not None
            self.identity = identity
            self.linger_allowed = True
        if self.request.method not in self.ALLOWED:
            self.set_header("Allow", ", ".join(self.ALLOWED))
            self.answer_early(405, "method_not_allowed", "method not allowed")

    def authenticate(self) -> Identity | None:
        """The caller's identity from its bearer token; None: 401."""
        return self.state.authenticate(self.request.headers)

    def send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = dumps_compact(body)
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            self.set_header(name, value)
        self.finish(data)

    def send_error_json(self, status: int, kind: str, message: str) -> None:
        headers = {"Retry-After": "1"} if status == 503 else {}
        body = {
            "status": "ERROR",
            "request_id": self.request_id,
            "error": {"kind": kind, "message": message},
        }
        self.send_json(status, body, headers)

    def is_loopback_peer(self) -> bool:
        try:
            return ipaddress.ip_address(self.request.remote_ip or "").is_loopback
        except ValueError:
            return False

    def data_received(self, chunk: bytes) -> None:
        """Keep the small body (Tornado stops a longer one at ``MAX_BODY``)."""
        if not self._finished and self.MAX_BODY is not None:
            self.small_body += chunk[: max(0, self.MAX_BODY - len(self.small_body))]


class NotFoundHandler(BaseHandler):
    """Any unknown path: 404 JSON (after the auth check, so paths are not probed freely;
    before any body is read). The application's default handler too."""

    ALLOWED = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")

    def prepare(self) -> None:
        self.check_head()
        if not self._finished:
            self.answer_early(404, "not_found", "not found")
        cast(HTTP1Connection, self.request.connection).set_max_body_size(UNLIMITED)
