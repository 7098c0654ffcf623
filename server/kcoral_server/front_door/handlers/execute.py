"""``POST /execute``: the streamed body, the early refusals, then the pipeline.

Refusals before the body is read, in this order: 403 (a web page), 401 (auth), 413
(declared length), the ``X-KCoral-Serialization`` 400, the ``X-KCoral-Select`` 400 or 503
(a selector this server does not fit, EXTENSIONS §14), the in-flight-bytes / shutting-down
503 (EXTENSIONS §6).
Tornado closes the connection after answering a request whose body it did not read, so
those answers say ``Connection: close`` (a pooled client must not reuse the connection).
A refused request whose declared body is small (``DRAIN_BEFORE_REFUSING``) is answered once
that body has arrived and been read away instead: closing a socket with unread bytes makes
the kernel reset the connection, and a reset can destroy the answer before the client reads
it (a routed session's ``410`` once reached its client as a broken response). That answer
keeps the connection open; a small body that does not arrive within
``--body-timeout-seconds`` gets the refusal then, with ``Connection: close``.
A client that disconnects before its answer is written cancels its program (EXTENSIONS §9).

Bodies are bounded against a token holder (or any local program on a token-less loopback
server) that opens slow uploads: in-flight bytes are charged as they arrive, never as
declared, so a connection holds at most what it sent (and never more than
``--max-request-bytes``); a body that stops, or trickles below ``MIN_BODY_RATE``, is
dropped after ``--body-timeout-seconds``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, cast

import tornado.iostream
import tornado.web
from tornado.http1connection import HTTP1Connection  # what Tornado's HTTPServer hands us

from kcoral.protocol.errors import ValidationError
from kcoral.protocol.headers import SERIALIZATION_HEADER
from kcoral.protocol.selector import SELECT_HEADER
from kcoral_server.execution.control import CANCEL_MESSAGES, CANCELLED_STATUS, RequestObserver
from kcoral_server.execution.pipeline import FINISH_LEVELS, ExecuteRequest
from kcoral_server.execution.responses import Refusal, Reply, saturated
from kcoral_server.execution.serialization import check_serialization
from kcoral_server.front_door.body import BodyTooLarge, RequestBody
from kcoral_server.front_door.handler_defaults import (
    TOO_LARGE_MESSAGE,
    declared_length,
    over_limit,
)
from kcoral_server.front_door.handlers.base import BaseHandler
from kcoral_server.front_door.handlers.large_reads import LARGE_BODY_CHUNK, LargeReads
from kcoral_server.front_door.node_fit import logged, selector_refusal

if TYPE_CHECKING:
    from kcoral_server.front_door.app import ServerState


def too_large(limit: int, declared: int | None = None) -> Refusal:
    """413 ``request_too_large``: PROTOCOL §7.1's fixed text, then the sizes and the flag
    that moves the limit (EXTENSIONS §10); ``declared`` None: a chunked body that passed it."""
    size = over_limit(limit, declared)
    message = f"{TOO_LARGE_MESSAGE}: {size} (max_request_bytes; kcoral server --max-request-bytes)"
    return Refusal(413, "request_too_large", message, "rejected")


# Tornado must never cut a body off before we do (we answer 413 ourselves).
_UNLIMITED = 1 << 62
# Slowest average a body may arrive at once ``--body-timeout-seconds`` have passed since it
# started: far below any real link, far above a trickle that only keeps a connection open.
MIN_BODY_RATE = 1024
#: Bodies up to this declared length are read (and dropped) before a refusal is answered.
DRAIN_BEFORE_REFUSING = 64 * 1024
#: how a request whose client went away before its body had arrived is logged
GONE_DURING_BODY = Refusal(
    CANCELLED_STATUS, "cancelled", CANCEL_MESSAGES["client_disconnected"], "client_disconnected"
)


@tornado.web.stream_request_body
class ExecuteHandler(BaseHandler):
    ALLOWED: tuple[str, ...] = ("POST",)
    MAX_BODY = None  # streamed into a memfd, with limits of its own (the module's docstring)

    def initialize(self, state: ServerState) -> None:
        super().initialize(state)
        self.body: RequestBody | None = None
        self.serialization: str | None = None
        self.inflight = 0
        self.body_unread = True  # until post(): an answer now leaves the body unread
        self.pipeline: ExecuteRequest | None = None  # while the program may still run
        self.max_inflight = 0  # --max-inflight-request-bytes, resolved (0: no limit)
        # the rate window: since when, and the body's size then (``_watch_idle_body``)
        self.last_data_at, self.window_at, self.window_size = 0.0, 0.0, 0
        self.idle_timer: asyncio.TimerHandle | None = None
        self.large_reads: LargeReads | None = None  # while a large body is read
        # A refusal that waits for its small body to arrive (``refuse``), and its deadline.
        self.pending_refusal: Refusal | None = None
        self.drain_timer: asyncio.TimerHandle | None = None

    def prepare(self) -> None:
        super().prepare()
        if self._finished:
            if self.early_refusal is not None:  # 403 (a web page) or 401
                self._log_refusal(self.early_refusal)
            return
        state = self.state
        config = state.config
        declared = declared_length(self.request.headers.get("Content-Length"))
        state.events.emit(
            "request_received",
            request_id=self.request_id,
            client=self.request.remote_ip,
            content_length=declared,
        )
        cast(HTTP1Connection, self.request.connection).set_max_body_size(_UNLIMITED)
        limit = config.max_request_bytes
        if declared is not None and declared > limit:
            self.refuse(too_large(limit, declared))
            return
        try:
            self.serialization = check_serialization(
                self.request.headers.get_list(SERIALIZATION_HEADER), config.allowed_serialization
            )
        except ValidationError as exc:
            self.refuse(Refusal(400, "parse", str(exc), "rejected"))
            return
        unfit = self.selector_unfit()
        if unfit is not None:
            self.refuse(unfit)
            return
        refusing = state.refusing()
        if refusing is not None:
            self.refuse(saturated(refusing))
            return
        refusal = self.admission_refusal()
        if refusal is not None:
            self.refuse(refusal)
            return
        # In-flight bytes are what bodies actually hold, never what they declared: a
        # declaration reserves nothing, so connections that declare the maximum and then
        # trickle cannot lock every other client out (EXTENSIONS §6). The declared length
        # only decides here whether it could fit in what the others really hold now.
        # resolved by ServerConfig (None -> 2 x --max-request-bytes); 0 means no limit
        self.max_inflight = config.max_inflight_request_bytes or 0
        why = self._inflight_refusal(declared or 0)
        if why is not None:
            self.refuse(saturated(why))
            return
        self.body = RequestBody(limit, declared)
        if declared is not None and declared >= LARGE_BODY_CHUNK:
            # bodies from this size on are received in rounds of this size
            self.large_reads = LargeReads(self.request.connection)
            self.large_reads.start()
        self.last_data_at = self.window_at = asyncio.get_running_loop().time()
        self._watch_idle_body()

    def admission_refusal(self) -> Refusal | None:
        """What this kind of request adds to the 503s before its body is read (None:
        none); ``POST /v1/jobs`` takes one of the job slots here."""
        return None

    def selector_unfit(self) -> Refusal | None:
        """Why this server does not take the request's ``X-KCoral-Select`` (EXTENSIONS
        §14), or None."""
        return selector_refusal(self.state, self.request.headers.get_list(SELECT_HEADER))

    def _inflight_refusal(self, more: int) -> str | None:
        """Why ``more`` bytes pass the in-flight bound or this identity's share (None: fit)."""
        identities = self.state.authenticator.identity_count  # read now: tokens may reload
        owner = self.identity.name
        return self.state.inflight.refusal(
            owner, self.inflight, more, self.max_inflight, identities
        )

    def data_received(self, chunk: bytes) -> None:
        if self._finished or self.body is None:
            return
        self.last_data_at = asyncio.get_running_loop().time()
        why = self._inflight_refusal(len(chunk))
        if why is not None:
            # Bodies admitted together outgrew the limit: this one stops here, before its
            # body is parsed (a 503 the client may retry), instead of growing memory.
            self.body.close()
            self.body = None
            self.refuse(saturated(why))
            return
        # Charged as the bytes arrive; released when the request ends (on_finish).
        self.inflight += len(chunk)
        self.state.inflight.charge(self.identity.name, len(chunk))
        try:
            self.body.write(chunk)
        except BodyTooLarge:
            self.body.close()
            self.body = None
            self.refuse(too_large(self.state.config.max_request_bytes))

    def send_error_json(self, status: int, kind: str, message: str) -> None:
        if self.body_unread:
            self.set_header("Connection", "close")
        super().send_error_json(status, kind, message)

    def _restore_read_chunk(self) -> None:
        if self.large_reads is not None:
            self.large_reads.restore()
            self.large_reads = None

    def new_request(self, observer: RequestObserver | None = None) -> ExecuteRequest:
        """The pipeline request for the received body (taken from the handler)."""
        self._restore_read_chunk()
        body, self.body = self.body, None
        assert body is not None
        self.body_unread = False
        return ExecuteRequest(
            self.state,
            request_id=self.request_id,
            headers=self.request.headers,
            body=body,
            serialization=self.serialization,
            observer=observer,
            identity=self.identity,
        )

    async def post(self) -> None:
        if self.answer_pending_refusal() or self._finished or self.body is None:
            return
        request = self.new_request()
        self.pipeline = request
        self.state.open_requests += 1
        try:
            reply = await request.run()
            self.pipeline = None
            try:
                await self.send_reply(reply)
            finally:
                reply.close()
        finally:
            self.pipeline = None
            self.state.open_requests -= 1
            self.state.reply_sent()

    async def send_reply(self, reply: Reply) -> None:
        self.set_status(reply.status)
        for name, value in reply.headers.items():
            self.set_header(name, value)
        if len(reply.chunks) == 1 and isinstance(reply.chunks[0], bytes):
            self.finish(reply.chunks[0])
            return
        self.set_header("Content-Length", str(reply.length))
        try:
            await self.flush()  # headers only
            connection = cast(HTTP1Connection, self.request.connection)
            for chunk in reply.chunks:
                # memoryviews go out without a copy (Tornado takes any buffer, annotated bytes)
                await connection.write(chunk)  # type: ignore[arg-type]
            self.finish()
        except tornado.iostream.StreamClosedError:
            pass  # the client went away; nothing left to tell it

    @property
    def refused(self) -> bool:
        """Answered already, or a refusal waits for the body to arrive."""
        return self._finished or self.pending_refusal is not None

    def refuse(self, refusal: Refusal) -> None:
        """Refuse the request and log its end: at once, or (a small body not read yet) once
        the body has arrived, read away (see the module's docstring)."""
        if self.refused:
            return
        declared = declared_length(self.request.headers.get("Content-Length"))
        if self.body_unread and declared is not None and 0 < declared <= DRAIN_BEFORE_REFUSING:
            self.pending_refusal = refusal
            if self.body is not None:  # what arrives from now on is dropped unread
                self.body.close()
                self.body = None
            timeout = float(self.state.config.body_timeout_seconds)
            loop = asyncio.get_running_loop()
            self.drain_timer = loop.call_later(timeout, self._refuse_pending)
            return
        self._answer_refusal(refusal)

    def answer_pending_refusal(self) -> bool:
        """The whole body has arrived: send the refusal waiting for it (the connection stays
        open). True when the request was refused."""
        if self.pending_refusal is None:
            return False
        self.body_unread = False
        self._refuse_pending()
        return True

    def _refuse_pending(self) -> None:
        """Send the waiting refusal: its body has arrived, or its deadline has passed."""
        refusal, self.pending_refusal = self.pending_refusal, None
        if self.drain_timer is not None:
            self.drain_timer.cancel()
            self.drain_timer = None
        if refusal is not None and not self._finished:
            self._answer_refusal(refusal)

    def _answer_refusal(self, refusal: Refusal) -> None:
        self.send_error_json(refusal.status, refusal.kind, refusal.message)
        self._log_refusal(refusal)

    def _log_refusal(self, refusal: Refusal) -> None:
        refusal = logged(refusal)
        self.state.events.emit(
            "request_finished",
            FINISH_LEVELS.get(refusal.reason, "WARNING"),
            request_id=self.request_id,
            http_status=refusal.status,
            finish_reason=refusal.reason,
            error_kind=refusal.kind,
            error_message=refusal.message,
        )

    def _watch_idle_body(self) -> None:
        """Drop a body that stops arriving, or that brings under ``MIN_BODY_RATE`` on average
        over any ``--body-timeout-seconds`` window (slowloris: a byte every 8 s never trips
        the idle timeout; and with the whole body's average, 255 MiB sent fast, then a byte
        every 50 s, held its bytes for 3 days: team soak)."""
        loop = asyncio.get_running_loop()
        timeout = self.state.config.body_timeout_seconds
        self.idle_timer = None
        if self.body is None or self._finished or not self.body_unread:
            return
        now = loop.time()
        idle = now - self.last_data_at
        elapsed = now - self.window_at
        too_slow = (
            elapsed >= timeout and self.body.size - self.window_size < MIN_BODY_RATE * elapsed
        )
        if elapsed >= timeout and not too_slow:  # this window kept the rate: the next starts
            self.window_at, self.window_size = now, self.body.size
        if idle < timeout and not too_slow:
            self.idle_timer = loop.call_later(timeout - idle, self._watch_idle_body)
            return
        if too_slow and idle < timeout:
            message = (
                f"request body arrived slower than {MIN_BODY_RATE} bytes/s on average "
                f"over {elapsed:.0f} s; connection closed"
            )
        else:
            message = f"request body sent nothing for {timeout:g} s; connection closed"
        self._log_refusal(Refusal(408, "body_timeout", message, "rejected"))
        self._release()
        cast(HTTP1Connection, self.request.connection).stream.close()

    def on_finish(self) -> None:
        self._release()

    def on_connection_close(self) -> None:
        if self.pipeline is not None:
            self.pipeline.cancel("client_disconnected")
        elif (
            self.body_unread
            and not self._finished
            and (self.body is not None or self.pending_refusal is not None)
        ):
            # Gone while its body arrived (or before the refusal waiting for it went out):
            # its ``request_received`` gets its end like any other request (SERVER §13),
            # where the log used to show it received and never finished.
            self._log_refusal(GONE_DURING_BODY)
        self._release()
        super().on_connection_close()

    def _release(self) -> None:
        self._restore_read_chunk()
        self.pending_refusal = None
        if self.drain_timer is not None:
            self.drain_timer.cancel()
            self.drain_timer = None
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        if self.inflight:
            self.state.inflight.release(self.identity.name, self.inflight)
            self.inflight = 0
        if self.body is not None:
            self.body.close()
            self.body = None
