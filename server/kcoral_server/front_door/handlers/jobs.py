"""``/v1/jobs`` endpoints (EXTENSIONS §5).

``POST /v1/jobs`` is ``POST /execute`` up to admission (same streamed body, refusals,
validation and ``CACHE_MISS`` negotiation, all answered as ``/execute`` answers them); once
the request is admitted the handler answers 202 and the request runs on in the background,
its outcome stored in the job.

Who can reach what: every endpoint acts only on the caller's own jobs (``self.identity``,
from the bearer token or, behind a router, from the router's tunnel); another identity's job
answers exactly as an unknown id does. An admin identity reaches all.
"""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Generator
from typing import TYPE_CHECKING

import tornado.iostream
import tornado.web

from kcoral.protocol.headers import CANCEL_UNFOLLOWED_HEADER, REQUEST_ID_HEADER
from kcoral_server.execution.responses import Refusal, saturated
from kcoral_server.front_door.handler_defaults import SMALL_BODY_BYTES
from kcoral_server.front_door.handlers.base import BaseHandler
from kcoral_server.front_door.handlers.execute import ExecuteHandler
from kcoral_server.front_door.token_reload import revoked_message
from kcoral_server.jobs.followers import unfollowed_grace
from kcoral_server.jobs.job_listing import LEFT_OUT_HEADER, LIMIT_PROBLEM, listing_limit
from kcoral_server.jobs.store import Expiry, Job

if TYPE_CHECKING:
    from kcoral_server.execution.pipeline import ExecuteRequest
    from kcoral_server.execution.responses import Reply
    from kcoral_server.front_door.app import ServerState

JOB_ID_PATTERN = r"([^/]+)"
Pieces = Generator[bytes, None, None]  # a stored file, read a piece at a time


@tornado.web.stream_request_body
class JobSubmitHandler(ExecuteHandler):
    """``POST /v1/jobs`` (and ``GET /v1/jobs``: the recent jobs, newest first)."""

    ALLOWED: tuple[str, ...] = ("GET", "POST")

    def prepare(self) -> None:
        if self.request.method == "GET":
            self.body_unread = False
            BaseHandler.prepare(self)
            if not self._finished:
                self.limit_body(SMALL_BODY_BYTES)  # a GET reads none (nor holds it)
            return
        super().prepare()

    #: the identity whose job slot this request holds until it is a job's or ends
    slot_owner: str | None = None

    def admission_refusal(self) -> Refusal | None:
        """503 ``busy`` when ``--max-queued-jobs`` jobs are queued or running, or the
        caller holds its share of them (EXTENSIONS §5); else the request holds a slot."""
        why = self.state.job_slots.take(self.identity.name)
        if why is not None:
            return saturated(why)
        self.slot_owner = self.identity.name
        return None

    def _release(self) -> None:
        # Refused, answered as /execute answers (a cache miss) or gone: no job holds it.
        owner, self.slot_owner = self.slot_owner, None
        if owner is not None:
            self.state.job_slots.give_back(owner)
        super()._release()

    def get(self) -> None:
        limit = listing_limit(self.get_query_argument("limit", None))
        if limit is None:
            self.send_error_json(400, "parse", LIMIT_PROBLEM)
            return
        jobs = self.state.jobs.newest_first(self.identity)
        self.set_header(LEFT_OUT_HEADER, str(max(0, len(jobs) - limit)))
        self.send_json(200, [job.state() for job in jobs[:limit]])

    async def post(self) -> None:
        if self.answer_pending_refusal() or self._finished or self.body is None:
            return
        grace = unfollowed_grace(self.request.headers.get(CANCEL_UNFOLLOWED_HEADER))
        if isinstance(grace, str):
            self.send_error_json(400, "parse", grace)
            return
        state = self.state
        job = state.jobs.new_job(self.request_id, self.identity)
        slot, self.slot_owner = self.slot_owner, None  # the job's until its request ends
        request = self.new_request(job)
        self.pipeline = request  # a disconnect before the 202 cancels it, as for /execute
        task = asyncio.ensure_future(request.run())
        await asyncio.wait((task, job.accepted_future), return_when=asyncio.FIRST_COMPLETED)
        self.pipeline = None
        if job.accepted_future.done():
            state.jobs.add(job)
            if grace is not None:
                state.jobs.cancel_when_unfollowed(job, grace)
            # The queued job holds its body until its request ends, as an /execute request
            # does while its client waits: the charge stays on the in-flight bytes until
            # then, not until the 202, or queued jobs would hold bodies without bound.
            held = (self.identity.name, self.inflight)
            self.inflight = 0
            running = asyncio.ensure_future(_finish_job(state, job, request, task, held, slot))
            state.jobs.running.add(running)
            running.add_done_callback(state.jobs.running.discard)
            self.send_json(
                202, {"job_id": job.id, "request_id": job.request_id, "status": "QUEUED"}
            )
            return
        # Refused or a cache miss: answered exactly as /execute answers it; no job exists.
        if slot is not None:
            state.job_slots.give_back(slot)
        state.open_requests += 1
        try:
            reply = task.result()
            try:
                await self.send_reply(reply)
            finally:
                reply.close()
        finally:
            state.open_requests -= 1
            state.reply_sent()


