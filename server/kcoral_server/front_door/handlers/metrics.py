"""GET /metrics: the server's Prometheus metrics (EXTENSIONS §13).

Who can read them: a web page never (the browser guard, as everywhere); where client tokens
are configured, a client token's holder, or the holder of ``--metrics-token``, which opens
this endpoint and no other (it is not a client token: ``/execute`` answers it 401); a server
without client tokens listens on loopback and serves everyone who may run programs there,
and then also this. On a node's child (ROUTER §12) the router secret opens it, as every
endpoint there (the child holds no client token and gets no ``KCORAL_METRICS_TOKEN``): the
supervisor reads it with that secret and sends it up its status stream
(``kcoral_server.node.metrics_fetch``). The text holds counts only: no token, identity,
request id or program.
"""

from __future__ import annotations

from kcoral_server.front_door.callers import Identity
from kcoral_server.front_door.handlers.base import BaseHandler
from kcoral_server.metrics.scrape import answer_scrape, scraper


class MetricsHandler(BaseHandler):
    ALLOWED = ("GET",)

    def authenticate(self) -> Identity | None:
        found = scraper(self.request.headers.get("Authorization"), self.state.config.metrics_token)
        return found if found is not None else super().authenticate()

    def get(self) -> None:
        answer_scrape(self, self.state.metrics.exposition())
