"""Sessions on the client (EXTENSIONS §11): ``client.session(gpu_count=1)`` pins a worker,
runs programs in it (their ``kcoral.session.namespace`` survives from one to the next) and
ends it when the ``with`` block ends.

The requests are flows of the client core (``kcoral.connection.transport.Flow``), so ``Session`` and
``AsyncSession`` only drive them, as ``Client`` and ``AsyncClient`` do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar, cast

from kcoral import base_client
from kcoral.connection.transport import Flow, Request
from kcoral.errors import KCoralError, ProtocolError, TransportError
from kcoral.jobs import AsyncJob, Job, check_path_id
from kcoral.protocol.errors import ValidationError
from kcoral.protocol.selector import SELECT_HEADER, Selector, format_selector
from kcoral.protocol.strict_json import loads_strict
from kcoral.response import decode_json_object, error_from_response

if TYPE_CHECKING:
    from kcoral.async_client import AsyncClient
    from kcoral.base_client import BaseClient
    from kcoral.client import Client
    from kcoral.connection.transport import Response
    from kcoral.program import Program
    from kcoral.remote import RemoteFunction
    from kcoral.results import ProgramResult

JSON_HEADERS = {"Content-Type": "application/json"}
T = TypeVar("T")

#: The start of a router's 503 ``no_node`` for a session it has not found yet, in its first
#: seconds (ROUTER §13): answered before anything reached a node, so asking again is safe.
NOT_FOUND_YET = "session not found yet"
#: How long a session's request is asked again after that 503 (EXTENSIONS §11): a node
#: reconnects to a restarted router within its back-off (1 s, doubling), so a restart of
#: a few seconds is bridged; past this, the router's answer is raised.
FIND_WAIT_SECONDS = 10.0
#: A wait up to this long passes without a word; a longer one says what it waits for.
QUIET_WAIT_SECONDS = 1.0


def session_options(gpu_count: int | None, idle_timeout: float | None) -> dict[str, Any]:
    """The ``POST /v1/sessions`` body, checked before anything is sent."""
    body: dict[str, Any] = {}
    if gpu_count is not None:
        if isinstance(gpu_count, bool) or not isinstance(gpu_count, int) or gpu_count < 1:
            raise ValueError("gpu_count must be an int >= 1")
        body["gpu_count"] = gpu_count
    if idle_timeout is not None:
        if (
            isinstance(idle_timeout, bool)
            or not isinstance(idle_timeout, (int, float))
            or not math.isfinite(idle_timeout)
            or idle_timeout <= 0
        ):
            raise ValueError("idle_timeout must be a finite number of seconds > 0")
        body["idle_timeout_seconds"] = idle_timeout
    return body


def _record(expected: int, response: Response, what: str) -> dict[str, Any]:
    if response.status != expected:
        raise error_from_response(response.status, response.headers, response.data)
    return decode_json_object(response.data, what)


def create_flow(body: dict[str, Any], selector: Selector | None = None) -> Flow[dict[str, Any]]:
    """``POST /v1/sessions``: the new session's record; ``selector`` (checked) is sent as
    ``X-KCoral-Select`` (EXTENSIONS §14)."""
    data = json.dumps(body).encode()
    headers = dict(JSON_HEADERS)
    if selector:
        headers[SELECT_HEADER] = format_selector(selector)
    response = yield Request("POST", "/v1/sessions", headers, [data], len(data))
    return _record(201, response, "session record")


def _status_read(path: str) -> Request:
    """A session's or the sessions' record: answered at once, so bounded as ``info()`` is
    (a frozen server held ``%kcoral status`` and ``session list`` for ever)."""
    return Request("GET", path, read_timeout=base_client.STATUS_READ_TIMEOUT_SECONDS)


def record_flow(session_id: str) -> Flow[dict[str, Any]]:
    """``GET /v1/sessions/{id}``."""
    response = yield _status_read(f"/v1/sessions/{session_id}")
    return _record(200, response, "session record")


def list_flow() -> Flow[list[dict[str, Any]]]:
    """``GET /v1/sessions``: the caller's session records, newest first."""
    response = yield _status_read("/v1/sessions")
    if response.status != 200:
        raise error_from_response(response.status, response.headers, response.data)
    return decode_session_list(response.data)