async def _finish_job(
    state: ServerState,
    job: Job,
    request: ExecuteRequest,
    task: asyncio.Future[Reply],
    held: tuple[str, int],
    slot: str | None,
) -> None:
    try:
        reply = await task  # the request's body is closed by then
    finally:
        state.inflight.release(*held)  # (its owner, the body's bytes)
        if slot is not None:
            state.job_slots.give_back(slot)
    try:
        result = await state.jobs.store_result(reply, state.executor)
    finally:
        reply.close()
    job.finish(request, reply, result)
    await state.jobs.finished(job, state.executor)
    state.reply_sent()


class JobHandler(BaseHandler):
    """Base of the per-job endpoints: the job or a 404 (``not_found`` / ``job_expired``)."""

    def find(self, job_id: str) -> Job | None:
        found = self.state.jobs.lookup(job_id, self.identity)
        if isinstance(found, Job):
            return found
        if found is None:
            self.send_error_json(404, "not_found", self.unknown_job_message())
        else:
            self.expired(found)
        return None

    def unknown_job_message(self) -> str:
        """The ``not_found`` message: with when this server started, since jobs live in its
        memory (a script polling its job across a restart read ``job not found`` of the job
        it had watched run). Another identity's job reads the same, as it must."""
        started = self.state.started_at.split(".")[0].rstrip("Z") + "Z"  # to the second
        return f"job not found (this server started at {started}; jobs do not outlive a restart)"

    def expired(self, expiry: Expiry | None) -> None:
        """404 ``job_expired``: its owner learns why the job went (EXTENSIONS §5)."""
        self.send_error_json(404, "job_expired", expiry.message if expiry else "job expired")


class JobStateHandler(JobHandler):
    """``GET /v1/jobs/{id}`` and ``DELETE /v1/jobs/{id}`` (cancel, idempotent)."""

    ALLOWED: tuple[str, ...] = ("GET", "DELETE")

    def get(self, job_id: str) -> None:
        job = self.find(job_id)
        if job is not None:
            self.send_json(200, job.state())

    async def delete(self, job_id: str) -> None:
        job = self.find(job_id)
        if job is None:
            return
        if not job.finished:
            job.cancel(by=self.identity.name)
            # A queued job ends at once; a running one once its process tree is gone.
            event = asyncio.Event()
            job.listeners.add(event)
            try:
                while not job.finished:
                    event.clear()
                    await event.wait()
            finally:
                job.listeners.discard(event)
        self.send_json(200, job.state())


class JobResultHandler(JobHandler):
    """``GET /v1/jobs/{id}/result``: what ``/execute`` would have answered."""

    async def get(self, job_id: str) -> None:
        job = self.find(job_id)
        if job is None:
            return
        if job.status == "CANCELLED":
            job.result_read = True  # the answer a cancelled job has (a draining server waits)
            by = f" by admin {job.cancelled_by}" if job.cancelled_by else ""
            if job.revoked:
                by = f": {revoked_message(job.owner)}"
            elif job.follow_watch is not None and job.follow_watch.fired:
                by = (
                    f": no client followed its events for {job.follow_watch.grace} s "
                    f"({CANCEL_UNFOLLOWED_HEADER})"
                )
            elif job.session_end is not None:
                # its session ended under it (a DELETE, an interrupt's grace): said so, where
                # the owner of a session job read only "the job was cancelled" (jobs soak)
                by = f": {job.session_end}"
            self.send_error_json(409, "cancelled", f"the job was cancelled{by}")
            return
        result = job.result
        if result is None:
            self.send_error_json(409, "not_finished", "the job has not finished")
            return
        job.result_read = True
        pieces = None
        if result.file is not None:
            try:  # opened now: the job may be dropped while its result is being sent
                pieces = result.file.chunks()
                first = await _next_piece(self.state, pieces)
            except OSError:
                self.expired(self.state.jobs.expired.get(job_id))  # dropped since the lookup
                return
        self.set_status(result.status)
        for name, value in result.headers.items():
            self.set_header(name, value)
        # The stored /execute answer is replayed whole: its header names the request its
        # body names (PROTOCOL §7.2), not this GET.
        self.set_header(REQUEST_ID_HEADER, job.request_id)
        if pieces is None:
            self.finish(result.body)
            return
        # From disk a piece at a time: the front-end never holds the whole body.
        assert result.file is not None  # the pieces come from it
        self.set_header("Content-Length", str(result.file.length))
        try:
            while first is not None:
                self.write(first)
                await self.flush()
                first = await _next_piece(self.state, pieces)
        except tornado.iostream.StreamClosedError:
            return
        finally:
            pieces.close()
        self.finish()


