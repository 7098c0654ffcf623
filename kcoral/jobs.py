"""Jobs on the client side (EXTENSIONS §5): ``Job``, ``AsyncJob`` and their event streams.

``client.submit(program)`` returns a ``Job``; ``client.job(job_id)`` re-attaches to one.
Events arrive as ``JobEvent(id, kind, data)`` records from the job's Server-Sent Events
stream. A dropped stream is reopened with ``Last-Event-ID`` (the server replays what
followed), so an iteration sees every event once, in order, and ends after the ``finished``
phase. ``result()`` answers exactly what ``execute`` would have returned.

Streams are read with urllib3 from a blocking thread in both clients (``AsyncJob`` pumps the
events into its event loop), so closing a stream is immediate and no event loop of our own
is ever started.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kcoral.errors import KCoralError, ProtocolError, TransportError, ValidationError
from kcoral.protocol.strict_json import loads_strict
from kcoral.response import (
    CacheMiss,
    decode_execute_response,
    decode_json_object,
    error_from_response,
)

if TYPE_CHECKING:
    import urllib3

    from kcoral.async_client import AsyncClient
    from kcoral.client import Client
    from kcoral.results import ProgramResult

#: Job statuses after which nothing changes.
FINISHED_STATUSES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT", "ERROR"})
RECONNECT_ATTEMPTS = 8
RECONNECT_FIRST_DELAY_SECONDS = 0.1
RECONNECT_MAX_DELAY_SECONDS = 2.0


@dataclass(frozen=True)
class JobEvent:
    """One Server-Sent Event of a job: ``kind`` is ``phase``, ``stdout``, ``stderr`` or
    ``heartbeat``; ``data`` its JSON object (``{"text": ...}`` for output)."""

    id: int
    kind: str
    data: dict[str, Any]

    @property
    def text(self) -> str:
        """The output text of a ``stdout``/``stderr`` event ("" for others)."""
        value = self.data.get("text")
        return value if isinstance(value, str) else ""

    @property
    def finished(self) -> bool:
        """True for the last event of a job (the ``finished`` phase)."""
        return self.kind == "phase" and self.data.get("phase") == "finished"


class SseParser:
    """Incremental ``text/event-stream`` parser: ``feed(bytes)`` returns complete events."""

    def __init__(self) -> None:
        self._buffer = b""
        self._id: str | None = None
        self._kind = "message"
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[JobEvent]:
        self._buffer += chunk
        events: list[JobEvent] = []
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                return events
            line = self._buffer[:end].rstrip(b"\r").decode("utf-8", errors="replace")
            self._buffer = self._buffer[end + 1 :]
            event = self._line(line)
            if event is not None:
                events.append(event)

    def _line(self, line: str) -> JobEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None  # comment
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "id":
            self._id = value
        elif name == "event":
            self._kind = value
        elif name == "data":
            self._data.append(value)
        return None

    def _dispatch(self) -> JobEvent | None:
        event_id, kind, data = self._id, self._kind, self._data
        self._kind, self._data = "message", []
        if event_id is None and not data:
            return None
        if event_id is None or not (event_id.isascii() and event_id.isdigit()):
            raise ProtocolError(f"job event without a numeric id: {event_id!r}")
        try:
            value = loads_strict("\n".join(data).encode("utf-8")) if data else {}
        except ValidationError as exc:
            raise ProtocolError(f"job event {event_id}: invalid JSON data: {exc}") from None
        if not isinstance(value, dict):
            raise ProtocolError(f"job event {event_id}: data is not a JSON object")
        return JobEvent(int(event_id), kind, value)


def decode_job_accepted(body: bytes) -> tuple[str, str]:
    """``(job_id, request_id)`` from a 202 ``POST /v1/jobs`` answer."""
    document = decode_json_object(body, "job submission response")
    job_id, request_id = document.get("job_id"), document.get("request_id")
    if not isinstance(job_id, str) or not job_id or "/" in job_id:
        raise ProtocolError("job submission response has no valid job_id")
    if not isinstance(request_id, str):
        raise ProtocolError("job submission response has no request_id")
    return job_id, request_id


def decode_job_result(
    status: int, headers: Mapping[str, str], body: bytes, known_blobs: Collection[str]
) -> ProgramResult:
    """The ``ProgramResult`` of ``GET /v1/jobs/{id}/result`` (non-200 raises as ``execute``
    would: ``KCoralError``)."""
    if status != 200:
        raise error_from_response(status, headers, body)
    outcome = decode_execute_response(headers.get("Content-Type"), body, known_blobs)
    if isinstance(outcome, CacheMiss):
        raise ProtocolError("a job result cannot be a CACHE_MISS")
    return outcome


def decode_job_state(status: int, headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
    if status != 200:
        raise error_from_response(status, headers, body)
    state = decode_json_object(body, "job state")
    if not isinstance(state.get("status"), str):
        raise ProtocolError("job state has no status")
    return state


class EventSource:
    """A job's event stream over blocking HTTP, reconnecting with ``Last-Event-ID``.

    Iterate once; ``close()`` (from any thread) ends the iteration.
    """

    def __init__(
        self,
        pool: urllib3.PoolManager,
        url: str,
        headers: Mapping[str, str],
        *,
        last_event_id: int = 0,
        read_timeout: float | None = None,
    ) -> None:
        self.pool = pool
        self.url = url
        self.headers = dict(headers)
        self.last_event_id = last_event_id
        self.read_timeout = read_timeout
        self._response: Any = None
        self._closed = False
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()  # wakes a blocked read in another thread
            with contextlib.suppress(Exception):
                response.close()

    def __iter__(self) -> Iterator[JobEvent]:
        import urllib3

        failures = 0
        while not self._closed:
            try:
                for event in self._one_connection(urllib3):
                    failures = 0
                    yield event
                    if event.finished:
                        return
            except urllib3.exceptions.ReadTimeoutError:
                raise TimeoutError("no job event within the timeout") from None
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                if self._closed:
                    return
                failures += 1
                if failures > RECONNECT_ATTEMPTS:
                    raise TransportError(f"GET {self.url} failed: {exc}") from exc
                delay = RECONNECT_FIRST_DELAY_SECONDS * 2 ** (failures - 1)
                time.sleep(min(delay, RECONNECT_MAX_DELAY_SECONDS))
            else:
                failures += 1  # the stream ended before ``finished``: reconnect
                if failures > RECONNECT_ATTEMPTS:
                    raise TransportError(f"GET {self.url}: the event stream keeps ending")

    def _one_connection(self, urllib3: Any) -> Iterator[JobEvent]:
        headers = dict(self.headers)
        headers["Accept"] = "text/event-stream"
        if self.last_event_id:
            headers["Last-Event-ID"] = str(self.last_event_id)
        response = self.pool.request(
            "GET",
            self.url,
            headers=headers,
            preload_content=False,
            redirect=False,
            timeout=urllib3.Timeout(read=self.read_timeout),
        )
        with self._lock:
            self._response = response
            if self._closed:
                response.close()
                return
        try:
            if response.status != 200:
                raise error_from_response(response.status, response.headers, response.read())
            parser = SseParser()
            chunks = response.read_chunked() if response.chunked else _read1(response)
            for chunk in chunks:
                for event in parser.feed(chunk):
                    if event.id <= self.last_event_id:
                        continue  # never twice, whatever the server replays
                    self.last_event_id = event.id
                    yield event
        finally:
            with self._lock:
                self._response = None
            response.close()


def _read1(response: Any) -> Iterator[bytes]:
    while True:
        data = response.read1(65536)
        if not data:
            return
        yield data


class Job:
    """A job on a server (sync client). ``id`` is the server's job id."""

    def __init__(
        self,
        client: Client,
        job_id: str,
        *,
        request_id: str | None = None,
        known_blobs: Collection[str] = (),
    ) -> None:
        self.client = client
        self.id = job_id
        self.request_id = request_id
        self._known_blobs = frozenset(known_blobs)

    def _repr_html_(self) -> str:
        # Rich display in notebooks; the Jupyter package is imported only here.
        from kcoral_jupyter.display import job_html

        return job_html(self)

    def __repr__(self) -> str:
        return f"Job({self.id!r})"

    def status(self) -> dict[str, Any]:
        """``GET /v1/jobs/{id}``: the job's state (``status``, timings, worker, ...)."""
        response = self.client.request("GET", f"/v1/jobs/{self.id}")
        return decode_job_state(response.status, response.headers, response.data)

    def events(self, *, last_event_id: int = 0, heartbeats: bool = False) -> Iterator[JobEvent]:
        """Every event after ``last_event_id``, live, ending after the ``finished`` phase."""
        source = self.client.event_source(f"/v1/jobs/{self.id}/events", last_event_id=last_event_id)
        try:
            for event in source:
                if heartbeats or event.kind != "heartbeat":
                    yield event
        finally:
            source.close()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the job has finished (``TimeoutError`` after ``timeout`` seconds).

        Follows the event stream until its ``finished`` phase (a finished job's stream
        replays and ends at once), so waiting costs one request and no polling."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last = 0
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"job {self.id} did not finish within {timeout} s")
            source = self.client.event_source(
                f"/v1/jobs/{self.id}/events", last_event_id=last, read_timeout=remaining
            )
            try:
                for event in source:
                    last = event.id
                    if event.finished:
                        return
                    if deadline is not None and time.monotonic() >= deadline:
                        break
            except TimeoutError:
                raise TimeoutError(f"job {self.id} did not finish within {timeout} s") from None
            finally:
                source.close()

    def result(self, timeout: float | None = None) -> ProgramResult:
        """The ``ProgramResult`` ``execute`` would have returned (waits for the end).

        Raises as ``execute`` would (``KCoralError`` for a timed-out or failed request);
        a cancelled job raises ``KCoralError`` (409, kind ``cancelled``)."""
        self.wait(timeout)
        response = self.client.request("GET", f"/v1/jobs/{self.id}/result")
        return decode_job_result(
            response.status, response.headers, response.data, self._known_blobs
        )

    def cancel(self) -> dict[str, Any]:
        """``DELETE /v1/jobs/{id}``: cancel (idempotent); the job's state afterwards."""
        response = self.client.request("DELETE", f"/v1/jobs/{self.id}")
        return decode_job_state(response.status, response.headers, response.data)


