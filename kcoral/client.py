"""The synchronous ``Client`` (CLIENT_API.md §2, EXTENSIONS.md §1, §6, §9).

``execute`` runs the cache negotiation of PROTOCOL.md §9.3 (``kcoral.negotiation``, shared
with ``AsyncClient``): the program JSON is serialized once; first no blobs, then exactly
the missing ones, then all; a third ``CACHE_MISS`` is a ``ProtocolError``. No other
retries.
"""

from __future__ import annotations

import copy
import math
import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import kcoral
from kcoral.errors import KCoralError
from kcoral.event_stream import EventSource, EventStreams
from kcoral.http import HttpResponse, HttpTransport
from kcoral.jobs import Job, check_job_id, next_submission_step, require_jobs
from kcoral.negotiation import Attempt, ExecuteNegotiation
from kcoral.program import Program
from kcoral.response import decode_health, decode_json_object, decode_target, error_from_response
from kcoral.results import ProgramResult


class Client:
    """Talks to one KCoral server or router. Construction never contacts it."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        connect_timeout_seconds: float = 10.0,
        token: str | None = None,
    ) -> None:
        if not isinstance(base_url, str):
            raise TypeError(f"base_url must be a str, not {type(base_url).__name__}")
        url = base_url.rstrip("/")
        if not url.lower().startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if (
            isinstance(connect_timeout_seconds, bool)
            or not isinstance(connect_timeout_seconds, (int, float))
            or not math.isfinite(connect_timeout_seconds)
            or connect_timeout_seconds <= 0
        ):
            raise ValueError("connect_timeout_seconds must be a finite number > 0")
        extra = dict(headers or {})
        for name, value in extra.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise TypeError("headers must map str to str")
        if token is None:
            token = os.environ.get("KCORAL_TOKEN") or None
        if token is not None and not isinstance(token, str):
            raise TypeError("token must be a str")

        request_headers = {"User-Agent": f"kcoral/{kcoral.__version__}", **extra}
        if token:
            request_headers["Authorization"] = f"Bearer {token}"
        self.base_url = url
        self._transport = HttpTransport(
            url, headers=request_headers, connect_timeout_seconds=float(connect_timeout_seconds)
        )
        self._info: dict[str, Any] | None = None
        self._streams = EventStreams(
            url,
            request_headers,
            connect_timeout_seconds=float(connect_timeout_seconds),
            max_connections=64,
        )

    def __repr__(self) -> str:
        # Never show headers: they may carry the token.
        return f"Client({self.base_url!r})"

    def close(self) -> None:
        """Release pooled connections; returned results stay usable."""
        self._transport.close()
        self._streams.clear()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- read-only endpoints -------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """``GET /health`` as a dict (``status == "ok"`` guaranteed)."""
        response = self._transport.request("GET", "/health")
        if response.status != 200:
            raise error_from_response(response.status, response.headers, response.data)
        return decode_health(response.data)

    def target(self) -> dict[str, str]:
        """The server's GPU target (``{"arch": "sm_90a"}``); ``ProtocolError`` on CPU servers."""
        return decode_target(self.health())

    def info(self) -> dict[str, Any]:
        """``GET /v1/info`` (EXTENSIONS.md §1), read once per client and cached.

        Warns once (``UserWarning``) when the server's major.minor version differs.
        """
        if self._info is None:
            response = self._transport.request("GET", "/v1/info")
            if response.status != 200:
                raise error_from_response(response.status, response.headers, response.data)
            info = decode_json_object(response.data, "/v1/info response")
            server_version = info.get("kcoral")
            if isinstance(server_version, str) and _major_minor(server_version) != _major_minor(
                kcoral.__version__
            ):
                warnings.warn(
                    f"KCoral server version {server_version} differs from client version "
                    f"{kcoral.__version__}",
                    UserWarning,
                    stacklevel=2,
                )
            self._info = info
        return copy.deepcopy(self._info)

    # -- execution -----------------------------------------------------------------------

    def execute(
        self,
        program: Program,
        *,
        timeout_seconds: float | None = None,
        output_limit_bytes: int | None = None,
        gpu_count: int | None = None,
    ) -> ProgramResult:
        """Run ``program`` once; ``FAILED`` programs are returned, not raised."""
        negotiation = ExecuteNegotiation(
            program,
            timeout_seconds=timeout_seconds,
            output_limit_bytes=output_limit_bytes,
            gpu_count=gpu_count,
        )
        return self.run_negotiation(negotiation)

    def run_negotiation(self, negotiation: ExecuteNegotiation) -> ProgramResult:
        """Drive one prepared ``/execute`` negotiation (used by remote functions, which add
        their serialization header) until it yields a result or raises."""
        attempt = negotiation.first_attempt()
        while True:
            response = self._transport.request(
                "POST",
                "/execute",
                body=attempt.chunks,
                content_length=attempt.length,
                headers=attempt.headers,
            )
            outcome = negotiation.handle_response(
                response.status,
                response.headers,
                response.headers.get("Content-Type"),
                response.data,
            )
            if isinstance(outcome, ProgramResult):
                return outcome
            attempt = outcome

    # -- jobs (EXTENSIONS §5) ------------------------------------------------------------

    def submit(
        self,
        program: Program,
        *,
        timeout_seconds: float | None = None,
        output_limit_bytes: int | None = None,
        gpu_count: int | None = None,
    ) -> Job:
        """Start ``program`` as a job and return at once (``POST /v1/jobs``).

        Same options, validation and cache negotiation as ``execute``; a refused request
        raises as ``execute`` would. ``KCoralError`` (kind ``unavailable``) when the server
        does not list feature ``jobs``."""
        negotiation = ExecuteNegotiation(
            program,
            timeout_seconds=timeout_seconds,
            output_limit_bytes=output_limit_bytes,
            gpu_count=gpu_count,
        )
        self._require_jobs()
        known_blobs = tuple(program.blobs)
        attempt = negotiation.first_attempt()
        while True:
            response = self._transport.request(
                "POST",
                "/v1/jobs",
                body=attempt.chunks,
                content_length=attempt.length,
                headers=attempt.headers,
            )
            step = next_submission_step(
                negotiation,
                response.status,
                response.headers,
                response.headers.get("Content-Type"),
                response.data,
            )
            if isinstance(step, Attempt):
                attempt = step
                continue
            job_id, request_id = step
            return Job(self, job_id, request_id=request_id, known_blobs=known_blobs)

    def job(self, job_id: str) -> Job:
        """Re-attach to an existing job (nothing is sent until a method is called)."""
        return Job(self, check_job_id(job_id))

    def _require_jobs(self) -> None:
        try:
            info = self.info()
        except KCoralError as exc:
            if exc.status_code != 404:
                raise
            info = {}  # a server without /v1/info offers no jobs
        require_jobs(info.get("features"), self.base_url)

    def request(
        self, method: str, path: str, *, headers: Mapping[str, str] | None = None
    ) -> HttpResponse:
        """One plain request on the client's connection pool (used by ``Job``)."""
        return self._transport.request(method, path, headers=headers)

    def event_source(
        self, path: str, *, last_event_id: int = 0, read_timeout: float | None = None
    ) -> EventSource:
        """A Server-Sent Events stream at ``path`` (used by ``Job``); streams use their own
        connections, kept apart from the request pool."""
        return self._streams.open(path, last_event_id=last_event_id, read_timeout=read_timeout)

    # -- remote functions ----------------------------------------------------------------

    def function(
        self,
        *,
        timeout: float | None = None,
        output_limit_bytes: int | None = None,
        cpu_only: bool = False,
        **options: Any,
    ) -> Callable[[Callable[..., Any]], Any]:
        """Decorator returning a ``RemoteFunction`` bound to this client (CLIENT_API §8)."""
        from kcoral.remote import remote_function_decorator

        return remote_function_decorator(
            self,
            timeout=timeout,
            output_limit_bytes=output_limit_bytes,
            cpu_only=cpu_only,
            **options,
        )


def _major_minor(version: str) -> tuple[str, ...]:
    return tuple(version.split(".")[:2])
