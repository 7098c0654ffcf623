"""The synchronous ``Client`` (CLIENT_API.md §2, EXTENSIONS.md §1, §5, §6, §9).

A thin shell over the client core (``kcoral.base_client``): it drives the core's flows over
a blocking ``Transport`` (urllib3 by default, ``kcoral.connection.http``), which needs no event
loop and
so also works in a thread that already runs one (a Jupyter kernel).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal, TypeVar, cast

from kcoral.base_client import BaseClient
from kcoral.client_sessions import (
    Session,
    attach,
    create_flow,
    list_flow,
    session_options,
)
from kcoral.connection.http import HttpTransport
from kcoral.connection.transport import Flow, Response, Transport
from kcoral.jobs import Job, JobList
from kcoral.program import Program
from kcoral.protocol.selector import SelectorInput, check_select
from kcoral.results import ProgramResult

T = TypeVar("T")


class Client(BaseClient):
    """Talks to one KCoral server or router. Construction never contacts it.

    ``transport`` replaces the HTTP stack (``kcoral.connection.transport.MockTransport`` in
    tests)."""

    is_async: ClassVar[Literal[False]] = False

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        connect_timeout_seconds: float = 10.0,
        token: str | None = None,
        max_connections: int = 64,
        max_answer_bytes: int | None = None,
        transport: Transport | None = None,
    ) -> None:
        super().__init__(
            base_url,
            headers=headers,
            connect_timeout_seconds=connect_timeout_seconds,
            token=token,
            max_connections=max_connections,
            max_answer_bytes=max_answer_bytes,
        )
        self._transport: Transport = transport or HttpTransport(
            self.base_url,
            headers=self.headers,
            connect_timeout_seconds=self.connect_timeout_seconds,
            max_connections=max_connections,
            max_answer_bytes=self.max_answer_bytes,
        )

    def run_flow(self, flow: Flow[T]) -> T:
        """Drive one core flow to its value, one blocking request at a time."""
        flow = self.hinted(flow)
        try:
            request = next(flow)
            while True:
                request = flow.send(self._transport.handle_request(request))
        except StopIteration as done:
            return cast(T, done.value)  # a Flow[T] returns a T

    def close(self) -> None:
        """Release pooled connections; returned results stay usable."""
        self._transport.close()
        self.close_event_streams()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- endpoints -----------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """``GET /health`` as a dict (``status == "ok"`` guaranteed)."""
        return self.run_flow(self.health_flow())

    def target(self) -> dict[str, str]:
        """The server's GPU target (``{"arch": "sm_90a"}``); ``ProtocolError`` on CPU servers."""
        return self.run_flow(self.target_flow())

    def info(self) -> dict[str, Any]:
        """``GET /v1/info`` (EXTENSIONS.md §1), read once per client and cached."""
        return self.run_flow(self.info_flow())

    def execute(
        self,
        program: Program,
        *,
        timeout_seconds: float | None = None,
        output_limit_bytes: int | None = None,
        gpu_count: int | None = None,
        serialization: str | None = None,
        select: SelectorInput = None,
    ) -> ProgramResult:
        """Run ``program`` once; ``FAILED`` programs are returned, not raised.

        ``serialization`` (``"json"``/``"pickle"``) is sent as ``X-KCoral-Serialization``
        (EXTENSIONS §4); remote functions and pickled notebook inputs set it. ``select``
        (``{"gpu": "h100"}`` or ``"gpu=h100"``) says what the node that runs it must offer
        (``X-KCoral-Select``, EXTENSIONS §14); a malformed one raises before anything is
        sent."""
        return self.run_flow(
            self.execute_flow(
                program,
                timeout_seconds=timeout_seconds,
                output_limit_bytes=output_limit_bytes,
                gpu_count=gpu_count,
                serialization=serialization,
                select=select,
            )
        )

    def submit(
        self,
        program: Program,
        *,
        timeout_seconds: float | None = None,
        output_limit_bytes: int | None = None,
        gpu_count: int | None = None,
        serialization: str | None = None,
        select: SelectorInput = None,
    ) -> Job:
        """Start ``program`` as a job and return at once (``POST /v1/jobs``).

        Same options, validation and cache negotiation as ``execute``; a refused request
        raises as ``execute`` would. ``KCoralError`` (kind ``unavailable``) when the server
        does not list feature ``jobs``."""
        job_id, request_id, blobs = self.run_flow(
            self.submit_flow(
                program,
                timeout_seconds=timeout_seconds,
                output_limit_bytes=output_limit_bytes,
                gpu_count=gpu_count,
                serialization=serialization,
                select=select,
            )
        )
        return Job(self, job_id, request_id=request_id, known_blobs=blobs)

    def jobs(self, limit: int | None = None) -> JobList:
        """``GET /v1/jobs`` (EXTENSIONS §5): the caller's recent jobs, newest first; at
        most ``limit`` of them (the server's default: 1000; its most: 10000). The list says
        what it is missing: ``left_out``, ``nodes_left_out`` (``JobList``)."""
        return self.run_flow(self.jobs_flow(limit))

    def job(self, job_id: str) -> Job:
        """Re-attach to an existing job (nothing is sent until a method is called)."""
        return Job(self, self.check_job_id(job_id))

    def session(
        self,
        gpu_count: int | None = None,
        idle_timeout: float | None = None,
        *,
        select: SelectorInput = None,
    ) -> Session:
        """Start a session (EXTENSIONS §11): a worker pinned to this caller whose programs
        share ``kcoral.session.namespace``; use it as a context manager to end it. With
        ``select`` it starts on a node that fits, and its programs send it too."""
        body, selector = session_options(gpu_count, idle_timeout), check_select(select)
        return Session(self, self.run_flow(create_flow(body, selector)), selector)

    def attach_session(self, session_id: str) -> Session:
        """An existing session of this caller, by id (read from the server; asked again
        while a restarted router has not found it yet, as its requests are)."""
        return attach(self, session_id)

    def sessions(self) -> list[dict[str, Any]]:
        """``GET /v1/sessions`` (EXTENSIONS §11): the caller's session records, live and
        recently ended, newest first (``attach_session(record["session_id"])`` picks one up)."""
        return self.run_flow(list_flow())

    def request(
        self, method: str, path: str, *, headers: Mapping[str, str] | None = None
    ) -> Response:
        """One plain request on the client's connection pool; the answer as it came."""
        return self.run_flow(self.request_flow(method, path, headers=headers))