class AsyncJob:
    """A job on a server (``AsyncClient``); every method is a coroutine but ``events``."""

    def __init__(
        self,
        client: AsyncClient,
        job_id: str,
        *,
        request_id: str | None = None,
        known_blobs: Collection[str] = (),
    ) -> None:
        self.client = client
        self.id = job_id
        self.request_id = request_id
        self._known_blobs = frozenset(known_blobs)

    def __repr__(self) -> str:
        return f"AsyncJob({self.id!r})"

    async def status(self) -> dict[str, Any]:
        status, headers, _type, body = await self.client.request("GET", f"/v1/jobs/{self.id}")
        return decode_job_state(status, headers, body)

    async def events(
        self, *, last_event_id: int = 0, heartbeats: bool = False
    ) -> AsyncIterator[JobEvent]:
        """Async iterator over the job's events (see ``Job.events``)."""
        source = self.client.event_source(f"/v1/jobs/{self.id}/events", last_event_id=last_event_id)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        done = object()

        def pump() -> None:
            try:
                for event in source:
                    loop.call_soon_threadsafe(queue.put_nowait, event)
                loop.call_soon_threadsafe(queue.put_nowait, done)
            except BaseException as exc:  # handed to the consumer
                with contextlib.suppress(RuntimeError):  # the loop may be closed
                    loop.call_soon_threadsafe(queue.put_nowait, exc)

        thread = threading.Thread(target=pump, name=f"kcoral-job-{self.id[:8]}", daemon=True)
        thread.start()
        try:
            while True:
                item = await queue.get()
                if item is done:
                    return
                if isinstance(item, BaseException):
                    raise item
                if heartbeats or item.kind != "heartbeat":
                    yield item
        finally:
            source.close()

    async def wait(self, timeout: float | None = None) -> None:
        """Wait until the job has finished (``TimeoutError`` after ``timeout`` seconds)."""

        async def until_finished() -> None:
            async for event in self.events(heartbeats=True):
                if event.finished:
                    return

        try:
            await asyncio.wait_for(until_finished(), timeout)
        except (asyncio.TimeoutError, TimeoutError):
            raise TimeoutError(f"job {self.id} did not finish within {timeout} s") from None

    async def result(self, timeout: float | None = None) -> ProgramResult:
        """As ``Job.result``."""
        await self.wait(timeout)
        status, headers, _type, body = await self.client.request(
            "GET", f"/v1/jobs/{self.id}/result"
        )
        return decode_job_result(status, headers, body, self._known_blobs)

    async def cancel(self) -> dict[str, Any]:
        status, headers, _type, body = await self.client.request("DELETE", f"/v1/jobs/{self.id}")
        return decode_job_state(status, headers, body)


def check_job_id(job_id: object) -> str:
    """A job id as given to ``client.job``: a non-empty ``str`` usable in a URL path."""
    if not isinstance(job_id, str):
        raise TypeError(f"job_id must be a str, not {type(job_id).__name__}")
    if not job_id or any(c in job_id for c in "/?#%") or not job_id.isprintable():
        raise ValueError(f"invalid job id {job_id!r}")
    return job_id


def jobs_unsupported(base_url: str) -> KCoralError:
    """The error ``submit`` raises when ``/v1/info`` does not list ``jobs``."""
    return KCoralError(404, f"the server at {base_url} does not offer jobs", kind="unavailable")
