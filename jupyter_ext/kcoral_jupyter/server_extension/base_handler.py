"""What every handler of the extension shares: the server list, calls to a KCoral server,
JSON errors.

Who reaches this code: only callers the Jupyter server authenticates (``APIHandler``: its
token or login cookie, and the XSRF check that keeps another site's page from using that
cookie to stop a session or cancel a job; each route's method is also
``tornado.web.authenticated``). They act with the KCoral tokens configured here, so they
see and stop what those tokens' identities may (an admin token: every session); the tokens
stay in this process, the browser sees only names. Only JupyterLab's own page calls these
routes: a request the browser marks as another origin's page's (``Sec-Fetch-Site``
``cross-site`` or ``same-site``) is refused (403), whatever it carries. Jupyter's checks
leave one door: a page on another port of the same host (same-site, so the browser sends
the login cookie) loads a route as a ``<script>`` or ``<img>``, with no ``Origin``, and a
page of any site navigates a tab to one (the cookie goes with a top-level ``GET``): the
route then ran with the user's KCoral tokens (a live-output relay held open, the servers
polled), though the page read nothing.

What a configured KCoral server can make this process do: answer these calls, nothing more.
A redirect is never followed (a server could otherwise send the calls, with the user's
Cancel, to any address the Jupyter host reaches), an answer without a body (204, 304) is a
502 with a message, and ``/health`` or ``/v1/info`` that is not a JSON object is that
server's ``error`` (``upstream_problems``), never a failure of the whole list. An answer
is read up to ``MAX_ANSWER_BYTES``: past it, the rest is read and dropped (Tornado's own
bound, 100 MB, ends the transfer), so a server answering a poll with hundreds of MB holds
this process's memory to the bound, and its card says it answered too much.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import tornado.web
from jupyter_server.base.handlers import APIHandler
from tornado.httpclient import HTTPClientError, HTTPRequest, HTTPResponse

from kcoral_jupyter.server_extension.upstream_problems import transport_problem, unusable_answer

if TYPE_CHECKING:
    from kcoral_jupyter.server_extension import KCoralExtension


#: the most of one answer the extension keeps: a /v1/jobs list of ~30,000 jobs
MAX_ANSWER_BYTES = 16 << 20
#: ``Sec-Fetch-Site`` of a request another origin's page made (browsers send it to loopback
#: and HTTPS addresses; JupyterLab's own requests say ``same-origin``)
FOREIGN_SITES = frozenset({"cross-site", "same-site"})


class BoundedBody:
    """A fetch's ``streaming_callback``: keeps the body up to ``limit`` bytes; past it,
    keeps nothing and says so (``over``). Raising there instead would make Tornado log a
    traceback and report only a closed connection."""

    def __init__(self, limit: int = MAX_ANSWER_BYTES) -> None:
        self.limit = limit
        self.data = bytearray()
        self.over = False

    def __call__(self, chunk: bytes) -> None:
        if self.over:
            return
        if len(self.data) + len(chunk) > self.limit:
            self.over = True
            self.data = bytearray()
            return
        self.data.extend(chunk)


class KCoralHandler(APIHandler):
    """Shared plumbing: settings, upstream calls and JSON errors."""

    async def prepare(self) -> None:  # type: ignore[override]  # as Jupyter's APIHandler
        await super().prepare()  # Jupyter's Host, login and Origin checks
        site = self.request.headers.get("Sec-Fetch-Site", "").strip().lower()
        if site in FOREIGN_SITES:
            raise tornado.web.HTTPError(
                403, f"KCoral routes answer only JupyterLab's own page (Sec-Fetch-Site {site!r})"
            )

    @property
    def extension(self) -> KCoralExtension:
        return self.settings["kcoral_extension"]

    def servers(self) -> list[dict[str, Any]]:
        servers = self.extension.resolved_servers()
        wanted = self.get_query_argument("server", None)
        if wanted is not None:
            servers = [s for s in servers if s["name"] == wanted]
            if not servers:
                raise tornado.web.HTTPError(404, f"no KCoral server named {wanted!r}")
        return servers

    async def upstream(
        self, server: dict[str, Any], method: str, path: str
    ) -> tuple[int, Any, str]:
        """(status, decoded JSON or None, error text) of one call; never raises."""
        status, document, error, _ = await self.upstream_timed(server, method, path)
        return status, document, error

    async def upstream_timed(
        self, server: dict[str, Any], method: str, path: str
    ) -> tuple[int, Any, str, float | None]:
        """``upstream``'s answer plus the server's clock when it answered (its ``Date``
        header, Unix seconds; None when it sent none)."""
        if server.get("problem"):  # a configured address that is no server address
            return 0, None, str(server["problem"]), None
        headers = {"Accept": "application/json"}
        if server.get("token"):
            headers["Authorization"] = f"Bearer {server['token']}"
        body = BoundedBody()
        request = HTTPRequest(
            server["url"] + path,
            method=method,
            headers=headers,
            request_timeout=self.extension.request_timeout,
            allow_nonstandard_methods=True,
            follow_redirects=False,
            streaming_callback=body,
        )
        try:
            client = self.extension.client_for(server["url"])
            response: HTTPResponse = await client.fetch(request, raise_error=False)
        except (OSError, HTTPClientError, asyncio.TimeoutError) as exc:
            timeout = self.extension.request_timeout
            return 0, None, transport_problem(exc, server["url"], timeout), None
        if response.code == 599:
            error = response.error or OSError("no answer")
            return (
                0,
                None,
                transport_problem(error, server["url"], self.extension.request_timeout),
                None,
            )
        clock = _date_header_seconds(response)
        problem = unusable_answer(response.code, response.headers.get("Location"))
        if problem is None and body.over:
            problem = f"answered more than {MAX_ANSWER_BYTES >> 20} MiB, more than this panel reads"
        if problem is not None:
            return 502, {"error": {"kind": "server_answer", "message": problem}}, problem, clock
        try:
            document = json.loads(bytes(body.data) or b"null")
        except (ValueError, RecursionError):
            # not JSON, or nested deeper than the decoder goes (a few hundred KiB of '['):
            # that server's answer is unreadable, never a 500 for every server of the panel
            document = None
        return response.code, document, "", clock

    async def notebook_paths(self) -> dict[str, str]:
        """Kernel id -> the path of the notebook (or console) that runs it, from Jupyter's own
        session manager (Jupyter's word for a notebook-kernel pairing, not a KCoral session)."""
        try:
            pairings = await self.session_manager.list_sessions()
        except Exception:  # the names are a courtesy: never fail the panel's poll for them
            return {}
        paths: dict[str, str] = {}
        for record in pairings:
            kernel = record.get("kernel") or {}
            if isinstance(kernel.get("id"), str) and isinstance(record.get("path"), str):
                paths[kernel["id"]] = record["path"]
        return paths

    def write_json(self, status: int, document: Any) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(document))

    async def find(self, path: str) -> tuple[dict[str, Any], int, Any, float | None] | None:
        """The server that knows ``path`` (the one answering 200), with that answer and its
        clock; else the first other answer than 404, else the first that answered what is
        not passed on (a redirect: the 502 that says so), so that such a server hides no
        other's job. When no server answered at all: 502, saying why the first cannot be
        asked.

        Every server is asked: a job or session lives on one, so when two claim an id one
        of them answers 200 to ids it never gave (a malicious or broken server listed
        before the real one would otherwise take the user's Cancel, and the job run on).
        Then no server is believed: 409, naming them; ``?server=`` picks one."""
        claims: list[tuple[dict[str, Any], int, Any, float | None]] = []
        other = unusable = None
        unreachable: list[str] = []  # why each server that did not answer could not be asked
        servers = self.servers()
        # All at once: a server that does not answer costs one timeout, not one per lookup.
        answers = await asyncio.gather(
            *(self.upstream_timed(server, "GET", path) for server in servers)
        )
        for server, (status, document, error, clock) in zip(servers, answers, strict=True):
            if not status:
                unreachable.append(error)
            elif error:  # upstream_timed's own 502 for an answer not passed on
                unusable = unusable or (server, status, document, clock)
            elif status == 200:
                claims.append((server, status, document, clock))
            elif status not in (404, 405):
                other = other or (server, status, document, clock)
        if any(not _same_record(claims[0][2], claim[2]) for claim in claims[1:]):
            names = ", ".join(repr(claim[0]["name"]) for claim in claims)
            raise tornado.web.HTTPError(
                409, f"servers {names} all claim it; choose one with ?server=NAME"
            )
        if servers and len(unreachable) == len(servers):
            # No server answered: the one that knows it may be down, so none is "no server
            # knows it" (a 404, which also ends the panel's live output for good).
            raise tornado.web.HTTPError(502, unreachable[0])
        return claims[0] if claims else other or unusable

    async def find_job(self, job_id: str) -> tuple[dict[str, Any], int, Any] | None:
        """The server that knows ``job_id``, with its answer (``find``)."""
        found = await self.find(f"/v1/jobs/{quote(job_id, safe='')}")
        return None if found is None else found[:3]

    def not_found(self, job_id: str, what: str = "job") -> None:
        self.write_json(
            404,
            {
                "error": {
                    "kind": "not_found",
                    "message": f"no KCoral server knows {what} {job_id[:80]}",
                }
            },
        )


def _same_record(first: Any, second: Any) -> bool:
    """Whether two servers' answers describe the same job or session: one server listed
    under two names (two spellings of its address, a router and one of its nodes). A job
    record's ``request_id`` and a session's ``created_at`` are what a server that answers
    for ids it never gave cannot know."""
    if not isinstance(first, dict) or not isinstance(second, dict):
        return False
    return any(
        first.get(key) not in (None, "") and first.get(key) == second.get(key)
        for key in ("request_id", "created_at")
    )


def _date_header_seconds(response: HTTPResponse) -> float | None:
    """The upstream server's clock (its ``Date`` header) in Unix seconds, or None."""
    value = response.headers.get("Date")
    if not value:
        return None
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