def decode_session_list(body: bytes | memoryview) -> list[dict[str, Any]]:
    """The records of a ``GET /v1/sessions`` answer (a JSON array of objects)."""
    try:
        document = loads_strict(bytes(body))
    except ValidationError as exc:
        raise ProtocolError(f"session list is not valid JSON: {exc}") from None
    if not isinstance(document, list) or not all(isinstance(item, dict) for item in document):
        raise ProtocolError("session list is not an array of objects")
    return document


def interrupt_flow(session_id: str) -> Flow[dict[str, Any]]:
    """``POST /v1/sessions/{id}/interrupt``: ``KeyboardInterrupt`` in the running program."""
    response = yield Request("POST", f"/v1/sessions/{session_id}/interrupt")
    return _record(200, response, "session record")


def end_flow(session_id: str) -> Flow[dict[str, Any]]:
    """``DELETE /v1/sessions/{id}`` (idempotent)."""
    response = yield Request("DELETE", f"/v1/sessions/{session_id}")
    return _record(200, response, "session record")


def find_pause(exc: KCoralError, waited: float) -> float | None:
    """Seconds to wait before a session's request is asked again after ``exc``, having
    waited ``waited`` already; None: ``exc`` is raised (another answer, or the wait is up).
    The router's ``Retry-After`` is honoured, within what is left of the wait."""
    if (exc.status_code, exc.kind) != (503, "no_node") or not exc.message.startswith(NOT_FOUND_YET):
        return None
    left = FIND_WAIT_SECONDS - waited
    if left <= 0:
        return None
    pause = 1.0 if exc.retry_after is None else exc.retry_after
    return min(max(pause, 0.2), left)  # never a busy loop, never past the bound


class FindWait:
    """One session request's wait for a router that has not found the session yet."""

    def __init__(self, session_id: str, say: Callable[[str], None] | None) -> None:
        self.session_id = session_id
        self.say = say or _to_stderr
        self.started = time.monotonic()
        self.said = False

    def pause(self, exc: KCoralError) -> float | None:
        """As ``find_pause``; the first wait that goes past ``QUIET_WAIT_SECONDS`` says so."""
        waited = time.monotonic() - self.started
        pause = find_pause(exc, waited)
        if pause is not None and not self.said and waited + pause > QUIET_WAIT_SECONDS:
            self.said = True
            self.say(
                f"session {self.session_id[:8]}: the router just started and has not found "
                f"it yet (its node may be reconnecting); asking again for up to "
                f"{FIND_WAIT_SECONDS:.0f} s"
            )
        return pause


def run_patiently(
    client: Client,
    session_id: str,
    on_wait: Callable[[str], None] | None,
    flow: Callable[[], Flow[T]],
) -> T:
    """Run a fresh ``flow()``, again while a restarted router has not found session
    ``session_id`` (``FindWait``): a session's cell, or its attach, right after a router's
    restart failed with its 503 ``session not found yet`` for the second its node took to
    reconnect."""
    wait = FindWait(session_id, on_wait)
    while True:
        try:
            return client.run_flow(flow())
        except KCoralError as exc:
            pause = wait.pause(exc)
            if pause is None:
                raise
        time.sleep(pause)


async def await_patiently(
    client: AsyncClient,
    session_id: str,
    on_wait: Callable[[str], None] | None,
    flow: Callable[[], Flow[T]],
) -> T:
    """``run_patiently`` for an ``AsyncClient``, waiting without blocking the event loop."""
    wait = FindWait(session_id, on_wait)
    while True:
        try:
            running: Awaitable[T] = client.run_flow(flow())
            return await running
        except KCoralError as exc:
            pause = wait.pause(exc)
            if pause is None:
                raise
        await asyncio.sleep(pause)


def attach(client: Client, session_id: str) -> Session:
    """``Client.attach_session``: the session's record is read as its requests are, asking
    again while a restarted router has not found it (EXTENSIONS §11)."""
    checked = check_path_id(session_id, "session")
    record = run_patiently(client, checked, None, lambda: record_flow(checked))
    return Session(client, _record_of(checked, record))


async def attach_async(client: AsyncClient, session_id: str) -> AsyncSession:
    """``AsyncClient.attach_session``: ``attach`` awaited; the session it returns has
    started (``async with`` on it ends it when the block ends, as on a ``Session``)."""
    checked = check_path_id(session_id, "session")
    record = await await_patiently(client, checked, None, lambda: record_flow(checked))
    return AsyncSession(client, {})._adopt(_record_of(checked, record))


