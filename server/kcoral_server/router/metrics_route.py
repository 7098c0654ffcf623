"""GET /metrics on a router (EXTENSIONS §13): the router's own metrics.

Who can read them: as on a server (``kcoral_server.front_door.handlers.metrics``): never a
web page; a client token's holder or the ``--metrics-token``'s, which opens nothing else (the
other router endpoints check client tokens only); everyone on a router without client tokens.
A scrape that succeeds is not logged as a request (one line every few seconds would drown the
log); refusals are.
"""

from __future__ import annotations

import hmac

from prometheus_client import CONTENT_TYPE_LATEST

from kcoral_server.front_door.callers import Identity
from kcoral_server.router.auth import RouterHandler

#: whom a request carrying the metrics token is (it reaches only this handler)
SCRAPER = Identity("metrics")


class RouterMetricsHandler(RouterHandler):
    ALLOWED = ("GET",)

    def authenticate(self) -> Identity | None:
        token = self.state.settings.metrics_token
        if token is not None:
            given = (self.request.headers.get("Authorization") or "").encode(
                "utf-8", "surrogateescape"
            )
            if hmac.compare_digest(given, f"Bearer {token}".encode()):
                return SCRAPER
        return super().authenticate()

    def prepare(self) -> None:
        self.check_request()

    def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.set_header("Cache-Control", "no-store")
        self.finish(self.state.metrics.exposition())

    def on_finish(self) -> None:
        if self.get_status() != 200:
            self.log_finished()
