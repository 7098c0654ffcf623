"""``AsyncClient``: the asyncio flavour of ``Client`` (EXTENSIONS.md §4).

A thin shell over the client core (``kcoral.base_client``): the same constructor, checks,
warnings, requests and decoding as ``Client``; only driving a flow differs, here by awaiting
an ``AsyncTransport``. The default transport runs the sync client's urllib3 transport on a
bounded pool of threads (``kcoral.connection.transport.ThreadedAsyncTransport``), so a plain
``pip install kcoral`` has ``AsyncClient``, no event loop of our own is started, and the
client can be awaited from any number of loops (CLIENT_API §1 says why threads).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, ClassVar, Generic, Literal, TypeVar

from kcoral.base_client import BaseClient
from kcoral.client_sessions import AsyncSession, attach_async, list_flow, session_options
from kcoral.connection.http import HttpTransport
from kcoral.connection.transport import (
    AsyncTransport,
    Flow,
    Request,
    Response,
    ThreadedAsyncTransport,
)
from kcoral.jobs import AsyncJob, JobList
from kcoral.program import Program
from kcoral.protocol.selector import SelectorInput, check_select
from kcoral.results import ProgramResult

T = TypeVar("T")

#: Answers at least this large are decoded (hashed, copied) off the event loop.
DECODE_IN_THREAD_BYTES = 1 << 20


class AsyncClient(BaseClient):
    """Asynchronous KCoral client; every call is a coroutine except ``function``, ``job`` and
    ``session`` (whose ``AsyncSession`` starts in ``async with``).

    ``transport`` replaces the HTTP stack (``kcoral.connection.transport.MockTransport`` in
    tests)."""

    is_async: ClassVar[Literal[True]] = True

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        connect_timeout_seconds: float = 10.0,
        token: str | None = None,
        max_connections: int = 64,
        max_answer_bytes: int | None = None,
        transport: AsyncTransport | None = None,
    ) -> None:
        super().__init__(
            base_url,
            headers=headers,
            connect_timeout_seconds=connect_timeout_seconds,
            token=token,
            max_connections=max_connections,
            max_answer_bytes=max_answer_bytes,
        )
        self._transport: AsyncTransport = transport or ThreadedAsyncTransport(
            HttpTransport(
                self.base_url,
                headers=self.headers,
                connect_timeout_seconds=self.connect_timeout_seconds,
                max_connections=max_connections,
                max_answer_bytes=self.max_answer_bytes,
            ),
            max_workers=max_connections,
        )

    async def run_flow(self, flow: Flow[T]) -> T:
        """Drive one core flow to its value; large answers are decoded on a thread."""
        flow = self.hinted(flow)
        step = _advance(flow, None)
        while isinstance(step, Request):
            response = await self._transport.handle_async_request(step)
            if len(response.data) >= DECODE_IN_THREAD_BYTES:
                loop = asyncio.get_running_loop()
                step = await loop.run_in_executor(None, _advance, flow, response)
            else:
                step = _advance(flow, response)
        return step.value

    async def aclose(self) -> None:
        """Release connections; results already returned stay usable (the client may be
        used again afterwards: it opens new connections)."""
        await self._transport.aclose()
        self.close_event_streams()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- endpoints -----------------------------------------------------------------------

    async def health(self) -> dict[str, Any]:
        """``GET /health`` validated like ``Client.health``."""
        return await self.run_flow(self.health_flow())

    async def target(self) -> dict[str, str]:
        """``health()["target"]``; ``ProtocolError`` on CPU servers (no ``arch``)."""
        return await self.run_flow(self.target_flow())

    async def info(self) -> dict[str, Any]:
        """``GET /v1/info`` (EXTENSIONS §1), read once per client."""
        return await self.run_flow(self.info_flow())

    async def execute(
        self,
        program: Program,
        *,
        timeout_seconds: float | None = None,
        output_limit_bytes: int | None = None,
        gpu_count: int | None = None,
        serialization: str | None = None,
        select: SelectorInput = None,
    ) -> ProgramResult:
        """Run ``program`` as ``Client.execute`` does (CLIENT_API.md §2.1)."""
        return await self.run_flow(
            self.execute_flow(
                program,
                timeout_seconds=timeout_seconds,
                output_limit_bytes=output_limit_bytes,
                gpu_count=gpu_count,
                serialization=serialization,
                select=select,
            )
        )

    async def submit(
        self,
        program: Program,
        *,
        timeout_seconds: float | None = None,
        output_limit_bytes: int | None = None,
        gpu_count: int | None = None,
        serialization: str | None = None,
        select: SelectorInput = None,
    ) -> AsyncJob:
        """Start ``program`` as a job (``Client.submit``'s twin)."""
        job_id, request_id, blobs = await self.run_flow(
            self.submit_flow(
                program,
                timeout_seconds=timeout_seconds,
                output_limit_bytes=output_limit_bytes,
                gpu_count=gpu_count,
                serialization=serialization,
                select=select,
            )
        )
        return AsyncJob(self, job_id, request_id=request_id, known_blobs=blobs)

    async def jobs(self, limit: int | None = None) -> JobList:
        """``GET /v1/jobs`` (EXTENSIONS §5): the caller's recent jobs, newest first; at
        most ``limit`` of them (the server's default: 1000; its most: 10000). The list says
        what it is missing: ``left_out``, ``nodes_left_out`` (``JobList``)."""
        return await self.run_flow(self.jobs_flow(limit))

    def job(self, job_id: str) -> AsyncJob:
        """Re-attach to an existing job."""
        return AsyncJob(self, self.check_job_id(job_id))

    def session(
        self,
        gpu_count: int | None = None,
        idle_timeout: float | None = None,
        *,
        select: SelectorInput = None,
    ) -> AsyncSession:
        """A session (EXTENSIONS §11), started by ``async with`` (or ``await .start()``)
        and ended when the block ends; arguments (``select`` too) are checked at once."""
        body = session_options(gpu_count, idle_timeout)
        return AsyncSession(self, body, check_select(select))

    async def attach_session(self, session_id: str) -> AsyncSession:
        """As ``Client.attach_session``: an existing session of this caller, by id, read
        from the server (asked again while a restarted router has not found it yet); it has
        started, and ``async with`` on it ends it when the block ends."""
        return await attach_async(self, session_id)

    async def sessions(self) -> list[dict[str, Any]]:
        """As ``Client.sessions``: ``GET /v1/sessions``, the caller's session records
        (``await attach_session(record["session_id"])`` picks one up)."""
        return await self.run_flow(list_flow())

    async def request(
        self, method: str, path: str, *, headers: Mapping[str, str] | None = None
    ) -> Response:
        """One plain request; the answer as it came."""
        return await self.run_flow(self.request_flow(method, path, headers=headers))


class _Done(Generic[T]):
    """A finished flow's value (a ``StopIteration`` cannot cross into an asyncio future)."""

    def __init__(self, value: T) -> None:
        self.value = value


def _advance(flow: Flow[T], response: Response | None) -> Request | _Done[T]:
    try:
        return next(flow) if response is None else flow.send(response)
    except StopIteration as done:
        return _Done(done.value)
