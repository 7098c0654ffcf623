"""GET /metrics: the server's Prometheus metrics (EXTENSIONS §13).

Who can read them: a web page never (the browser guard, as everywhere); where client tokens
are configured, a client token's holder, or the holder of ``--metrics-token``, which opens
this endpoint and no other (it is not a client token: ``/execute`` answers it 401); a server
without client tokens listens on loopback and serves everyone who may run programs there,
and then also this. The text holds counts only: no token, identity, request id or program.
"""

from __future__ import annotations

import hmac

from prometheus_client import CONTENT_TYPE_LATEST

from kcoral_server.front_door.callers import Identity
from kcoral_server.front_door.handlers.base import BaseHandler

#: whom a request carrying the metrics token is (it reaches only this handler)
SCRAPER = Identity("metrics")


class MetricsHandler(BaseHandler):
    ALLOWED = ("GET",)

    def authenticate(self) -> Identity | None:
        token = self.state.config.metrics_token
        if token is not None:
            given = (self.request.headers.get("Authorization") or "").encode(
                "utf-8", "surrogateescape"
            )
            if hmac.compare_digest(given, f"Bearer {token}".encode()):
                return SCRAPER
        return super().authenticate()

    def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.set_header("Cache-Control", "no-store")
        self.finish(self.state.metrics.exposition())
