"""The answer side of a forwarded request (ROUTER §8, §8.6): a node's answer on the slot,
checked frame by frame and relayed to the client as it arrives (or collected, when small,
for a handler to rewrite), and the 502 when the slot breaks before its head."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import tornado.httputil
import tornado.iostream
import tornado.web
from tornado.http1connection import HTTP1Connection

from kcoral_server.router.auth import RouterHandler
from kcoral_server.router.forwarding.headers import relayed_response_head
from kcoral_server.router.identity import MAX_FRAME_DATA
from kcoral_server.router.nodes.slot import WORKER, RouterSlot, SlotBroken

TRANSPORT_MESSAGE = (
    "the tunnel to the node failed; the execution outcome is unknown and was not retried"
)
#: the same 502 when the router itself cut the tunnel, stopping (SIGTERM: a restart or an
#: upgrade): "the tunnel failed" sent users to look at a node that had done nothing wrong
STOPPED_TRANSPORT_MESSAGE = (
    "the router is shutting down and closed the tunnel to the node; the execution outcome"
    " is unknown and was not retried"
)
BUFFERED_ANSWER_LIMIT = 1 << 16


class InvalidAnswer(Exception):
    """A node's answer breaks ROUTER §5/§8.6: no valid head first, a frame other than
    ``data`` or ``end`` after it, or a ``data`` frame over 262144 bytes."""


async def answer_data(slot: RouterSlot) -> AsyncIterator[bytes]:
    """The ``data`` of a node's answer after its head, until its ``end``."""
    while True:
        frame = await slot.next_frame()
        kind = frame.WhichOneof("payload")
        if kind == "end":
            return
        data = frame.data  # a protobuf message copies the field on every access
        if kind != "data" or len(data) > MAX_FRAME_DATA:
            raise InvalidAnswer
        yield data


def close_after_unframed_answer(handler: tornado.web.RequestHandler, *, early: bool) -> None:
    """An HTTP/1.0 client gets no chunked framing: a body streamed to it ends only where the
    connection does (RFC 9112 §6.3), so the connection closes after the answer instead of
    being kept alive for a next request that would follow whatever bytes a node sent. An
    answer ``early`` (before the whole body arrived: the node refused it) closes it too,
    since the rest is never read, and says so: a pooled client reused the connection, and
    its next request met the close (``Remote end closed connection without response``)."""
    request = handler.request
    connection = request.connection
    if request.version != "HTTP/1.1" and isinstance(connection, HTTP1Connection):
        connection._disconnect_on_finish = True
    if early:
        handler.set_header("Connection", "close")


class AnswerRelay(RouterHandler):
    """Relay the answer on ``self.slot`` to the client; what ``ForwardHandler`` (the
    request side) builds on. ``SLOT_KIND`` says which slot it is: a worker slot's 503 marks
    its node saturated."""

    SLOT_KIND = WORKER

    def initialize(self, state: Any) -> None:
        super().initialize(state)
        self.slot: Any = None
        self.body_done = False  # the request's body went whole to the node
        self.forwarding = False  # the request goes on to the node
        self.response_started = False
        self.counted = False  # counted in ``state.in_progress``

    # -- what subclasses choose ------------------------------------------------------------

    def buffer_answer(self, status: int) -> bool:
        """Collect a (small) answer with this status and pass it through ``rewrite``."""
        return False

    def rewrite(self, status: int, body: bytes) -> bytes:
        return body

    # -- relaying ---------------------------------------------------------------------------

    async def relay_answer(self) -> None:
        slot = self.slot
        try:
            status, headers = relayed_response_head(await slot.next_frame())
            if status is None:
                raise InvalidAnswer
            if status == 503 and self.SLOT_KIND == WORKER:
                self.state.registry.mark_saturated(self.node)
            self.clear()
            self.clear_header("Content-Type")
            self.clear_header("Date")
            self.clear_header("Server")
            self.set_status(status)
            for name, value in headers:
                self.add_header(name, value)
            assert self.node is not None  # chosen with the slot
            self.set_header("X-KCoral-Node", self.node)
            self.set_header("X-Request-ID", self.request_id)
            close_after_unframed_answer(self, early=not self.body_done)
            buffered: list[bytes] | None = [] if self.buffer_answer(status) else None
            if buffered is None:
                self.response_started = True
                await self.flush()
            async for data in answer_data(slot):
                self.response_bytes += len(data)
                if buffered is not None and self.response_bytes <= BUFFERED_ANSWER_LIMIT:
                    buffered.append(data)
                    continue
                if buffered is not None:  # larger than expected: stream it as it is
                    self.response_started = True
                    self.write(b"".join(buffered))
                    buffered = None
                self.write(data)
                await self.flush()
            if buffered is not None:
                answer = self.rewrite(status, b"".join(buffered))
                self.response_started = True
                self.write(answer)
        except SlotBroken as exc:
            if self._finished:
                return
            self.finish_reason = self.finish_reason or (
                "invalid_response" if exc.reason == "invalid_response" else "tunnel_disconnected"
            )
            if self.response_started:
                self.abort_connection()
            else:
                await self.slot_broke()
            return
        except tornado.iostream.StreamClosedError:
            self.on_connection_close()
            return
        except InvalidAnswer:
            self.refuse_invalid_answer()
            return
        except Exception as exc:
            # The router's own reading of what a node (a node-token holder) sent failed:
            # the answer is refused as invalid and the slot discarded, never left leased
            # (it would be lost to every later request) and never a 500 page.
            event = {"request_id": self.request_id, "node": self.node, "error": repr(exc)}
            self.state.log.event("relay_failed", "ERROR", **event)
            self.refuse_invalid_answer()
            return
        if self.body_done:
            self.state.registry.release(slot)
        else:
            # The node answered before the whole body arrived (early rejection).
            self.forwarding = False
            slot.cancel("request_rejected")
        self.finish_reason = self.finish_reason or "completed"
        self.slot_done()
        if not self._finished:
            self.finish()

    async def slot_broke(self) -> None:
        """The slot broke before the answer's head: ``502`` (ROUTER §8)."""
        stopped = self.state.admission.closed  # closed only by the router's stop
        message = STOPPED_TRANSPORT_MESSAGE if stopped else TRANSPORT_MESSAGE
        self.send_router_error(502, "server_transport", message, str(self.finish_reason))

    def refuse_invalid_answer(self) -> None:
        self.finish_reason = "invalid_response"
        self.slot.cancel("invalid_response")
        self.forwarding = False
        self.slot_done()
        if self.response_started:
            self.abort_connection()
        else:
            self.send_router_error(502, "server_transport", TRANSPORT_MESSAGE, "invalid_response")

    def abort_connection(self) -> None:
        self.slot_done()
        connection = self.request.connection
        stream = connection.stream if isinstance(connection, HTTP1Connection) else None
        if stream is not None:
            stream.close()

    def slot_done(self) -> None:
        if self.counted:
            self.counted = False
            self.state.in_progress -= 1
