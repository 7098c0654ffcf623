"""GET /metrics on a router (EXTENSIONS §13): the router's own metrics.

Who can read them: as on a server (``kcoral_server.front_door.handlers.metrics``): never a
web page; a client token's holder or the ``--metrics-token``'s, which opens nothing else (the
other router endpoints check client tokens only); everyone on a router without client tokens.
A scrape that succeeds is not logged as a request (one line every few seconds would drown the
log); refusals are.
"""

from __future__ import annotations

from kcoral_server.front_door.callers import Identity
from kcoral_server.metrics.scrape import answer_scrape, scraper
from kcoral_server.router.auth import RouterHandler


class RouterMetricsHandler(RouterHandler):
    ALLOWED = ("GET",)

    def authenticate(self) -> Identity | None:
        found = scraper(
            self.request.headers.get("Authorization"), self.state.settings.metrics_token
        )
        return found if found is not None else super().authenticate()

    def prepare(self) -> None:
        self.check_request()
        self.take_no_body()

    def get(self) -> None:
        answer_scrape(self, self.state.metrics.exposition())

    def on_finish(self) -> None:
        if self.get_status() != 200:
            self.log_finished()
