"""``/v1/jobs`` endpoints (EXTENSIONS §5).

``POST /v1/jobs`` is ``POST /execute`` up to admission (same streamed body, refusals,
validation and ``CACHE_MISS`` negotiation, all answered as ``/execute`` answers them); once
the request is admitted the handler answers 202 and the request runs on in the background,
its outcome stored in the job.
"""

from __future__ import annotations

import asyncio
from typing import Any

import tornado.iostream
import tornado.web
from kcoral_server.handlers.base import BaseHandler
from kcoral_server.handlers.execute import ExecuteHandler
from kcoral_server.jobs import Job

from kcoral.protocol.headers import REQUEST_ID_HEADER

JOB_ID_PATTERN = r"([^/]+)"
BIG_RESULT_BYTES = 1 << 20  # results at least this large are copied off the event loop


@tornado.web.stream_request_body
class JobSubmitHandler(ExecuteHandler):
    """``POST /v1/jobs`` (and ``GET /v1/jobs``: the recent jobs, newest first)."""

    ALLOWED = ("GET", "POST")

    def prepare(self) -> None:
        if self.request.method == "GET":
            self.body_unread = False
            BaseHandler.prepare(self)
            return
        super().prepare()

    def get(self) -> None:
        jobs = self.state.jobs.newest_first()
        self.send_json(200, [job.state() for job in jobs])

    async def post(self) -> None:
        if self._finished or self.body is None:
            return
        state = self.state
        job = state.jobs.new_job(self.request_id)
        request = self.new_request(job)
        self.pipeline = request  # a disconnect before the 202 cancels it, as for /execute
        task = asyncio.ensure_future(request.run())
        await asyncio.wait({task, job.accepted_future}, return_when=asyncio.FIRST_COMPLETED)
        self.pipeline = None
        if job.accepted_future.done():
            state.jobs.add(job)
            running = asyncio.ensure_future(_finish_job(state, job, request, task))
            state.jobs.running.add(running)
            running.add_done_callback(state.jobs.running.discard)
            self.send_json(
                202, {"job_id": job.id, "request_id": job.request_id, "status": "QUEUED"}
            )
            return
        # Refused or a cache miss: answered exactly as /execute answers it; no job exists.
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


async def _finish_job(state: Any, job: Job, request: Any, task: asyncio.Future) -> None:
    reply = await task
    try:
        if reply.length >= BIG_RESULT_BYTES:
            body = await asyncio.get_running_loop().run_in_executor(
                state.executor, b"".join, reply.chunks
            )
        else:
            body = b"".join(reply.chunks)
    finally:
        reply.close()
    job.finish(request, reply, body)
    state.jobs.finished(job)
    state.reply_sent()


class JobHandler(BaseHandler):
    """Base of the per-job endpoints: the job or a 404 (``not_found`` / ``job_expired``)."""

    def find(self, job_id: str) -> Job | None:
        found = self.state.jobs.lookup(job_id)
        if isinstance(found, Job):
            return found
        message = "job expired" if found == "job_expired" else "job not found"
        self.send_error_json(404, found, message)
        return None


class JobStateHandler(JobHandler):
    """``GET /v1/jobs/{id}`` and ``DELETE /v1/jobs/{id}`` (cancel, idempotent)."""

    ALLOWED = ("GET", "DELETE")

    def get(self, job_id: str) -> None:
        job = self.find(job_id)
        if job is not None:
            self.send_json(200, job.state())

    async def delete(self, job_id: str) -> None:
        job = self.find(job_id)
        if job is None:
            return
        if not job.finished:
            job.cancel()
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

    def get(self, job_id: str) -> None:
        job = self.find(job_id)
        if job is None:
            return
        if job.status == "CANCELLED":
            self.send_error_json(409, "cancelled", "the job was cancelled")
            return
        if job.result is None:
            self.send_error_json(409, "not_finished", "the job has not finished")
            return
        self.set_status(job.result.status)
        for name, value in job.result.headers.items():
            self.set_header(name, value)
        # The stored /execute answer is replayed whole: its header names the request its
        # body names (PROTOCOL §7.2), not this GET.
        self.set_header(REQUEST_ID_HEADER, job.request_id)
        self.finish(job.result.body)


class JobEventsHandler(JobHandler):
    """``GET /v1/jobs/{id}/events``: Server-Sent Events, replayed after ``Last-Event-ID``."""

    def initialize(self, state: Any) -> None:
        super().initialize(state)
        self.wake = asyncio.Event()
        self.closed = False

    async def get(self, job_id: str) -> None:
        job = self.find(job_id)
        if job is None:
            return
        position = _last_event_id(self.request.headers.get("Last-Event-ID"))
        self.set_header("Content-Type", "text/event-stream; charset=utf-8")
        self.set_header("Cache-Control", "no-cache")
        self.set_header("X-Accel-Buffering", "no")
        job.listeners.add(self.wake)
        try:
            try:
                await self.flush()  # headers now: the client knows the stream is open
            except tornado.iostream.StreamClosedError:
                return
            while not self.closed:
                self.wake.clear()
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
        if not self.closed:
            self.finish()

    def on_connection_close(self) -> None:
        self.closed = True
        self.wake.set()
        super().on_connection_close()


def _last_event_id(value: str | None) -> int:
    """Events to skip: the ``Last-Event-ID`` number (0 when absent or not a number)."""
    if value is None:
        return 0
    text = value.strip()
    if not (text.isascii() and text.isdigit()):
        return 0
    return int(text)
