"""What a scrape of ``GET /metrics`` is, on a server and on a router alike (EXTENSIONS §13):
who the metrics token makes a request, and the answer it gets.

The metrics token opens ``/metrics`` and nothing else: only the two metrics handlers call
``scraper``; every other endpoint checks client tokens only.
"""

from __future__ import annotations

from tornado.web import RequestHandler

from kcoral_server.front_door.callers import Identity
from kcoral_server.router.identity import bearer_matches

#: whom a request carrying the metrics token is (it reaches only the metrics handlers)
SCRAPER = Identity("metrics")

#: what ``generate_latest`` writes (its default escaping keeps every name 0.0.4 text), named
#: here rather than taken from the library: its ``CONTENT_TYPE_LATEST`` became
#: ``version=1.0.0`` in newer prometheus-client releases while the body stayed the same
EXPOSITION_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def scraper(authorization: str | None, metrics_token: str | None) -> Identity | None:
    """``SCRAPER`` when ``authorization`` bears the configured metrics token (compared in
    constant time); ``None`` otherwise, and always when no metrics token is configured."""
    if metrics_token is not None and bearer_matches(authorization, metrics_token):
        return SCRAPER
    return None


def answer_scrape(handler: RequestHandler, exposition: bytes) -> None:
    """Finish ``handler`` with the exposition text, never cached by anything in between."""
    handler.set_header("Content-Type", EXPOSITION_CONTENT_TYPE)
    handler.set_header("Cache-Control", "no-store")
    handler.finish(exposition)