def _record_of(session_id: str, record: dict[str, Any]) -> dict[str, Any]:
    """The record read for ``session_id``, if it is that session's: a server that answered
    another session's record would have had the caller's programs, and its end, sent to a
    session it never named (``session.id`` would not be the id attached to)."""
    if _check_id(record.get("session_id")) != session_id:
        raise ProtocolError(
            f"asked for session {session_id}, the server answered the record of session "
            f"{record['session_id']}"
        )
    return record


def _to_stderr(line: str) -> None:
    sys.stderr.write(f"kcoral: {line}\n")
    sys.stderr.flush()


def _check_id(session_id: object) -> str:
    """The session id of a server's record: 36 characters and one URL path segment (a
    server's '../jobs/...' would send the session's programs, and its end, to another route
    of that address)."""
    if isinstance(session_id, str) and len(session_id) == 36:
        with contextlib.suppress(ValueError):
            return check_path_id(session_id, "session")
    raise ProtocolError(f"the session record has no valid session_id: {session_id!r:.80}")


class _SessionBase:
    """What both flavours share: the id, the last record seen, the selector it was started
    with (its programs send it: a router checks it against the session's node), the
    execute flow."""

    def __init__(
        self, client: BaseClient, record: dict[str, Any], select: Selector | None = None
    ) -> None:
        self.client = client
        self.id = _check_id(record.get("session_id"))
        self.record = record  # as last read from the server
        self.select: Selector = dict(select or {})
        #: where a wait for a restarted router says what it waits for (one line); None:
        #: stderr, as ``kcoral: <line>`` (the notebook shows it on the cell's status line)
        self.on_wait: Callable[[str], None] | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id!r})"

    def _options(self, options: dict[str, Any]) -> dict[str, Any]:
        """A program's options: ``select`` absent or None means the session's."""
        if options.get("select") is None:
            return {**options, "select": self.select}
        return options

    def _path(self, action: str = "") -> str:
        """The session's URL path; an ``AsyncSession`` that was never started has no id, and
        its requests went to ``/v1/sessions//…`` (``HTTP 404: not found``)."""
        if not self.id:
            raise RuntimeError(
                "this AsyncSession has not started: use 'async with client.session() as "
                "session' or 'await session.start()'"
            )
        return f"/v1/sessions/{self.id}{action}"

    def _execute_flow(self, program: Program, options: dict[str, Any]) -> Flow[ProgramResult]:
        path = self._path("/execute")
        return self.client.execute_flow(program, path=path, **self._options(options))

    def function(
        self,
        bare: object = None,
        /,
        *,
        timeout: float | None = None,
        output_limit_bytes: int | None = None,
        cpu_only: bool = False,
        serialization: str = "json",
    ) -> Callable[[Callable[..., Any]], RemoteFunction]:
        """``@session.function()``: as ``client.function()`` (CLIENT_API §8), each call
        running in the session (its module-level state is the session's)."""
        from kcoral.remote import (  # as BaseClient.function does
            refuse_bare_decorator,
            remote_function_decorator,
        )

        refuse_bare_decorator(bare, "session")
        return remote_function_decorator(
            cast("Session | AsyncSession", self),
            timeout=timeout,
            output_limit_bytes=output_limit_bytes,
            cpu_only=cpu_only,
            serialization=serialization,
        )

    def _submit_flow(
        self, program: Program, options: dict[str, Any]
    ) -> Flow[tuple[str, str, tuple[str, ...]]]:
        path = self._path("/jobs")
        return self.client.submit_flow(program, path=path, **self._options(options))


