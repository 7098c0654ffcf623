"""Jupyter server extension: REST handlers under ``{base_url}kcoral/api/``.

| route | answer |
|---|---|
| `GET servers` | servers with `/health`, `/v1/info`, a `label`, `kernels`, `notebooks` |
| `GET jobs` | recent jobs of every server that offers the jobs API, each tagged with `server` |
| `GET jobs/{id}` | one job's state; `DELETE jobs/{id}` cancels it |
| `GET jobs/{id}/events` | the job's Server-Sent Events, relayed as they arrive |
| `GET sessions` | every server's sessions (EXTENSIONS §11), tagged with `server`, `observed_at` |
| `GET sessions/{id}` | one session's record; `DELETE sessions/{id}` ends it |

Servers come from ``c.KCoralExtension.servers = [{"name": ..., "url": ..., "token": ...}]``;
when none are configured: ``KCORAL_URL`` (with ``KCORAL_TOKEN``) and the embedded servers
that kernels advertise in the runtime directory, each with its own token from its 0600
advertisement (EXTENSIONS §6). Whatever is configured, every server a live kernel says it
uses (``runtime_records.kernel_connections``: its embedded server, or the URL it connected
to) is listed too, with the ids of those kernels in ``kernels``, so that the status bar can
show the server of the notebook in focus. Tokens stay in this process: the browser sees
only names. ``kernels``: the ids of the live kernels that use a server; ``notebooks``: their
notebooks. A server that cannot be asked is described in one line of words
(``upstream_problems``), and each gets a ``label`` (``server_labels``): its configured name,
"local server of NOTEBOOK", or its URL. A configured address that is no server address is
listed with its ``error`` (and a warning in the Jupyter server's log), never asked.
``?server=NAME`` picks one server for the job and session routes; otherwise each server is
asked in turn.

Who can reach these routes: only callers the Jupyter server authenticates (``APIHandler``:
its token or login cookie, and the XSRF check that keeps another site's page from using that
cookie to stop a session or cancel a job). They act with the KCoral tokens configured here,
so they see and stop what those tokens' identities may (an admin token: every session).
Job ids from the browser are percent-encoded into one path segment; a session id that is
not a plain token (letters, digits, ``-``, ``_``) is refused before any server is asked, so
no id can reach another upstream route.

What a configured KCoral server can make this process do: answer these calls, nothing more.
A redirect is never followed (a server could otherwise send the calls, with the user's
Cancel, to any address the Jupyter host reaches), an answer without a body (204, 304) is a
502 with a message, and ``/health`` or ``/v1/info`` that is not a JSON object is that
server's ``error`` (``upstream_problems``), never a failure of the whole list.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import re
from collections.abc import Awaitable
from typing import Any
from urllib.parse import quote

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest, HTTPResponse
from traitlets import Dict, Float, Int, List
from traitlets.config import LoggingConfigurable

from kcoral.connection.server_address import server_url
from kcoral_jupyter.local_server import advertised_servers
from kcoral_jupyter.relay_client import RelayClient
from kcoral_jupyter.runtime_records import kernel_connections
from kcoral_jupyter.server_labels import notebooks_of, server_label
from kcoral_jupyter.upstream_problems import (
    address_problem,
    refusal_problem,
    transport_problem,
    unusable_answer,
)

EVENTS_TIMEOUT_SECONDS = 24 * 3600.0
# Session ids are UUID4s (EXTENSIONS §11); anything else is no session of any server.
SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,128}", re.ASCII)


class KCoralExtension(LoggingConfigurable):
    """Which KCoral servers the Jupyter server shows and proxies."""

    servers = List(
        Dict(),
        help='Servers as [{"name": "gpu", "url": "http://host:8000", "token": "..."}].',
    ).tag(config=True)
    request_timeout = Float(10.0, help="Seconds for one proxied non-streaming call.").tag(
        config=True
    )
    max_event_streams = Int(
        16, help="Job output streams relayed at once; one more is answered 503."
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.open_event_streams = 0  # relays running now (JobEventsHandler)
        self._warned: set[str] = set()

    def resolved_servers(self) -> list[dict[str, Any]]:
        """The configured servers (else KCORAL_URL and the kernels' embedded servers), plus
        every server a live kernel uses, each with ``kernels``: the ids of those kernels."""
        found = self._configured_or_advertised()
        by_url = {entry["url"]: entry for entry in found}
        connections = kernel_connections()
        # An embedded server belongs to the kernel that started it, even once that kernel
        # has connected elsewhere (its label names that kernel's notebook).
        kernel_of_pid = {r.get("kernel_pid"): str(r["kernel_id"]) for r in connections}
        for listed in found:
            if "owner_pid" in listed:
                owner = kernel_of_pid.get(listed.pop("owner_pid"))
                if owner is not None:
                    listed["owner_kernel"] = owner
        for record in connections:
            url = str(record["url"]).rstrip("/")
            known = by_url.get(url)
            if known is not None:
                entry = known
            else:
                kind = "local" if record.get("embedded") else "kernel"
                entry = {
                    "name": f"{kind}-{str(record['kernel_id'])[:8]}",
                    "url": url,
                    "token": str(record.get("token") or ""),
                    "embedded": bool(record.get("embedded")),
                }
                if record.get("embedded"):
                    entry["owner_kernel"] = str(record["kernel_id"])
                by_url[url] = entry
                found.append(entry)
            entry.setdefault("kernels", []).append(str(record["kernel_id"]))
        return found

    def _configured_or_advertised(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        if self.servers:
            for index, entry in enumerate(self.servers):
                name = str(entry.get("name") or f"server{index}")
                where = f"c.KCoralExtension.servers[{index}] ({name!r})"
                listed = self._listed(name, entry.get("url"), str(entry.get("token") or ""), where)
                found.append(listed)
            return found
        if os.environ.get("KCORAL_URL", "").strip():
            token = os.environ.get("KCORAL_TOKEN", "")
            found.append(self._listed("default", os.environ["KCORAL_URL"], token, "KCORAL_URL"))
        for record in advertised_servers():
            found.append(
                {
                    "name": f"local-{record.get('kernel_pid')}",
                    "url": str(record["url"]),
                    "embedded": True,
                    "owner_pid": record.get("kernel_pid"),
                    # The embedded server's own token (never the user's KCORAL_TOKEN).
                    "token": str(record.get("token") or ""),
                }
            )
        return found

    def _listed(self, name: str, address: object, token: str, where: str) -> dict[str, Any]:
        """A configured server as listed: its address as a URL, by the rule every entry point
        shares (``kcoral.connection.server_address``); one the rule refuses keeps its text,
        gets a ``problem`` (the panel's ``error``; it is never asked) and a warning, once."""
        try:
            return {"name": name, "url": server_url(address), "token": token}
        except (TypeError, ValueError) as exc:
            reason: BaseException = exc if address else ValueError("it has no url")
            problem = address_problem(reason, where)
        if problem not in self._warned:
            self._warned.add(problem)
            self.log.warning("KCoral: %s is not used: %s", where, problem)
        return {"name": name, "url": str(address or "")[:200], "token": "", "problem": problem}


class _KCoralHandler(APIHandler):
    """Shared plumbing: settings, upstream calls and JSON errors."""

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
        request = HTTPRequest(
            server["url"] + path,
            method=method,
            headers=headers,
            request_timeout=self.extension.request_timeout,
            allow_nonstandard_methods=True,
            follow_redirects=False,
        )
        try:
            response: HTTPResponse = await AsyncHTTPClient().fetch(request, raise_error=False)
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
        if problem is not None:
            return 502, {"error": {"kind": "server_answer", "message": problem}}, problem, clock
        try:
            document = json.loads(response.body or b"null")
        except ValueError:
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
        """The server that knows ``path`` (its first answer other than 404), with that
        answer and its clock; else the first that answered what is not passed on (a
        redirect: the 502 that says so), so that such a server hides no other's job."""
        unusable = None
        for server in self.servers():
            status, document, error, clock = await self.upstream_timed(server, "GET", path)
            if status and error:  # upstream_timed's own 502 for an answer not passed on
                unusable = unusable or (server, status, document, clock)
            elif status and status not in (404, 405):
                return server, status, document, clock
        return unusable

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


def _date_header_seconds(response: HTTPResponse) -> float | None:
    """The upstream server's clock (its ``Date`` header) in Unix seconds, or None."""
    value = response.headers.get("Date")
    if not value:
        return None
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None


class ServersHandler(_KCoralHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        servers = self.servers()
        paths = await self.notebook_paths()

        async def describe(server: dict[str, Any]) -> dict[str, Any]:
            (h_status, health, h_error), (i_status, info, i_error) = await asyncio.gather(
                self.upstream(server, "GET", "/health"), self.upstream(server, "GET", "/v1/info")
            )
            # What the server sent, used only as the object the panel reads.
            health_ok = h_status == 200 and isinstance(health, dict)
            info_ok = i_status == 200 and isinstance(info, dict)
            features = info.get("features") if info_ok else None
            notebooks = notebooks_of(server.get("kernels", []), paths)
            owners = notebooks_of([server.get("owner_kernel", "")], paths)
            entry: dict[str, Any] = {
                "name": server["name"],
                "label": server_label(server, owners),
                "notebooks": notebooks,
                "url": server["url"],
                "auth": bool(server.get("token")),
                "health": health if health_ok else None,
                "info": info if info_ok else None,
                "features": [f for f in features if isinstance(f, str)]
                if isinstance(features, list)
                else [],
                "reachable": h_status != 0,
                "kernels": list(server.get("kernels", [])),
            }
            if h_status != 200:
                entry["error"] = h_error or refusal_problem(
                    h_status, health, bool(server.get("token"))
                )
            elif not health_ok:
                entry["error"] = "answered /health with something other than a JSON object"
            elif i_status in (401, 403):
                # /health answers anyone (PROTOCOL §12); the token is judged from here on,
                # and every cell, job and session would be refused the same way.
                entry["error"] = refusal_problem(i_status, info, bool(server.get("token")))
            elif i_error:  # a redirect, an answer without a body, no answer
                entry["error"] = f"/v1/info: {i_error}"
            elif i_status == 200 and not info_ok:
                entry["error"] = "answered /v1/info with something other than a JSON object"
            return entry

        described = await asyncio.gather(*(describe(s) for s in servers))
        self.write_json(200, {"servers": list(described)})


class JobsHandler(_KCoralHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        jobs: list[dict[str, Any]] = []
        errors: list[dict[str, str]] = []
        for server in self.servers():
            status, document, error = await self.upstream(server, "GET", "/v1/jobs")
            if status == 200 and isinstance(document, list):
                jobs += [
                    dict(job, server=server["name"]) for job in document if isinstance(job, dict)
                ]
            else:
                reason = error or (
                    "this server has no jobs API"
                    if status == 404
                    else refusal_problem(status, document, bool(server.get("token")))
                )
                errors.append({"server": server["name"], "message": reason})
        self.write_json(200, {"jobs": jobs, "errors": errors})


class JobHandler(_KCoralHandler):
    @tornado.web.authenticated
    async def get(self, job_id: str) -> None:
        found = await self.find_job(job_id)
        if found is None:
            return self.not_found(job_id)
        server, status, document = found
        if isinstance(document, dict) and status == 200:
            document = dict(document, server=server["name"])
        self.write_json(status, document)

    @tornado.web.authenticated
    async def delete(self, job_id: str) -> None:
        found = await self.find_job(job_id)
        if found is None:
            return self.not_found(job_id)
        server = found[0]
        status, document, error = await self.upstream(
            server, "DELETE", f"/v1/jobs/{quote(job_id, safe='')}"
        )
        if status == 0:
            return self.write_json(502, {"error": {"kind": "server_transport", "message": error}})
        self.write_json(status, document)


class JobEventsHandler(_KCoralHandler):
    """Relays the job's event stream chunk by chunk (``Last-Event-ID`` passed through).

    Each relay asks the KCoral server on a client of its own (``relay_client``), closed
    when the browser's connection closes: the upstream stream ends with the browser's, and
    abandoned streams never hold the shared client of the other routes. At most
    ``max_event_streams`` relays run at once (each holds a connection to a KCoral server);
    one more is answered 503 in words."""

    _client: RelayClient | None = None
    _gone = False  # the browser closed its connection

    @tornado.web.authenticated
    async def get(self, job_id: str) -> None:
        extension = self.extension
        if extension.open_event_streams >= extension.max_event_streams:
            message = (
                f"{extension.open_event_streams} live output streams are open, the most this "
                "Jupyter server relays at once (c.KCoralExtension.max_event_streams); close "
                "one and follow this job again"
            )
            return self.write_json(503, {"error": {"kind": "busy", "message": message}})
        extension.open_event_streams += 1
        try:
            await self._relay(job_id)
        finally:
            extension.open_event_streams -= 1

    def on_connection_close(self) -> None:
        self._gone = True
        if self._client is not None:
            self._client.close()  # ends the upstream request (its fetch fails)
        super().on_connection_close()

    async def _relay(self, job_id: str) -> None:
        found = await self.find_job(job_id)
        if found is None:
            return self.not_found(job_id)
        if self._gone:
            return
        server = found[0]
        headers = {"Accept": "text/event-stream"}
        if server.get("token"):
            headers["Authorization"] = f"Bearer {server['token']}"
        last = self.request.headers.get("Last-Event-ID")
        if last:
            headers["Last-Event-ID"] = last
        status = 0
        location: str | None = None

        def on_header(line: str) -> None:
            nonlocal status, location
            if line.startswith("HTTP/") and not status:
                try:
                    status = int(line.split()[1])
                except (IndexError, ValueError):
                    status = 502
                if unusable_answer(status, "") is None:
                    self.set_status(status)
            elif line.lower().startswith("location:"):
                location = line.split(":", 1)[1].strip()

        def on_chunk(chunk: bytes) -> Awaitable[None] | None:
            if self._gone or unusable_answer(status, "") is not None:
                return None
            self.write(chunk)
            # The next chunk is read once the browser took this one; if the browser is gone
            # the flush fails, and so does the upstream request.
            return self.flush()

        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        request = HTTPRequest(
            server["url"] + f"/v1/jobs/{quote(job_id, safe='')}/events",
            headers=headers,
            connect_timeout=self.extension.request_timeout,
            request_timeout=EVENTS_TIMEOUT_SECONDS,
            follow_redirects=False,
            header_callback=on_header,
            streaming_callback=on_chunk,
        )
        self._client = RelayClient(force_instance=True)
        problem = None
        try:
            await self._client.fetch(request, raise_error=False)
        except (OSError, HTTPClientError, asyncio.TimeoutError) as exc:
            # The stream ended; a browser reconnects with Last-Event-ID.
            if not status:
                timeout = self.extension.request_timeout
                problem = transport_problem(exc, server["url"], timeout)
        finally:
            self._client.close()
        problem = problem or unusable_answer(status, location)
        if self._gone or self._finished:
            return
        if problem:
            return self.write_json(502, {"error": {"kind": "server_answer", "message": problem}})
        self.finish()


class SessionsHandler(_KCoralHandler):
    """Every server's sessions. Each record gains ``server`` and ``observed_at``: the
    KCoral server's clock when it answered, so the panel counts idle time and the time
    left before the idle timeout on that clock, not on the browser's (they may differ)."""

    @tornado.web.authenticated
    async def get(self) -> None:
        async def listed(server: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
            status, document, error, clock = await self.upstream_timed(
                server, "GET", "/v1/sessions"
            )
            if status == 200 and isinstance(document, list):
                records = [_tagged(r, 200, server, clock) for r in document if isinstance(r, dict)]
                return records, None
            if status == 0:
                return [], None  # unreachable: its server card already says so
            # A refused token is worth a line in the panel (its /v1/info would be refused
            # too); otherwise a server that does not offer sessions contributes nothing.
            if status not in (401, 403):
                _, info, _ = await self.upstream(server, "GET", "/v1/info")
                features = info.get("features") if isinstance(info, dict) else None
                if not isinstance(features, list) or "sessions" not in features:
                    return [], None
            return [], error or refusal_problem(status, document, bool(server.get("token")))

        servers = self.servers()
        answers = await asyncio.gather(*(listed(server) for server in servers))
        sessions: list[dict[str, Any]] = []
        errors: list[dict[str, str]] = []
        for server, (records, problem) in zip(servers, answers, strict=True):
            sessions += records
            if problem:
                errors.append({"server": server["name"], "message": problem})
        self.write_json(200, {"sessions": sessions, "errors": errors})


class SessionHandler(_KCoralHandler):
    """One session's record (``GET``), or ends it (``DELETE``, idempotent upstream)."""

    async def find_session(
        self, session_id: str
    ) -> tuple[dict[str, Any], int, Any, float | None] | None:
        """The server that knows ``session_id``, with its answer (``find``)."""
        if not SESSION_ID.fullmatch(session_id):
            return None
        return await self.find(_session_path(session_id))

    @tornado.web.authenticated
    async def get(self, session_id: str) -> None:
        found = await self.find_session(session_id)
        if found is None:
            return self.not_found(session_id, "session")
        server, status, document, clock = found
        self.write_json(status, _tagged(document, status, server, clock))

    @tornado.web.authenticated
    async def delete(self, session_id: str) -> None:
        found = await self.find_session(session_id)
        if found is None:
            return self.not_found(session_id, "session")
        server = found[0]
        status, document, error, clock = await self.upstream_timed(
            server, "DELETE", _session_path(session_id)
        )
        if status == 0:
            return self.write_json(502, {"error": {"kind": "server_transport", "message": error}})
        self.write_json(status, _tagged(document, status, server, clock))


def _session_path(session_id: str) -> str:
    # Checked against SESSION_ID already; quoted all the same, as one path segment.
    return f"/v1/sessions/{quote(session_id, safe='')}"


def _tagged(document: Any, status: int, server: dict[str, Any], clock: float | None) -> Any:
    """A session record as the panel reads it: with its ``server`` and ``observed_at``."""
    if isinstance(document, dict) and status == 200:
        return dict(document, server=server["name"], observed_at=clock)
    return document


def handlers(base_url: str) -> list[tuple[str, type]]:
    api = url_path_join(base_url, "kcoral", "api")
    job = r"(?P<job_id>[^/]+)"
    session = r"(?P<session_id>[^/]+)"
    return [
        (url_path_join(api, "servers"), ServersHandler),
        (url_path_join(api, "jobs"), JobsHandler),
        (url_path_join(api, "jobs", job), JobHandler),
        (url_path_join(api, "jobs", job, "events"), JobEventsHandler),
        (url_path_join(api, "sessions"), SessionsHandler),
        (url_path_join(api, "sessions", session), SessionHandler),
    ]


def load_server_extension(serverapp: Any) -> None:
    """Add the handlers to the Jupyter server's web application."""
    extension = KCoralExtension(config=serverapp.config, parent=serverapp)
    web_app = serverapp.web_app
    web_app.settings["kcoral_extension"] = extension
    web_app.add_handlers(".*$", handlers(web_app.settings["base_url"]))
    serverapp.log.info("KCoral server extension loaded (%d servers)", len(extension.servers))
