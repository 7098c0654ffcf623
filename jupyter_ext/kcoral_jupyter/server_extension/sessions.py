"""``GET sessions`` (every server's sessions, EXTENSIONS §11), ``GET sessions/{id}`` (one
session's record) and ``DELETE sessions/{id}`` (ends it).

Who can reach them: callers the Jupyter server authenticates (``base_handler``, whose XSRF
check keeps another site's page from stopping a session); they see and stop what the KCoral
tokens configured here may (an admin token: every session). A session id that is not a
plain token (letters, digits, ``-``, ``_``) is refused before any server is asked, so no id
can reach another upstream route.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any
from urllib.parse import quote

import tornado.web

from kcoral_jupyter.server_extension.base_handler import KCoralHandler
from kcoral_jupyter.server_extension.upstream_problems import refusal_problem

# Session ids are UUID4s (EXTENSIONS §11); anything else is no session of any server.
SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,128}", re.ASCII)


class SessionsHandler(KCoralHandler):
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


class SessionHandler(KCoralHandler):
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
