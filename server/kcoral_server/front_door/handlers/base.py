"""Shared handler behaviour: JSON errors, ``X-Request-ID``, ``Allow`` on 405, browser
refusals (``kcoral_server.front_door.browser_guard``), auth."""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Any

import tornado.web

from kcoral.protocol.headers import REQUEST_ID_HEADER, accept_request_id
from kcoral.protocol.strict_json import dumps_compact
from kcoral_server.execution.responses import Refusal
from kcoral_server.front_door.callers import DEFAULT, Identity

if TYPE_CHECKING:
    from kcoral_server.front_door.app import ServerState


UNAUTHORIZED = Refusal(401, "unauthorized", "missing or invalid bearer token", "rejected")


class BaseHandler(tornado.web.RequestHandler):
    """JSON bodies everywhere; ``ALLOWED`` methods, others get 405 with ``Allow``."""

    ALLOWED: tuple[str, ...] = ("GET",)
    PUBLIC = False  # True: no client token needed (EXTENSIONS §6)

    def initialize(self, state: ServerState) -> None:
        self.state = state
        self.request_id = accept_request_id(self.request.headers.get_list(REQUEST_ID_HEADER))
        self.identity: Identity = DEFAULT  # set by prepare() from the bearer token
        #: set when prepare() refused the request (403 or 401)
        self.early_refusal: Refusal | None = None

    def set_default_headers(self) -> None:
        self.set_header("Server", "kcoral")

    def compute_etag(self) -> None:
        """No ``Etag``: a conditional GET must still get 200 and the whole body (PROTOCOL
        §12), not Tornado's bodiless 304."""
        return None

    def prepare(self) -> None:
        self.set_header(REQUEST_ID_HEADER, self.request_id)
        # Web pages first (EXTENSIONS §6): even /health answers a foreign page nothing.
        refusal = self.state.browser_guard.refusal(self.request.headers)
        if refusal is not None:
            self.early_refusal = Refusal(403, "forbidden", refusal, "rejected")
            self.send_error_json(403, "forbidden", refusal)
            return
        # A node's child answers nothing without its router secret, not even the public
        # endpoints: /health and /internal/worker-status carry the server instance id, the
        # one value a holder of the node token lacked to open slots under this node's id
        # (ROUTER §12). The supervisor's probes and the tunnel present the secret.
        if not self.PUBLIC or self.state.authenticator.tunnel_only:
            identity = self.authenticate()
            if identity is None:
                self.early_refusal = UNAUTHORIZED
                self.send_error_json(UNAUTHORIZED.status, UNAUTHORIZED.kind, UNAUTHORIZED.message)
                return
            self.identity = identity
        if self.request.method not in self.ALLOWED:
            self.set_header("Allow", ", ".join(self.ALLOWED))
            self.send_error_json(405, "method_not_allowed", "method not allowed")

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

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        # Tornado's own errors (e.g. an unexpected exception) keep the JSON shape.
        if status_code == 405:
            self.set_header("Allow", ", ".join(self.ALLOWED))
        kind = {404: "not_found", 405: "method_not_allowed"}.get(status_code, "engine")
        message = {404: "not found", 405: "method not allowed"}.get(
            status_code, "internal server error"
        )
        self.set_header(REQUEST_ID_HEADER, self.request_id)
        self.set_header("Content-Type", "application/json")
        self.finish(
            dumps_compact(
                {
                    "status": "ERROR",
                    "request_id": self.request_id,
                    "error": {"kind": kind, "message": message},
                }
            )
        )

    def is_loopback_peer(self) -> bool:
        try:
            return ipaddress.ip_address(self.request.remote_ip or "").is_loopback
        except ValueError:
            return False

    def data_received(self, chunk: bytes) -> None:  # only stream handlers receive data
        pass


class NotFoundHandler(BaseHandler):
    """Any unknown path: 404 JSON (after the auth check, so paths are not probed freely)."""

    ALLOWED = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")

    def prepare(self) -> None:
        super().prepare()
        if not self._finished:
            self.send_error_json(404, "not_found", "not found")
