"""``GET jobs/{id}/events``: a job's Server-Sent Events, relayed to the browser as they
arrive.

Who can reach it: callers the Jupyter server authenticates (``base_handler``), at most
``c.KCoralExtension.max_event_streams`` at once. The job id is percent-encoded into one
path segment; the KCoral server's answer is relayed only when it is one to pass on (no
redirect is followed, an answer without a body is a 502 in words: ``upstream_problems``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from urllib.parse import quote

import tornado.web
from tornado.httpclient import HTTPClientError, HTTPRequest

from kcoral_jupyter.server_extension.base_handler import KCoralHandler
from kcoral_jupyter.server_extension.relay_client import RelayClient
from kcoral_jupyter.server_extension.upstream_problems import transport_problem, unusable_answer

EVENTS_TIMEOUT_SECONDS = 24 * 3600.0


class JobEventsHandler(KCoralHandler):
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