class Session(_SessionBase):
    """A session of a ``Client``: ``execute`` runs programs on its pinned worker."""

    client: Client
    is_async: ClassVar[Literal[False]] = (
        False  # remote functions call ``execute`` as they would a client's
    )

    def execute(self, program: Program, **options: Any) -> ProgramResult:
        """Run ``program`` in the session (``Client.execute``'s options); ``KCoralError``
        kind ``session_ended`` (HTTP 410) once the session has ended, saying why."""
        return self._patiently(lambda: self._execute_flow(program, options))

    def submit(self, program: Program, **options: Any) -> Job:
        """Start ``program`` in the session as a job (``Client.submit``'s options)."""
        job_id, request_id, blobs = self._patiently(lambda: self._submit_flow(program, options))
        return Job(self.client, job_id, request_id=request_id, known_blobs=blobs)

    def _patiently(self, flow: Callable[[], Flow[T]]) -> T:
        """``run_patiently`` for this session."""
        return run_patiently(self.client, self.id, self.on_wait, flow)

    def info(self) -> dict[str, Any]:
        """The session's record (``GET /v1/sessions/{id}``)."""
        self.record = self._patiently(lambda: record_flow(self.id))
        return dict(self.record)

    def interrupt(self) -> dict[str, Any]:
        """Raise ``KeyboardInterrupt`` in the session's running program (``POST
        /v1/sessions/{id}/interrupt``); a program that stops within 5 s leaves the session
        and its state alone (EXTENSIONS §11). Also answers when nothing runs. Returns the
        session's record."""
        self.record = self._patiently(lambda: interrupt_flow(self.id))
        return dict(self.record)

    def close(self) -> None:
        """End the session (its state is gone); a session already ended stays ended."""
        try:
            self.record = self._patiently(lambda: end_flow(self.id))
        except KCoralError as exc:
            # 404: dropped after it ended long ago; 410: a router lost its node (ended)
            if exc.status_code not in (404, 410):
                raise

    def __enter__(self) -> Session:
        return self

    def __exit__(self, kind: object, error: BaseException | None, trace: object) -> None:
        if error is None:
            self.close()
            return
        try:
            self.close()
        except (KCoralError, TransportError) as failed:
            _note_unended(self.id, error, failed)


class AsyncSession(_SessionBase):
    """A session of an ``AsyncClient``: ``async with client.session() as s``."""

    client: AsyncClient
    is_async: ClassVar[Literal[True]] = True

    def __init__(
        self, client: AsyncClient, body: dict[str, Any], select: Selector | None = None
    ) -> None:
        self.client = client
        self._body = body
        self.id = ""
        self.record: dict[str, Any] = {}
        self.select = dict(select or {})
        self.on_wait = None

    async def start(self) -> AsyncSession:
        """Create the session on the server (``async with`` does this)."""
        if not self.id:
            self._adopt(await self.client.run_flow(create_flow(self._body, self.select)))
        return self

    def _adopt(self, record: dict[str, Any]) -> AsyncSession:
        """This session is the one ``record`` describes (just created, or attached to)."""
        on_wait = self.on_wait  # set before the start: kept
        super().__init__(self.client, record, self.select)
        self.on_wait = on_wait
        return self

    async def execute(self, program: Program, **options: Any) -> ProgramResult:
        """As ``Session.execute``."""
        return await self._patiently(lambda: self._execute_flow(program, options))

    async def submit(self, program: Program, **options: Any) -> AsyncJob:
        """As ``Session.submit``."""
        submission = await self._patiently(lambda: self._submit_flow(program, options))
        job_id, request_id, blobs = submission
        return AsyncJob(self.client, job_id, request_id=request_id, known_blobs=blobs)

    async def _patiently(self, flow: Callable[[], Flow[T]]) -> T:
        """As ``Session._patiently``, waiting without blocking the event loop."""
        return await await_patiently(self.client, self.id, self.on_wait, flow)

    async def info(self) -> dict[str, Any]:
        """As ``Session.info``."""
        self._path()
        self.record = await self._patiently(lambda: record_flow(self.id))
        return dict(self.record)

    async def interrupt(self) -> dict[str, Any]:
        """As ``Session.interrupt``."""
        self._path()
        self.record = await self._patiently(lambda: interrupt_flow(self.id))
        return dict(self.record)

    async def close(self) -> None:
        """As ``Session.close``; a session that never started has nothing to end."""
        if not self.id:
            return
        try:
            self.record = await self._patiently(lambda: end_flow(self.id))
        except KCoralError as exc:
            if exc.status_code not in (404, 410):
                raise

    async def __aenter__(self) -> AsyncSession:
        return await self.start()

    async def __aexit__(self, kind: object, error: BaseException | None, trace: object) -> None:
        if error is None:
            await self.close()
            return
        try:
            await self.close()
        except (KCoralError, TransportError) as failed:
            _note_unended(self.id, error, failed)


def _note_unended(session_id: str, error: BaseException, failed: Exception) -> None:
    """A ``with`` block that raised, whose session's end failed too (its server gone, say):
    the block's error stays the one raised, with a note (Python 3.11+) that the session may
    live on until its idle timeout. Before, the end's failure replaced it, and a script's
    last line named the ``DELETE`` instead of what went wrong."""
    add_note = getattr(error, "add_note", None)
    if add_note is not None:
        add_note(
            f"kcoral: session {session_id} was not ended ({failed}); if its server still "
            "runs, it ends after its idle timeout"
        )
