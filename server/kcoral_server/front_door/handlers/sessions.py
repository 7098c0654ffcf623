"""``/v1/sessions``: create, list, inspect, end, and run programs in a session
(EXTENSIONS §11). Another identity's session answers exactly as an unknown id (404)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from kcoral.protocol.selector import SELECT_HEADER
from kcoral_server.execution.control import RequestObserver
from kcoral_server.execution.pipeline import ExecuteRequest
from kcoral_server.execution.responses import Refusal
from kcoral_server.front_door.handlers.base import BaseHandler
from kcoral_server.front_door.handlers.execute import ExecuteHandler
from kcoral_server.front_door.handlers.jobs import JobSubmitHandler
from kcoral_server.front_door.node_fit import selector_refusal
from kcoral_server.pool.queue import NoWorker

if TYPE_CHECKING:
    from kcoral_server.sessions.registry import Session

#: any one path segment: an id that is not one of the server's (not a UUID either) is an
#: unknown session, as through a router; it read Tornado's bare ``404 not found``
SESSION_ID_PATTERN = r"(?P<session_id>[^/]+)"
NOT_FOUND = "unknown session id"

#: a session whose creator went away before its 201 (EXTENSIONS §11)
CLIENT_LEFT = "session ended: its client left before it had started"
#: POST /v1/sessions on a server with --max-sessions 0 (EXTENSIONS §11)
SESSIONS_OFF = "sessions are off on this server (--max-sessions 0)"


class SessionsHandler(BaseHandler):
    """``POST /v1/sessions`` (create) and ``GET /v1/sessions`` (the caller's, newest first)."""

    ALLOWED: tuple[str, ...] = ("GET", "POST")
    # the sizes and that no flag moves this limit: the text alone did not say which limit
    TOO_LARGE_NOTE = "fixed: a session body holds only gpu_count and idle_timeout_seconds"
    client_left = False  # the caller closed its connection before the answer

    def get(self) -> None:
        self.send_json(200, self.state.sessions.listed(self.identity))

    async def post(self) -> None:
        if self.state.config.max_sessions == 0:
            # Off, not full: a 503 asked to retry what never can succeed (flags soak); the
            # server lists no `sessions` feature, as one without them answers the path 404.
            self.send_error_json(404, "not_found", SESSIONS_OFF)
            return
        unfit = selector_refusal(self.state, self.request.headers.get_list(SELECT_HEADER))
        if unfit is not None:  # a session of a selector this server does not fit
            self.send_error_json(unfit.status, unfit.kind, unfit.message)
            return
        try:
            gpu_count, idle = self._options()
        except ValueError as exc:
            self.send_error_json(400, "parse", str(exc))
            return
        try:
            session = await self.state.sessions.create(self.identity, gpu_count, idle)
        except NoWorker as exc:
            self.send_error_json(503, "busy", str(exc))
            return
        if self.client_left:
            # Its start can wait long (CUDA starts under a GPU's lease, SERVER §5); a client
            # that gave up meanwhile never learns the id, and the seat stayed held, against
            # its owner's cap, until the idle timeout.
            session.end("deleted", CLIENT_LEFT)
            return
        self.send_json(201, session.record())

    def on_connection_close(self) -> None:
        self.client_left = True
        super().on_connection_close()

    def _options(self) -> tuple[int | None, float | None]:
        """``gpu_count`` and ``idle_timeout_seconds`` from the body, checked."""
        body: Any = {}
        if self.small_body.strip():  # at most SMALL_BODY_BYTES (BaseHandler)
            try:
                body = json.loads(self.small_body)
            except RecursionError:  # nesting deeper than the interpreter's stack: not ours
                raise ValueError("session body is nested too deeply") from None
            except ValueError:
                raise ValueError("session body is not JSON") from None
        if not isinstance(body, dict) or set(body) - {"gpu_count", "idle_timeout_seconds"}:
            raise ValueError("session body takes only gpu_count and idle_timeout_seconds")
        state = self.state
        gpu_count = body.get("gpu_count")
        if state.mode == "cpu":
            if gpu_count is not None:
                raise ValueError("gpu_count needs a GPU server")
        else:
            gpu_count = 1 if gpu_count is None else gpu_count
            gpus = len(state.gpu_ids)
            if not _is_int(gpu_count) or gpu_count < 1:
                raise ValueError(f"gpu_count must be an integer from 1 to {gpus}")
            if gpu_count > gpus:
                raise ValueError(f"gpu_count {gpu_count} exceeds this server's GPU count ({gpus})")
        idle = body.get("idle_timeout_seconds")
        limit = state.sessions.idle_seconds
        if idle is not None:
            if not isinstance(idle, int | float) or isinstance(idle, bool) or not 0 < idle:
                raise ValueError("idle_timeout_seconds must be a number above 0")
            if idle > limit:
                raise ValueError(f"idle_timeout_seconds exceeds --session-idle-seconds ({limit})")
        return gpu_count, None if idle is None else float(idle)


class SessionHandler(BaseHandler):
    """``GET /v1/sessions/{id}`` (its record) and ``DELETE`` (end it; idempotent)."""

    ALLOWED: tuple[str, ...] = ("GET", "DELETE")

    def _session(self, session_id: str) -> Session | None:
        session = self.state.sessions.get(self.identity, session_id)
        if session is None:
            self.send_error_json(404, "not_found", NOT_FOUND)
        return session

    def get(self, session_id: str) -> None:
        session = self._session(session_id)
        if session is not None:
            self.send_json(200, session.record())

    def delete(self, session_id: str) -> None:
        session = self._session(session_id)
        if session is not None:
            session.end("deleted", deleted_message(session.owner, self.identity.name))
            self.send_json(200, session.record())


def deleted_message(owner: str, caller: str) -> str:
    """Why a ``DELETE`` ended a session, as its owner will read it (EXTENSIONS §11): an admin
    ending another identity's session is named, so the owner does not read that they did it."""
    if caller == owner:
        return "session ended by its owner"
    return f"session ended by admin {caller}"


class SessionInterruptHandler(SessionHandler):
    """``POST /v1/sessions/{id}/interrupt``: ``KeyboardInterrupt`` in the running program."""

    ALLOWED: tuple[str, ...] = ("POST",)

    def post(self, session_id: str) -> None:
        session = self._session(session_id)
        if session is not None:
            session.interrupt()
            self.send_json(200, session.record())


class _InSession(ExecuteHandler):
    """What running a program in a session adds to ``/execute`` and ``POST /v1/jobs``: the
    session is found (or the request refused) before the body is read, and the program is
    pinned to it."""

    def prepare(self) -> None:
        super().prepare()
        self.session = _pinned_session(self)

    def selector_unfit(self) -> Refusal | None:
        """A program's selector must fit the session's server (409 ``selector_mismatch``);
        an unknown or another identity's session is answered 404 first, an ended one 410,
        whatever the selector (``_pinned_session``)."""
        session_id = self.path_kwargs.get("session_id", "")
        session = self.state.sessions.get(self.identity, session_id)
        if session is None or session.state == "ENDED":
            return None
        values = self.request.headers.get_list(SELECT_HEADER)
        return selector_refusal(self.state, values, in_session=True)

    def new_request(self, observer: RequestObserver | None = None) -> ExecuteRequest:
        request = super().new_request(observer)
        request.session = self.session
        return request

    async def post(self, session_id: str = "") -> None:  # Tornado passes the URL's id
        await super().post()


class SessionExecuteHandler(_InSession):
    """``POST /v1/sessions/{id}/execute``: as ``/execute``, on the session's worker."""

    def on_connection_close(self) -> None:
        # A client that goes away interrupts its running program instead of killing it
        # (EXTENSIONS §11): the session survives when the program stops within the grace.
        session = getattr(self, "session", None)
        if session is not None and self.pipeline is not None and session.running is self.pipeline:
            session.interrupt()
            self.pipeline = None
        super().on_connection_close()


def _pinned_session(handler: ExecuteHandler) -> Session | None:
    """The session a program is sent to, or None after refusing the request: 404 for an
    unknown (or another identity's) id, 403 for an admin's program in another identity's
    session, 410 once ended, 409 while a program runs."""
    if handler.refused:
        return None
    session_id = handler.path_kwargs.get("session_id", "")
    session = handler.state.sessions.get(handler.identity, session_id)
    if session is None:
        handler.refuse(Refusal(404, "not_found", NOT_FOUND, "rejected"))
        return None
    if session.owner != handler.identity.name:
        # An admin reaches every session, but its worker serves its owner alone (a worker
        # never serves two identities, SERVER §14): running the admin's program there
        # replaced the worker first, losing the owner's state, and ended the session.
        handler.refuse(Refusal(403, "forbidden", not_owner(session.owner), "rejected"))
        return None
    refusal = session.refusal()  # before the body is read
    if refusal is not None:
        handler.refuse(refusal)
        return None
    return session


def not_owner(owner: str) -> str:
    """Why an admin may not run a program in another identity's session (EXTENSIONS §11)."""
    return (
        f"this session runs only its owner's programs ({owner}); "
        "an admin may read, interrupt and end it"
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class SessionJobHandler(_InSession, JobSubmitHandler):
    """``POST /v1/sessions/{id}/jobs``: as ``POST /v1/jobs``, the program in the session;
    the job is then read, streamed and cancelled through ``/v1/jobs/{job_id}``."""

    ALLOWED: tuple[str, ...] = ("POST",)
