"""What every router endpoint but ``/health`` shares: a fresh request id, the client token
check (EXTENSIONS §6), router-made ``ERROR`` answers and the ``request_finished`` line.

Who can reach what: anyone who reaches the router's port, a web page or a client without a
token included, sends a request head and a body to any path. Every route streams its body
(``stream_request_body``), so the browser guard and the token check run on the head alone:
a refused request's body is never read. The routes that take no body (``/health``,
``/metrics``, unknown paths: ``settle_unread_body``) read at most ``SMALL_BODY_BYTES`` of
one and drop it (a larger declared length is 413 at once). Before, Tornado read their whole
body into memory first, up to the router's unbounded limit, even for a client without a
token: one ``POST /health`` of 400 MiB held 400 MiB of the router.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable
from typing import Any, cast

import tornado.web
from tornado.http1connection import HTTP1Connection  # what Tornado's HTTPServer hands us

from kcoral.protocol.selector import (
    INVALID_SELECTOR,
    NO_MATCHING_NODE,
    SELECT_HEADER,
    Selector,
    SelectorError,
    format_selector,
    header_selector,
)
from kcoral.protocol.strict_json import dumps_compact
from kcoral_server.front_door.browser_guard import BrowserGuard
from kcoral_server.front_door.callers import DEFAULT, Identity
from kcoral_server.front_door.handler_defaults import (
    SMALL_BODY_BYTES,
    TOO_LARGE_MESSAGE,
    UNLIMITED,
    KCoralRequestHandler,
    bound_body,
)
from kcoral_server.router.admission.scheduler import NoNode
from kcoral_server.router.admission.selection import no_match_message, offering_nodes

UNAUTHORIZED_MESSAGE = "missing or invalid bearer token"
#: the status logged for a client that left before any answer (nginx's; the server's too)
CLIENT_CLOSED_REQUEST = 499


class CallerRevoked(NoNode):
    """The caller's token was revoked (a reload, EXTENSIONS §6) while its request waited
    for a slot: it was answered 401 and the slot given back; no node sees the request."""


def browser_refusal(state: Any, headers: Any) -> str | None:
    """The 403 ``forbidden`` message for a web page's request, or None (EXTENSIONS §6).

    Runs before the token check on every endpoint, ``/health`` included; see
    ``kcoral_server.front_door.browser_guard`` for who is refused and why."""
    settings = state.settings
    guard = BrowserGuard.build(
        settings.allowed_origins,
        settings.allowed_hosts,
        settings.host,
        token_required=settings.auth_token is not None,
        process="router",
    )
    return guard.refusal(headers)


def settle_unread_body(handler: KCoralRequestHandler, timeout_seconds: float) -> bool:
    """For a route that reads no body, once its head is checked: a request already answered
    (refused, or a 404) has its body never read; any other may send at most
    ``SMALL_BODY_BYTES`` within ``timeout_seconds``, dropped as it arrives. False: the
    declared length is larger, and the caller answers 413 (with ``Connection: close``)
    before reading it."""
    if handler._finished:
        cast(HTTP1Connection, handler.request.connection).set_max_body_size(UNLIMITED)
        return True
    return bound_body(handler, SMALL_BODY_BYTES, timeout_seconds)


def error_answer(
    handler: tornado.web.RequestHandler,
    request_id: str,
    status: int,
    kind: str,
    message: str,
    headers: dict[str, str] | None = None,
) -> bytes:
    """A router-made ``ERROR`` answer (ROUTER §9), for every router route: its status and
    headers set, its body returned to ``finish`` (or to write after a node's answer was
    buffered, ``JobHandler.rewrite``)."""
    handler.set_status(status)
    handler.set_header("X-Request-ID", request_id)
    handler.set_header("Content-Type", "application/json")
    # Tornado closes a connection whose request it had not read to the end once the
    # answer is out, without saying so: say it, or a client reuses the connection and
    # its next request is lost (seen with a 404 answered before a GET's empty body).
    connection = handler.request.connection
    if connection is not None and not getattr(connection, "_read_finished", True):
        handler.set_header("Connection", "close")
    for name, value in (headers or {}).items():
        handler.set_header(name, value)
    if status == 503:
        handler.set_header("Retry-After", "1")
    body = {
        "status": "ERROR",
        "request_id": request_id,
        "error": {"kind": kind, "message": message},
    }
    return dumps_compact(body)


@tornado.web.stream_request_body
class RouterHandler(KCoralRequestHandler):
    """Base of the authenticated endpoints; ``ALLOWED`` methods, others get 405."""

    ALLOWED: tuple[str, ...] = ("GET",)

    def initialize(self, state: Any) -> None:
        self.state = state
        # ROUTER §8.1: a fresh id for every request (the client's X-Request-ID is dropped).
        self.request_id = str(uuid.uuid4())
        self.received_at = time.monotonic()
        self.finish_reason: str | None = None
        self.node: str | None = None
        self.request_bytes = 0
        self.response_bytes = 0
        self.queue_wait_ms = 0.0
        #: while set, a request_finished line takes the wait so far (``timed_wait``)
        self.waiting_for_node = False
        self.identity: Identity = DEFAULT
        self.checked_with: Any = None  # the Authenticator the head was checked against
        self.selector: Selector = {}  # X-KCoral-Select, where the route reads it

    def check_request(self) -> bool:
        """403 for a web page, 401 without the client token, 405 for other methods; True when
        the request may go on."""
        self.set_header("X-Request-ID", self.request_id)
        refusal = browser_refusal(self.state, self.request.headers)
        if refusal is not None:
            self.send_router_error(403, "forbidden", refusal, "request_rejected")
            return False
        # The identity the router vouches for to its nodes (X-KCoral-Identity); a client's
        # own X-KCoral-Identity is never believed here (no router secret on this side).
        identity = self.authenticate()
        if identity is None:
            self.send_router_error(401, "unauthorized", UNAUTHORIZED_MESSAGE, "request_rejected")
            return False
        self.identity = identity
        self.checked_with = self.state.authenticator
        self.linger_allowed = True
        if self.request.method not in self.ALLOWED:
            self.send_router_error(
                405,
                "method_not_allowed",
                "method not allowed",
                "request_rejected",
                {"Allow": ", ".join(self.ALLOWED)},
            )
            return False
        return True

    def read_selector(self) -> Selector | None:
        """The request's ``X-KCoral-Select`` selector (``{}``: none), or None once a
        malformed one was answered ``400 invalid_selector`` (EXTENSIONS §14)."""
        try:
            self.selector = header_selector(self.request.headers.get_list(SELECT_HEADER))
        except SelectorError as exc:
            self.send_router_error(400, INVALID_SELECTOR, str(exc), "request_rejected")
            return None
        return self.selector

    def offered(self, selector: Selector) -> bool:
        """Whether a connected ``ready`` node offers ``selector`` (busy ones count: the
        request waits for them); else ``503 no_matching_node`` naming what the fleet
        offers, at once. A request without a selector is never refused here."""
        registry = self.state.registry
        if not selector or offering_nodes(registry, selector):
            return True
        message = no_match_message(registry, selector)
        self.send_router_error(503, NO_MATCHING_NODE, message, "request_rejected")
        return False

    async def for_caller(self, acquire: Awaitable[tuple[Any, Any]]) -> tuple[Any, Any]:
        """The ``(node, slot)`` that ``acquire`` gives, if the caller still holds a token
        then (``still_authorized``); else the slot goes back and ``CallerRevoked`` is raised,
        the request answered 401 already (so its ``no_node`` answer sends nothing)."""
        node, slot = await acquire
        if self.still_authorized():
            return node, slot
        self.state.registry.release(slot)
        raise CallerRevoked()

    def still_authorized(self) -> bool:
        """After a wait (queued for a slot): whether the caller still may go on, should a
        reload (SIGHUP, EXTENSIONS §6) have changed the tokens since its head was checked;
        else 401. As on a server, identities match by name: a request whose identity kept
        its name under a new token goes on (a server's waiting ``/execute`` runs; soak2
        found the router refusing it), one whose name was revoked does not. A changed
        ``admin`` mark counts too."""
        if self.state.authenticator is self.checked_with:
            return True
        identity = self.authenticate()
        if identity is None and self.identity is not None:
            identity = self.state.authenticator.identities().get(self.identity.name)
        if identity is None:
            self.send_router_error(401, "unauthorized", UNAUTHORIZED_MESSAGE, "request_rejected")
            return False
        self.identity = identity
        return True

    def authenticate(self) -> Identity | None:
        """The caller's identity from its client token; None: 401."""
        return self.state.authenticator.authenticate(
            self.request.headers.get("Authorization"), None
        )

    def data_received(self, chunk: bytes) -> Awaitable[None] | None:
        """A route without a body drops what arrives (at most ``SMALL_BODY_BYTES``); the
        routes that read one (``ForwardHandler``) override this."""
        return None

    def take_no_body(self) -> None:
        """``settle_unread_body`` for this route, with its 413."""
        timeout = self.state.settings.request_head_timeout_seconds
        if not settle_unread_body(self, timeout):
            self.send_router_error(413, "request_too_large", TOO_LARGE_MESSAGE, "request_rejected")

    def send_router_error(
        self,
        status: int,
        kind: str,
        message: str,
        reason: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        if self._finished:
            return
        self.clear()
        self.finish_reason = self.finish_reason or reason
        self.finish(error_answer(self, self.request_id, status, kind, message, headers))

    def send_json(self, status: int, body: Any) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(dumps_compact(body))

    def on_finish(self) -> None:
        self.log_finished()

    def log_finished(self) -> None:
        if getattr(self, "_logged", False):
            return
        self._logged = True
        reason = self.finish_reason or "completed"
        level = "INFO" if reason == "completed" else "WARNING"
        path = self.request.path
        status = self.get_status()
        if reason == "client_disconnected" and not self._headers_written:
            # Nothing was answered: 499, as the server logs it (SERVER §13), not Tornado's
            # default 200, which a dashboard showed as a success (ROUTER §10).
            status = CLIENT_CLOSED_REQUEST
        self.state.log.event(
            "request_finished",
            level=level,
            request_id=self.request_id,
            # The spec'd line is /execute's; other endpoints add their method and path.
            method=None if path == "/execute" else self.request.method,
            path=None if path == "/execute" else path,
            node=self.node,
            select=format_selector(self.selector) or None,  # canonical: never the raw header
            http_status=status,
            queue_wait_ms=round(self.queue_waited_ms(), 1),
            duration_ms=round((time.monotonic() - self.received_at) * 1000, 1),
            request_bytes=self.request_bytes,
            response_bytes=self.response_bytes,
            finish_reason=reason,
        )

    def queue_waited_ms(self) -> float:
        """How long the request waited for a node: while it still waits (its client left,
        the router stops), the wait so far; a line written then said 0.0, and the queue-wait
        histogram missed it."""
        if self.waiting_for_node:
            return (time.monotonic() - self.received_at) * 1000
        return self.queue_wait_ms


class NotFoundHandler(RouterHandler):
    """Unknown paths: 404 ``not_found`` (after the token check, so paths cannot be probed)."""

    ALLOWED = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")

    def prepare(self) -> None:
        if self.check_request():
            self.send_router_error(404, "not_found", "not found", "request_rejected")
        self.take_no_body()  # answered either way: its body is never read
