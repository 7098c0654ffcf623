"""Jobs on the client side (EXTENSIONS §5): ``Job``, ``AsyncJob`` and their answers.

``client.submit(program)`` returns a ``Job``; ``client.job(job_id)`` re-attaches to one.
Events arrive as ``JobEvent(id, kind, data)`` records from the job's Server-Sent Events
stream (``kcoral.connection.event_stream``), every event once, in order, ending after the
``finished``
phase. ``result()`` answers exactly what ``execute`` would have returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Collection, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from kcoral.connection.answer_deadline import STATUS_ANSWER_SECONDS
from kcoral.connection.event_stream import JobEvent
from kcoral.connection.negotiation import Attempt, ExecuteNegotiation
from kcoral.connection.transport import Flow, Request
from kcoral.errors import KCoralError, ProtocolError, TransportError
from kcoral.notebook import html_of
from kcoral.protocol.errors import ValidationError
from kcoral.protocol.headers import NODE_HEADER
from kcoral.protocol.strict_json import loads_strict
from kcoral.response import (
    CacheMiss,
    decode_execute_response,
    decode_json_object,
    error_from_response,
)

if TYPE_CHECKING:
    from kcoral.connection.event_stream import EventSource
    from kcoral.results import ProgramResult


T = TypeVar("T")


class JobClient(Protocol):
    """What a job needs of its client (``Client``): a flow driver (``run_flow`` returns the
    value) and event streams."""

    def run_flow(self, flow: Flow[T]) -> T: ...

    def event_source(
        self, path: str, *, last_event_id: int = 0, read_timeout: float | None = None
    ) -> EventSource: ...


class AsyncJobClient(Protocol):
    """``JobClient`` of an ``AsyncClient``: ``run_flow`` gives an awaitable of the value."""

    def run_flow(self, flow: Flow[T]) -> Awaitable[T]: ...

    def event_source(
        self, path: str, *, last_event_id: int = 0, read_timeout: float | None = None
    ) -> EventSource: ...


#: How long an async job's event pump waits for the job's state (a loop that stopped never
#: answers; the stream is then reopened as it would have been).
STATE_WAIT = 30.0

#: Job statuses after which nothing changes.
FINISHED_STATUSES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT", "ERROR"})


def decode_job_accepted(body: bytes | memoryview) -> tuple[str, str]:
    """``(job_id, request_id)`` from a 202 ``POST /v1/jobs`` answer."""
    document = decode_json_object(body, "job submission response")
    request_id = document.get("request_id")
    try:
        # One path segment, as a caller's: '..' or '?' in a server's answer would send the
        # job's later requests (its cancel included) to another route of that address.
        job_id = check_job_id(document.get("job_id"))
    except (TypeError, ValueError):
        raise ProtocolError("job submission response has no valid job_id") from None
    if not isinstance(request_id, str):
        raise ProtocolError("job submission response has no request_id")
    return job_id, request_id


def decode_job_result(
    status: int, headers: Mapping[str, str], body: bytes | memoryview, known_blobs: Collection[str]
) -> ProgramResult:
    """The ``ProgramResult`` of ``GET /v1/jobs/{id}/result`` (non-200 raises as ``execute``
    would: ``KCoralError``)."""
    if status != 200:
        raise error_from_response(status, headers, body)
    outcome = decode_execute_response(headers.get("Content-Type"), body, known_blobs)
    if isinstance(outcome, CacheMiss):
        raise ProtocolError("a job result cannot be a CACHE_MISS")
    return dataclasses.replace(outcome, node=headers.get(NODE_HEADER))  # the job's node


#: the most node ids of ``X-KCoral-Nodes-Left-Out`` kept, and the longest kept (a server's
#: header is not trusted to be small)
MOST_NODES_NAMED = 64
LONGEST_NODE_ID = 128


class JobList(list[dict[str, Any]]):
    """``client.jobs()``: the job states, newest first, and what the list is missing:
    ``left_out`` (how many of the caller's jobs the server cut at its ``limit``) and
    ``nodes_left_out`` (a router's nodes that were away or could not answer: their jobs
    are not in it). A plain list otherwise."""

    left_out: int = 0
    nodes_left_out: tuple[str, ...] = ()

    @property
    def whole(self) -> bool:
        """Whether nothing was left out."""
        return not self.left_out and not self.nodes_left_out


def decode_job_list(body: bytes | memoryview, headers: Mapping[str, str] | None = None) -> JobList:
    """The job states of a ``GET /v1/jobs`` answer (a JSON array of objects), with what its
    headers say it left out (EXTENSIONS §5, ROUTER §13)."""
    try:
        document = loads_strict(bytes(body))
    except ValidationError as exc:
        raise ProtocolError(f"job list is not valid JSON: {exc}") from None
    if not isinstance(document, list) or not all(isinstance(job, dict) for job in document):
        raise ProtocolError("job list is not an array of objects")
    jobs = JobList(document)
    headers = headers or {}
    count = (headers.get("X-KCoral-Jobs-Left-Out") or "").strip()
    jobs.left_out = int(count) if count.isdigit() and len(count) <= 12 else 0
    nodes = (headers.get("X-KCoral-Nodes-Left-Out") or "").split(",")
    jobs.nodes_left_out = tuple(
        node.strip()[:LONGEST_NODE_ID]
        for node in nodes[:MOST_NODES_NAMED]
        if node.strip() and node.isprintable()
    )
    return jobs


def decode_job_state(
    status: int, headers: Mapping[str, str], body: bytes | memoryview
) -> dict[str, Any]:
    if status != 200:
        raise error_from_response(status, headers, body)
    state = decode_json_object(body, "job state")
    if not isinstance(state.get("status"), str):
        raise ProtocolError("job state has no status")
    return state


def wait_bound(timeout: object) -> float | None:
    """``wait``'s and ``result``'s ``timeout`` checked before anything is sent: seconds,
    ``None``, infinity or more than ``threading.TIMEOUT_MAX`` for no bound. An infinite one
    overflowed the sync client's deadline (``OverflowError: timestamp out of range``); a
    string failed inside the arithmetic."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(
            f"timeout must be a number of seconds or None, not {type(timeout).__name__}"
        )
    if timeout != timeout or timeout < 0:  # NaN; math.isnan overflows on a huge int
        raise ValueError(f"timeout must be a number of seconds >= 0, not {timeout!r}")
    # Past threading.TIMEOUT_MAX (292 years) a socket's read timeout overflows as infinity's
    # did: such a bound is none.
    return None if timeout > threading.TIMEOUT_MAX else float(timeout)


