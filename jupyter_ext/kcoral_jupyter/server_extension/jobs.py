"""``GET jobs`` (every server's recent jobs, each with ``observed_at``: its server's clock
when it answered, Unix seconds, from its ``Date`` header), ``GET jobs/{id}`` (one job's state),
``DELETE jobs/{id}`` (cancels it) and ``GET jobs/{id}/error`` (why it failed).

Who can reach them: callers the Jupyter server authenticates (``base_handler``); a cancel
acts with the KCoral token configured for the server that knows the job. The job id from
the browser is percent-encoded into one path segment, so it can reach no other upstream
route. The job's live output is ``job_events``.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import tornado.web

from kcoral_jupyter.server_extension.base_handler import KCoralHandler
from kcoral_jupyter.server_extension.upstream_problems import refusal_problem


class JobsHandler(KCoralHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        jobs: list[dict[str, Any]] = []
        errors: list[dict[str, str]] = []
        servers = self.servers()
        # Every server at once, as the servers and sessions routes ask: one after another,
        # each server that accepts connections and never answers (a stopped process, or
        # one a kernel connected to that chose not to answer) held every other server's
        # jobs back by the request timeout, 10 s per such server.
        answers = await asyncio.gather(
            *(self.upstream_timed(server, "GET", "/v1/jobs") for server in servers)
        )
        for server, (status, document, error, clock) in zip(servers, answers, strict=True):
            if status == 200 and isinstance(document, list):
                # ``observed_at``: the server's clock when it answered, so that the panel
                # counts a running or queued job's time so far on that clock (its record
                # has no elapsed_ms before it ends), not on the browser's.
                jobs += [
                    dict(job, server=server["name"], observed_at=clock)
                    for job in document
                    if isinstance(job, dict)
                ]
            else:
                reason = error or (
                    "this server has no jobs API"
                    if status == 404
                    else refusal_problem(status, document, bool(server.get("token")))
                )
                errors.append({"server": server["name"], "message": reason})
        self.write_json(200, {"jobs": jobs, "errors": errors})


class JobHandler(KCoralHandler):
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


#: the most of a failed job's error message passed on (the panel shows one line of it)
ERROR_MESSAGE_CHARACTERS = 1000


class JobErrorHandler(KCoralHandler):
    """Why a finished job failed: ``{"kind", "message"}`` of its result's ``error``
    (PROTOCOL §7.6; a timed-out or ERROR job's answer has the same object), so that the
    panel can say it beside ``failed``: the job's live output never carries it. Nothing else
    of the result (outputs, values) is passed on. A job without one (still running,
    cancelled, completed) gets its server's answer as it is (409 ``not_finished``,
    ``cancelled``), or 404 kind ``no_error``."""

    @tornado.web.authenticated
    async def get(self, job_id: str) -> None:
        found = await self.find_job(job_id)
        if found is None:
            return self.not_found(job_id)
        status, document, error = await self.upstream(
            found[0], "GET", f"/v1/jobs/{quote(job_id, safe='')}/result"
        )
        if status == 0 or error:  # no answer, or one not passed on (upstream_problems)
            problem = {"kind": "server_answer", "message": error}
            return self.write_json(502, {"error": problem})
        failure = document.get("error") if isinstance(document, dict) else None
        if (status == 200 or status >= 500) and isinstance(failure, dict):
            kind, message = failure.get("kind"), failure.get("message")
            if isinstance(message, str):
                return self.write_json(
                    200,
                    {
                        "kind": kind if isinstance(kind, str) else "",
                        "message": message[:ERROR_MESSAGE_CHARACTERS],
                    },
                )
        if status == 200:
            message = f"job {job_id[:80]} has no error"
            return self.write_json(404, {"error": {"kind": "no_error", "message": message}})
        self.write_json(status, document)
