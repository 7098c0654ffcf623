"""Streaming one client request through a slot and its answer back (ROUTER.md §8).

``ForwardHandler`` is ``POST /execute`` of ROUTER.md §8, generalised: subclasses pick the
slot kind (worker or control), the node (scheduler choice or a job's node) and may look at a
small answer (a job's 202) before it goes out. Requests other than ``POST /execute`` carry
their method and path as the pseudo-headers ``:method`` and ``:path`` in
``RequestHead.headers`` (docs/scaling.md); an ``/execute`` head is exactly as before.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import tornado.iostream
import tornado.web
from tornado.http1connection import HTTP1Connection

from kcoral_server.front_door.callers import IDENTITY_HEADER, Identity
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.router.auth import RouterHandler
from kcoral_server.router.body_failure import report_body_failures
from kcoral_server.router.frames import encode_data
from kcoral_server.router.identity import MAX_FRAME_DATA, is_valid_node_id
from kcoral_server.router.scheduler import NoNode, RouterBusy
from kcoral_server.router.slot import CONTROL, WORKER, SlotBroken

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# The client's credentials and browser headers stay at the router (a node, rogue or not,
# never sees a client token); the identity the router checked travels instead, in
# X-KCoral-Identity, which the node believes only from its tunnel (ROUTER §3, §8.4).
CLIENT_ONLY = frozenset({"authorization", "cookie", "origin", IDENTITY_HEADER.lower()})
NOT_FORWARDED = (
    HOP_BY_HOP | CLIENT_ONLY | {"host", "expect", "x-kcoral-node", "x-request-id", "content-length"}
)
#: The only headers of a node's answer the router passes on (ROUTER §8.6): the ones our
#: server sends that mean something to a client. A node is a process that holds the node
#: token, not a party the router's clients trust: anything else it adds (``Set-Cookie``,
#: ``Access-Control-Allow-Origin: *``, ``Location``, ...) would speak in the router's name
#: to the client and to a browser, so it is dropped. Extending this list is a deliberate
#: act; ``tests/security/test_router_attack_node_headers.py`` checks it against every header
#: our server sends.
RELAYED_RESPONSE_HEADERS = frozenset(
    {
        "content-type",
        "allow",  # 405 (PROTOCOL §2)
        "retry-after",  # 503 busy
        "cache-control",  # job events (Server-Sent Events)
        "x-accel-buffering",  # job events: proxies must not buffer the stream
    }
)
#: Headers our server sends that the router does not relay on purpose: it frames the body
#: itself (``content-length``, hop-by-hop), names itself (``server``, ``date``) and sets its
#: own ``x-request-id`` and ``x-kcoral-node``.
DROPPED_RESPONSE_HEADERS = HOP_BY_HOP | {
    "content-length",
    "server",
    "date",
    "x-request-id",
    "x-kcoral-node",
}
BODY_FAILED_MESSAGE = "client request body failed while streaming"
TRANSPORT_MESSAGE = (
    "the tunnel to the node failed; the execution outcome is unknown and was not retried"
)
METHOD_HEADER, PATH_HEADER = b":method", b":path"
BUFFERED_ANSWER_LIMIT = 1 << 16


def identity_header(identity: Identity) -> pb.HttpHeader:
    """``x-kcoral-identity`` naming who the router authenticated (``default`` when open)."""
    return pb.HttpHeader(
        name=IDENTITY_HEADER.lower().encode(), value=identity.header_value().encode()
    )


def connection_named(headers: Any) -> set[str]:
    names: set[str] = set()
    for value in headers.get_list("Connection"):
        names.update(part.strip().lower() for part in value.split(",") if part.strip())
    return names


@tornado.web.stream_request_body
class ForwardHandler(RouterHandler):
    """Forward the request on a slot of ``SLOT_KIND``; relay the answer as it arrives."""

    SLOT_KIND = WORKER
    ALLOWED: tuple[str, ...] = ("POST",)

    def initialize(self, state: Any) -> None:
        super().initialize(state)
        self.queue_wait_ms = 0.0
        self.node: str | None = None
        self.slot: Any = None
        self.declared: int | None = None
        self.request_bytes = 0
        self.response_bytes = 0
        self.body_done = False
        self.forwarding = False
        self.response_started = False
        self.relay_task: asyncio.Task[None] | None = None
        self.acquire_task: asyncio.Task[Any] | None = None
        self.counted = False

    # -- what subclasses choose ------------------------------------------------------------

    async def choose_node(self) -> str | None:
        """Control slots only: the node that must answer (None = any ready node).

        May answer the request itself (then ``self._finished`` is set)."""
        return None

    def buffer_answer(self, status: int) -> bool:
        """Collect a (small) answer with this status and pass it through ``rewrite``."""
        return False

    def rewrite(self, status: int, body: bytes) -> bytes:
        return body

    def no_node(self) -> None:
        """No slot came within the wait (or the required node went away)."""
        self.send_router_error(
            503, "no_node", "no compatible node has an available slot", "queue_timeout"
        )

    # -- request side ----------------------------------------------------------------------

    async def prepare(self) -> None:
        if not self.check_request():
            return
        lengths = self.request.headers.get_list("Content-Length")
        if lengths:
            values = {v.strip() for v in ",".join(lengths).split(",")}
            if len(values) != 1 or not next(iter(values)).isdigit():
                self.send_router_error(
                    400, "invalid_request", "invalid Content-Length", "request_rejected"
                )
                return
            self.declared = int(next(iter(values)))
            if self.declared > self.state.settings.max_request_bytes:
                self.send_router_error(
                    413, "request_too_large", "request body is too large", "request_rejected"
                )
                return
        elif self.request.method != "POST" and "Transfer-Encoding" not in self.request.headers:
            self.declared = 0  # a bodiless GET or DELETE
        else:
            report_body_failures(self.request.connection, self._body_failed)
        loop = asyncio.get_running_loop()
        if self.SLOT_KIND == CONTROL:
            required = await self.choose_node()
            if self._finished:
                return
            acquire = self.state.control.acquire(required, self.request_id)
        else:
            affinity = None
            preferred = self.request.headers.get_list("X-KCoral-Node")
            if len(preferred) == 1 and is_valid_node_id(preferred[0]):
                affinity = preferred[0]
            acquire = self.state.admission.acquire(affinity, self.request_id)
        self.acquire_task = loop.create_task(acquire)
        try:
            node, slot = await self.acquire_task
        except RouterBusy:
            self.send_router_error(503, "router_busy", "router queue is full", "queue_full")
            return
        except NoNode:
            self.no_node()
            return
        except asyncio.CancelledError:
            return  # the client went away while queued
        finally:
            self.queue_wait_ms = (time.monotonic() - self.received_at) * 1000
        self.node, self.slot = node.node_id, slot
        if self.SLOT_KIND == WORKER:
            self.state.in_progress += 1
            self.counted = True
        self.forwarding = True
        head = pb.RequestHead(headers=self._forwarded_headers())
        if self.declared is not None:
            head.content_length = self.declared
        self.relay_task = loop.create_task(self._relay_response())
        await self._send(pb.SlotFrame(request_id=self.request_id, request_head=head))
        if self.declared == 0 and self.request.method != "POST":
            await self._finish_body()  # nothing will arrive: end the request body now

    def _forwarded_headers(self) -> list[pb.HttpHeader]:
        dropped = NOT_FORWARDED | connection_named(self.request.headers)
        headers = []
        if self.request.path != "/execute" or self.request.method != "POST":
            headers.append(pb.HttpHeader(name=METHOD_HEADER, value=self.request.method.encode()))
            headers.append(pb.HttpHeader(name=PATH_HEADER, value=self.request.uri.encode()))
        # Lowercase names, as HTTP/2 requires (RFC 9113 §8.2.1, ROUTER §8.4): a node may read
        # them as an ASGI server does and would not see `Content-Type` at all.
        headers.extend(
            pb.HttpHeader(name=name.lower().encode("latin-1"), value=value.encode("latin-1"))
            for name, value in self.request.headers.get_all()
            if name.lower() not in dropped
        )
        headers.append(identity_header(self.identity))
        headers.append(pb.HttpHeader(name=b"x-request-id", value=self.request_id.encode()))
        if self.declared is not None:
            headers.append(pb.HttpHeader(name=b"content-length", value=str(self.declared).encode()))
        return headers

    async def _send(self, frame: pb.SlotFrame | bytes) -> None:
        try:
            await self.slot.send(frame)
        except SlotBroken:
            self.forwarding = False  # the relay task reports the failure

    async def data_received(self, chunk: bytes) -> None:
        if not self.forwarding:
            return
        self.request_bytes += len(chunk)
        limit = self.state.settings.max_request_bytes
        if self.request_bytes > limit:
            self._reject_body(413, "request_too_large", "request body is too large")
            return
        if self.declared is not None and self.request_bytes > self.declared:
            self._reject_body(400, "invalid_request", "Content-Length does not match request body")
            return
        # Tornado reads at most MAX_FRAME_DATA per chunk (``chunk_size``), so the chunk
        # usually is the frame; frames are encoded at the wire level (``frames.py``).
        if len(chunk) <= MAX_FRAME_DATA:
            await self._send(encode_data(self.request_id, chunk))
            return
        view = memoryview(chunk)
        for start in range(0, len(view), MAX_FRAME_DATA):
            await self._send(encode_data(self.request_id, view[start : start + MAX_FRAME_DATA]))
            if not self.forwarding:
                return

    async def _finish_body(self) -> None:
        if self.body_done or not self.forwarding:
            return
        if self.declared is not None and self.request_bytes != self.declared:
            self._reject_body(400, "invalid_request", "Content-Length does not match request body")
            return
        # Set first: the node may answer completely before this write returns.
        self.body_done = True
        await self._send(pb.SlotFrame(request_id=self.request_id, end=pb.EndOfBody()))

    async def _complete(self) -> None:
        await self._finish_body()
        if self.relay_task is not None:
            await asyncio.shield(self.relay_task)

    async def post(self, *args: str) -> None:
        await self._complete()

    async def get(self, *args: str) -> None:
        await self._complete()

    async def delete(self, *args: str) -> None:
        await self._complete()

    async def _body_failed(self, reason: str) -> None:
        """The client's chunked body broke mid-stream (ROUTER §8.5): 400, slot cancelled."""
        if not self._finished:
            self._reject_body(400, "invalid_request", BODY_FAILED_MESSAGE)

    def _reject_body(self, status: int, kind: str, message: str) -> None:
        self.forwarding = False
        if self.slot is not None:
            self.slot.cancel("request_rejected")
        if not self.response_started:
            if self.relay_task is not None:
                self.relay_task.cancel()
            self.send_router_error(status, kind, message, "request_rejected")
        else:
            self.finish_reason = "request_rejected"
            self._abort_connection()

    # -- response side ---------------------------------------------------------------------

    async def _relay_response(self) -> None:
        slot = self.slot
        try:
            head = await slot.next_frame()
            status, headers = self._check_head(head)
            if status is None:
                self._invalid_response()
                return
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
            buffered: list[bytes] | None = [] if self.buffer_answer(status) else None
            if buffered is None:
                self.response_started = True
                await self.flush()
            while True:
                frame = await slot.next_frame()
                kind = frame.WhichOneof("payload")
                if kind == "end":
                    break
                if kind != "data":
                    self._invalid_response()
                    return
                data = frame.data  # a protobuf message copies the field on every access
                if len(data) > MAX_FRAME_DATA:
                    self._invalid_response()
                    return
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
                self.response_started = True
                self.write(self.rewrite(status, b"".join(buffered)))
        except SlotBroken as exc:
            if self._finished:
                return
            self.finish_reason = self.finish_reason or (
                "invalid_response" if exc.reason == "invalid_response" else "tunnel_disconnected"
            )
            if self.response_started:
                self._abort_connection()
            else:
                self.send_router_error(
                    502, "server_transport", TRANSPORT_MESSAGE, self.finish_reason
                )
            return
        except tornado.iostream.StreamClosedError:
            self.on_connection_close()
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

    def _check_head(self, frame: pb.SlotFrame) -> tuple[int | None, list[tuple[str, str]]]:
        if frame.WhichOneof("payload") != "response_head":
            return None, []
        status = frame.response_head.status
        if not 200 <= status <= 599:
            return None, []
        headers = []
        try:
            for header in frame.response_head.headers:
                name = header.name.decode("ascii")
                value = header.value.decode("latin-1")
                if (
                    not name
                    or any(c in name for c in " :\r\n\0")
                    or any(c in value for c in "\r\n\0")
                ):
                    return None, []
                if name.lower() in RELAYED_RESPONSE_HEADERS:
                    headers.append((name, value))
        except UnicodeDecodeError:
            return None, []
        return status, headers

    def _invalid_response(self) -> None:
        self.finish_reason = "invalid_response"
        self.slot.cancel("invalid_response")
        self.forwarding = False
        self.slot_done()
        if self.response_started:
            self._abort_connection()
        else:
            self.send_router_error(502, "server_transport", TRANSPORT_MESSAGE, "invalid_response")

    def _abort_connection(self) -> None:
        self.slot_done()
        connection = self.request.connection
        stream = connection.stream if isinstance(connection, HTTP1Connection) else None
        if stream is not None:
            stream.close()

    def slot_done(self) -> None:
        if self.counted:
            self.counted = False
            self.state.in_progress -= 1

    def on_connection_close(self) -> None:
        if self.acquire_task is not None and not self.acquire_task.done():
            self.acquire_task.cancel()
        if self.slot is not None and self.slot.request_id == self.request_id:
            self.slot.cancel("client_disconnected")
        self.forwarding = False
        self.finish_reason = self.finish_reason or "client_disconnected"
        self.slot_done()
        if self.relay_task is not None and not self.relay_task.done():
            self.relay_task.cancel()
        self.log_finished()

    def on_finish(self) -> None:
        self.slot_done()
        self.log_finished()