class _JobHandle:
    """What ``Job`` and ``AsyncJob`` share: the ids, the known blobs and the job's paths."""

    def __init__(
        self,
        client: JobClient | AsyncJobClient,
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
        return f"{type(self).__name__}({self.id!r})"

    @property
    def path(self) -> str:
        """``/v1/jobs/{id}``: state (GET) and cancel (DELETE)."""
        return f"/v1/jobs/{self.id}"

    @property
    def events_path(self) -> str:
        """``/v1/jobs/{id}/events``: the job's event stream (GET)."""
        return f"/v1/jobs/{self.id}/events"

    @property
    def result_path(self) -> str:
        """``/v1/jobs/{id}/result``: the job's answer, as ``/execute``'s (GET)."""
        return f"/v1/jobs/{self.id}/result"

    def state_flow(
        self, method: str = "GET", read_timeout: float | None = None
    ) -> Flow[dict[str, Any]]:
        """``GET`` (state) or ``DELETE`` (cancel) ``/v1/jobs/{id}``: the job's state. A
        ``GET`` is a status read (its whole answer within ``read_timeout``, by default
        ``STATUS_ANSWER_SECONDS``: a server trickling it held the caller for ever). A
        ``DELETE`` is answered once the job has ended, its worker killed under its GPUs'
        lease, which another's program may hold for minutes: its head comes when it comes,
        and its body has a program answer's deadline (``answer_deadline``)."""
        status_read = method == "GET" and read_timeout is None
        timeout = STATUS_ANSWER_SECONDS if status_read else read_timeout
        response = yield Request(method, self.path, read_timeout=timeout)
        return decode_job_state(response.status, response.headers, response.data)

    def _finished_flow(self, timeout: object) -> Flow[None]:
        """The question that ends a wait whose time is up (``Job.wait``, ``AsyncJob.wait``):
        a job that has finished is waited for (``timeout=0`` asks whether it has, as
        ``concurrent.futures`` does; a finished job raised ``TimeoutError`` there, its result
        unread), else ``TimeoutError``. Its driver runs it inside ``_unanswered``."""
        state = yield from self.state_flow(read_timeout=STATE_CHECK_SECONDS)
        if state.get("status") not in FINISHED_STATUSES:
            raise timed_out(self.id, timeout) from None

    @contextlib.contextmanager
    def _unanswered(self, timeout: object) -> Iterator[None]:
        """Around ``_finished_flow``'s driver: a question about the job's state that got no
        usable answer (a ``KCoralError`` from the flow, a ``TransportError`` from the
        transport) raises as ``check_failed`` says."""
        try:
            yield
        except (KCoralError, TransportError) as exc:
            raise check_failed(self.id, timeout, exc) from None

    def result_flow(self) -> Flow[ProgramResult]:
        """``GET /v1/jobs/{id}/result`` decoded as ``execute``'s answer."""
        response = yield Request("GET", self.result_path)
        return decode_job_result(
            response.status, response.headers, response.data, self._known_blobs
        )


class Job(_JobHandle):
    """A job on a server (sync client). ``id`` is the server's job id."""

    client: JobClient

    def _repr_html_(self) -> str | None:
        return html_of(self)

    def status(self) -> dict[str, Any]:
        """``GET /v1/jobs/{id}``: the job's state (``status``, timings, worker, ...)."""
        return self.client.run_flow(self.state_flow())

    def events(self, *, last_event_id: int = 0, heartbeats: bool = False) -> Iterator[JobEvent]:
        """Every event after ``last_event_id``, live, ending after the ``finished`` phase
        (at once when that came before: nothing follows it)."""
        source = self.client.event_source(self.events_path, last_event_id=last_event_id)
        source.job_finished = lambda: self.status().get("status") in FINISHED_STATUSES
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
        bound = wait_bound(timeout)
        deadline = None if bound is None else time.monotonic() + bound
        last = 0
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                self._finished_or_timeout(timeout)
                return
            source = self.client.event_source(
                self.events_path, last_event_id=last, read_timeout=remaining
            )
            try:
                for event in source:
                    last = event.id
                    if event.finished:
                        return
                    if deadline is not None and time.monotonic() >= deadline:
                        break
            except TimeoutError:
                self._finished_or_timeout(timeout)
                return
            finally:
                source.close()

    def _finished_or_timeout(self, timeout: object) -> None:
        """The wait's time is up: ``_finished_flow``."""
        with self._unanswered(timeout):
            self.client.run_flow(self._finished_flow(timeout))

    def result(self, timeout: float | None = None) -> ProgramResult:
        """The ``ProgramResult`` ``execute`` would have returned (waits for the end).

        Raises as ``execute`` would (``KCoralError`` for a timed-out or failed request);
        a cancelled job raises ``KCoralError`` (409, kind ``cancelled``)."""
        self.wait(timeout)
        return self.client.run_flow(self.result_flow())

    def cancel(self) -> dict[str, Any]:
        """``DELETE /v1/jobs/{id}``: cancel (idempotent); the job's state afterwards."""
        return self.client.run_flow(self.state_flow("DELETE"))


class AsyncJob(_JobHandle):
    """A job on a server (``AsyncClient``); every method is a coroutine but ``events``."""

    client: AsyncJobClient

    async def status(self) -> dict[str, Any]:
        """``GET /v1/jobs/{id}``: the job's state (``status``, timings, worker, ...), as
        ``Job.status``."""
        return await self.client.run_flow(self.state_flow())

    async def events(
        self, *, last_event_id: int = 0, heartbeats: bool = False
    ) -> AsyncIterator[JobEvent]:
        """Async iterator over the job's events (see ``Job.events``)."""
        source = self.client.event_source(self.events_path, last_event_id=last_event_id)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        done = object()

        def job_finished() -> bool:  # asked from the pump's thread, answered on the loop
            state = asyncio.run_coroutine_threadsafe(self.status(), loop).result(STATE_WAIT)
            return state.get("status") in FINISHED_STATUSES

        source.job_finished = job_finished

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
        bound = wait_bound(timeout)

        async def until_finished() -> None:
            async for event in self.events(heartbeats=True):
                if event.finished:
                    return

        try:
            await asyncio.wait_for(until_finished(), bound)
        except (asyncio.TimeoutError, TimeoutError):
            # as Job.wait: a finished job is no timeout, however short the wait was
            with self._unanswered(timeout):
                await self.client.run_flow(self._finished_flow(timeout))

    async def result(self, timeout: float | None = None) -> ProgramResult:
        """As ``Job.result``."""
        await self.wait(timeout)
        return await self.client.run_flow(self.result_flow())

    async def cancel(self) -> dict[str, Any]:
        """``DELETE /v1/jobs/{id}``: cancel (idempotent: a finished or cancelled job is left
        as it is); the job's state once the cancel took effect, as ``Job.cancel``."""
        return await self.client.run_flow(self.state_flow("DELETE"))


#: how long the question that ends a bounded wait (has the job finished?) waits for its
#: answer: a server answers it at once, and a frozen one (stopped, a hung proxy) accepts it
#: and never answers: ``result(timeout=1)`` waited for ever there, where it raised at 1 s
STATE_CHECK_SECONDS = 5.0


def timed_out(
    job_id: str, timeout: object, why: KCoralError | TransportError | None = None
) -> TimeoutError:
    """The ``TimeoutError`` of a wait whose time is up; ``why``: what kept its job's state
    out of reach (a router's ``503`` whose node holding it is away, a server that did not
    answer), said with it."""
    message = f"job {job_id} did not finish within {timeout} s"
    if why is None:
        return TimeoutError(message)
    return TimeoutError(f"{message} ({why.message if isinstance(why, KCoralError) else why})")


def check_failed(
    job_id: str, timeout: object, exc: KCoralError | TransportError
) -> KCoralError | TimeoutError:
    """What a wait whose time is up raises when its question about the job's state got no
    usable answer: ``TimeoutError`` saying why for a ``503`` or no answer at all (within
    ``STATE_CHECK_SECONDS``), any other ``KCoralError`` as it is (the job is unknown, ...)."""
    if isinstance(exc, KCoralError) and exc.status_code != 503:
        return exc
    return timed_out(job_id, timeout, exc)


def check_job_id(job_id: object) -> str:
    """A job id as given to ``client.job``: a non-empty ``str`` usable in a URL path."""
    return check_path_id(job_id, "job")


def check_path_id(value: object, what: str) -> str:
    """A job or session id as a caller gives it: one URL path segment. ``.`` and ``..`` are
    refused too: the URL is normalized before it is sent, so ``client.job(".")`` asked for
    the job list and ``attach_session("../jobs")`` read it as a session record."""
    if not isinstance(value, str):
        raise TypeError(f"{what}_id must be a str, not {type(value).__name__}")
    if value in ("", ".", "..") or any(c in value for c in "/?#%") or not value.isprintable():
        raise ValueError(f"invalid {what} id {value!r}")
    return value


def jobs_unsupported(base_url: str) -> KCoralError:
    """The error ``submit`` raises when ``/v1/info`` does not list ``jobs``."""
    return KCoralError(404, f"the server at {base_url} does not offer jobs", kind="unavailable")


def require_jobs(features: object, base_url: str) -> None:
    """Raise ``jobs_unsupported`` unless ``/v1/info``'s ``features`` list ``jobs``."""
    if not isinstance(features, list) or "jobs" not in features:
        raise jobs_unsupported(base_url)


def next_submission_step(
    negotiation: ExecuteNegotiation,
    status: int,
    headers: Mapping[str, str],
    content_type: str | None,
    body: bytes | memoryview,
) -> tuple[str, str] | Attempt:
    """One answer to ``POST /v1/jobs``: ``(job_id, request_id)`` once accepted (202), else
    the negotiation's next ``Attempt`` (after a ``CACHE_MISS``); raises as ``execute`` would
    for a refusal, and ``ProtocolError`` for a result where a job was expected."""
    if status == 202:
        return decode_job_accepted(body)
    outcome = negotiation.handle_response(status, headers, content_type, body)
    if not isinstance(outcome, Attempt):
        raise ProtocolError("the server answered a job submission with a result")
    return outcome
