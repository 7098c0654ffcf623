"""What every HTTP handler of a KCoral server and of a router answers alike, whatever
Tornado's own defaults would be.

* No ``Etag``: a conditional GET still gets 200 and the whole body (PROTOCOL §12), never
  Tornado's bodiless 304.
* A path argument (a job or session id) whose percent-decoded bytes are not UTF-8 is kept,
  not refused: it names no job or session anyone was given, so the route answers it as an
  unknown id (404 ``not_found``), after the browser guard and the token check like any
  request. Tornado's own refusal came before both, as a 400 the server's ``write_error``
  could only call an ``engine`` fault and the router's was an HTML page (fuzz audit).
"""

from __future__ import annotations

import tornado.web


class KCoralRequestHandler(tornado.web.RequestHandler):
    """Base of every handler the server and the router serve."""

    def compute_etag(self) -> None:
        return None

    def decode_argument(self, value: bytes, name: str | None = None) -> str:
        try:
            return super().decode_argument(value, name)
        except tornado.web.HTTPError:  # bytes that are not UTF-8
            return value.decode("utf-8", errors="replace")
