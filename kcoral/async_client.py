"""``AsyncClient``: the asyncio twin of ``Client`` (EXTENSIONS.md §4).

Request building, cache negotiation and response validation are the sync client's code
(``kcoral.negotiation``, ``kcoral.response``); this module only moves bytes with Tornado's
``AsyncHTTPClient``. Tornado is imported on first use, so ``import kcoral`` stays thin.

An ``AsyncHTTPClient`` belongs to one event loop, while an ``AsyncClient`` may be awaited
from several (``asyncio.run`` twice, or a helper thread for blocking calls): one HTTP client
is kept per loop and concurrency per loop is bounded by a semaphore, so callers queue on
the semaphore instead of timing out in Tornado's own queue.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kcoral.errors import KCoralError, TransportError
from kcoral.event_stream import EventSource, EventStreams
from kcoral.jobs import AsyncJob, check_job_id, next_submission_step, require_jobs
from kcoral.negotiation import Attempt, ExecuteNegotiation
from kcoral.response import (
    decode_health,
    decode_json_object,
    decode_target,
    error_from_response,
)

if TYPE_CHECKING:
    from kcoral.program import Program
    from kcoral.remote import RemoteFunction
    from kcoral.results import ProgramResult

#: Bodies at least this large are decoded (hashed, copied) off the event loop.
_DECODE_IN_THREAD_BYTES = 1 << 20
# Tornado refuses bodies above max_body_size; the server bounds responses itself.
_MAX_BODY_BYTES = 1 << 40
_TOKEN_ENV = "KCORAL_TOKEN"


@dataclass
class _LoopState:
    http: Any  # tornado.httpclient.AsyncHTTPClient
    slots: asyncio.Semaphore


class AsyncClient:
    """Asynchronous KCoral client; every method is a coroutine except ``function``."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        connect_timeout_seconds: float = 10.0,
        token: str | None = None,
        max_connections: int = 64,
    ) -> None:
        if not isinstance(base_url, str):
            raise TypeError(f"base_url must be a str, not {type(base_url).__name__}")
        if isinstance(max_connections, bool) or not isinstance(max_connections, int):
            raise TypeError("max_connections must be an int")
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.base_url = base_url.rstrip("/")
        self.connect_timeout_seconds = connect_timeout_seconds
        self.max_connections = max_connections
        self._headers = dict(headers or {})
        token = token if token is not None else os.environ.get(_TOKEN_ENV) or None
        if token is not None:
            self._headers["Authorization"] = f"Bearer {token}"
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = (
            weakref.WeakKeyDictionary()
        )
        self._info: dict[str, Any] | None = None
        # read in threads (see kcoral.event_stream)
        self._streams = EventStreams(
            self.base_url,
            self._headers,
            connect_timeout_seconds=connect_timeout_seconds,
            max_connections=max_connections,
        )

    def __repr__(self) -> str:  # never shows headers: they may carry the token
        return f"<AsyncClient {self.base_url}>"

    # -- lifecycle ----------------------------------------------------------------------

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Release connections; results already returned stay usable.

        The client may be used again afterwards (it opens new connections).
        """
        states = list(self._loops.items())
        self._loops.clear()
        for _loop, state in states:
            state.http.close()
        self._streams.clear()

    # -- endpoints ----------------------------------------------------------------------

    async def health(self) -> dict[str, Any]:
        """``GET /health`` validated like ``Client.health``."""
        status, headers, _content_type, body = await self._fetch("GET", "/health")
        if status != 200:
            raise error_from_response(status, headers, body)
        return decode_health(body)

    async def target(self) -> dict[str, str]:
        """``health()["target"]``; ``ProtocolError`` on CPU servers (no ``arch``)."""
        return decode_target(await self.health())

    async def execute(
        self,
        program: Program,
        *,
        timeout_seconds: float | None = None,
        output_limit_bytes: int | None = None,
        gpu_count: int | None = None,
        serialization: str | None = None,
    ) -> ProgramResult:
        """Run ``program`` as ``Client.execute`` does (CLIENT_API.md §2.1).

        ``serialization`` (``"json"``/``"pickle"``) is sent as ``X-KCoral-Serialization``;
        remote functions set it.
        """
        negotiation = ExecuteNegotiation(
            program,
            headers=self._headers,
            timeout_seconds=timeout_seconds,
            output_limit_bytes=output_limit_bytes,
            gpu_count=gpu_count,
            serialization=serialization,
        )
        outcome: ProgramResult | Attempt = negotiation.first_attempt()
        while isinstance(outcome, Attempt):
            status, headers, content_type, body = await self._fetch("POST", "/execute", outcome)
            if len(body) >= _DECODE_IN_THREAD_BYTES:
                outcome = await asyncio.get_running_loop().run_in_executor(
                    None, negotiation.handle_response, status, headers, content_type, body
                )
            else:
                outcome = negotiation.handle_response(status, headers, content_type, body)
        return outcome

    async def info(self) -> dict[str, Any]:
        """``GET /v1/info`` (EXTENSIONS §1), read once per client."""
        if self._info is None:
            status, headers, _content_type, body = await self._fetch("GET", "/v1/info")
            if status != 200:
                raise error_from_response(status, headers, body)
            self._info = decode_json_object(body, "/v1/info response")
        return dict(self._info)

    async def submit(
        self,
        program: Program,
        *,
        timeout_seconds: float | None = None,
        output_limit_bytes: int | None = None,
        gpu_count: int | None = None,
    ) -> AsyncJob:
        """Start ``program`` as a job (``Client.submit``'s twin)."""
        negotiation = ExecuteNegotiation(
            program,
            headers=self._headers,
            timeout_seconds=timeout_seconds,
            output_limit_bytes=output_limit_bytes,
            gpu_count=gpu_count,
        )
        try:
            info = await self.info()
        except KCoralError as exc:
            if exc.status_code != 404:
                raise
            info = {}  # a server without /v1/info offers no jobs
        require_jobs(info.get("features"), self.base_url)
        known_blobs = tuple(program.blobs)
        step: tuple[str, str] | Attempt = negotiation.first_attempt()
        while isinstance(step, Attempt):
            status, headers, content_type, body = await self._fetch("POST", "/v1/jobs", step)
            step = next_submission_step(negotiation, status, headers, content_type, body)
        job_id, request_id = step
        return AsyncJob(self, job_id, request_id=request_id, known_blobs=known_blobs)

    def job(self, job_id: str) -> AsyncJob:
        """Re-attach to an existing job."""
        return AsyncJob(self, check_job_id(job_id))

    async def request(self, method: str, path: str) -> tuple[int, Any, str | None, bytes]:
        """One plain request: ``(status, headers, content type, body)`` (used by jobs)."""
        return await self._fetch(method, path)

    def event_source(
        self, path: str, *, last_event_id: int = 0, read_timeout: float | None = None
    ) -> EventSource:
        """A blocking Server-Sent Events stream at ``path`` (``AsyncJob`` reads it in a
        thread)."""
        return self._streams.open(path, last_event_id=last_event_id, read_timeout=read_timeout)

    def function(
        self,
        *,
        timeout: float | None = None,
        output_limit_bytes: int | None = None,
        cpu_only: bool = False,
        serialization: str = "json",
    ) -> Callable[[Callable[..., Any]], RemoteFunction]:
        """Decorator making a ``RemoteFunction`` bound to this client (CLIENT_API.md §8)."""
        from kcoral.remote import remote_function_decorator

        return remote_function_decorator(
            self,
            timeout=timeout,
            output_limit_bytes=output_limit_bytes,
            cpu_only=cpu_only,
            serialization=serialization,
        )

    # -- transport ----------------------------------------------------------------------

    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None:
            from tornado.httpclient import AsyncHTTPClient

            http = AsyncHTTPClient(
                force_instance=True,
                max_clients=self.max_connections,
                max_body_size=_MAX_BODY_BYTES,
                max_buffer_size=_MAX_BODY_BYTES,
            )
            state = _LoopState(http, asyncio.Semaphore(self.max_connections))
            self._loops[loop] = state
        return state

    async def _fetch(
        self, method: str, path: str, attempt: Attempt | None = None
    ) -> tuple[int, Any, str | None, bytes]:
        from tornado.httpclient import HTTPClientError, HTTPRequest
        from tornado.iostream import StreamClosedError

        headers = dict(self._headers)
        body_producer = None
        if attempt is not None:
            headers.update(attempt.headers)
            headers["Content-Length"] = str(attempt.length)
            chunks = attempt.chunks

            async def body_producer(write: Callable[[bytes], Any]) -> None:
                for chunk in chunks:
                    await write(chunk)

        request = HTTPRequest(
            self.base_url + path,
            method=method,
            headers=headers,
            body_producer=body_producer,
            connect_timeout=self.connect_timeout_seconds,
            request_timeout=0,  # no read timeout: the server enforces execution deadlines
            follow_redirects=False,
            decompress_response=False,
        )
        state = self._state()
        async with state.slots:
            try:
                response = await state.http.fetch(request, raise_error=False)
            except (HTTPClientError, StreamClosedError, OSError) as exc:
                raise TransportError(f"{method} {self.base_url}{path}: {exc}") from exc
        if response.code == 599:  # Tornado's "no HTTP response" (timeouts, resets)
            raise TransportError(f"{method} {self.base_url}{path}: {response.error}")
        return (
            response.code,
            response.headers,
            response.headers.get("Content-Type"),
            response.body or b"",
        )