#: job event streams one identity may hold open on a server at once (EXTENSIONS §5), and
#: never more than a quarter of the server's descriptors (``streams_per_identity``): a
#: script that waits on a hundred jobs' results at once follows a hundred streams
MAX_STREAMS_PER_IDENTITY = 1024


def streams_per_identity() -> int:
    """How many job event streams one identity may hold open here now."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_STREAMS_PER_IDENTITY
    return max(16, min(MAX_STREAMS_PER_IDENTITY, soft // 4))


class JobEventsHandler(JobHandler):
    """``GET /v1/jobs/{id}/events``: Server-Sent Events, replayed after ``Last-Event-ID``."""

    def initialize(self, state: ServerState) -> None:
        super().initialize(state)
        self.wake = asyncio.Event()
        self.closed = False

    async def get(self, job_id: str) -> None:
        job = self.find(job_id)
        if job is None:
            return
        # Who can reach this: any token holder, for their own jobs; each stream holds a
        # descriptor for as long as its job runs, and one holder opening thousands took
        # the server's (attack sweep). A client that follows a job needs one.
        streams, caller, cap = self.state.open_streams, self.identity.name, streams_per_identity()
        if streams[caller] >= cap:
            self.set_header("Retry-After", "5")
            message = (
                f"{cap} job event streams of yours are open on this server; close one "
                "first (a job's status needs none)"
            )
            self.send_error_json(429, "too_many_streams", message)
            return
        streams[caller] += 1
        try:
            await self._stream(job)
        finally:
            streams[caller] -= 1
            if streams[caller] <= 0:
                del streams[caller]

    async def _stream(self, job: Job) -> None:
        position = _last_event_id(self.request.headers.get("Last-Event-ID"))
        self.set_header("Content-Type", "text/event-stream; charset=utf-8")
        self.set_header("Cache-Control", "no-cache")
        self.set_header("X-Accel-Buffering", "no")
        job.listeners.add(self.wake)
        checked = self.state.authenticator  # the tokens the caller was checked against
        watch = job.follow_watch
        if watch is not None:
            watch.follower_came()
        try:
            try:
                await self.flush()  # headers now: the client knows the stream is open
            except tornado.iostream.StreamClosedError:
                return
            while not self.closed:
                self.wake.clear()
                if self.state.authenticator is not checked:  # the tokens were reloaded
                    checked = self.state.authenticator
                    caller = self.authenticate()
                    if caller is None or not caller.owns(job.owner):
                        break  # revoked (or no longer an admin): its next request gets 401
                if job.events_file is not None:
                    # A finished job's events on disk: the rest of them, a piece at a time.
                    if position < job.event_count:
                        start = job.event_offsets[position]
                        if not await self._send_file(job.events_file.chunks(start)):
                            return
                    break
                end = len(job.events)
                if end > position:
                    self.write(b"".join(job.events[position:end]))
                    position = end
                    try:
                        await self.flush()
                    except tornado.iostream.StreamClosedError:
                        return
                if job.finished and position >= len(job.events):
                    break
                await self.wake.wait()
        finally:
            job.listeners.discard(self.wake)
            if watch is not None:
                watch.follower_left()
        if not self.closed:
            self.finish()

    async def _send_file(self, pieces: Pieces) -> bool:
        """Write every piece; False when the client went away. A file already removed (the
        job dropped) ends the stream early; a reconnect then learns ``job_expired``."""
        try:
            while (piece := await _next_piece(self.state, pieces)) is not None:
                self.write(piece)
                await self.flush()
        except tornado.iostream.StreamClosedError:
            return False
        except OSError:
            return True
        finally:
            pieces.close()
        return True

    def on_connection_close(self) -> None:
        self.closed = True
        self.wake.set()
        super().on_connection_close()


async def _next_piece(state: ServerState, pieces: Pieces) -> bytes | None:
    """The next piece of a stored file, read off the event loop (None at the end)."""
    return await asyncio.get_running_loop().run_in_executor(state.executor, next, pieces, None)


#: the most digits a ``Last-Event-ID`` we could have sent has (ids count events)
LAST_EVENT_ID_DIGITS = 18


def _last_event_id(value: str | None) -> int:
    """Events to skip: the ``Last-Event-ID`` number (0 when absent, not a number, or longer
    than any id this server sends: ``int`` refuses strings of more than 4300 digits, and
    any caller of the job, a token holder, chooses this header)."""
    if value is None:
        return 0
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > LAST_EVENT_ID_DIGITS:
        return 0
    return int(text)
