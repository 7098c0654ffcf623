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
from collections.abc import Awaitable
from typing import Any, TypeVar

import tornado.httputil
import tornado.iostream
import tornado.web

from kcoral.protocol.selector import NO_MATCHING_NODE
from kcoral_server.front_door.handler_defaults import over_limit
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.router.admission.scheduler import (
    NodeGone,
    NoMatchingNode,
    NoNode,
    RouterBusy,
    RouterStopping,
)
from kcoral_server.router.admission.selection import MORE, PROGRAM_PEEK_LIMIT, program_gpu_count
from kcoral_server.router.forwarding.answer import AnswerRelay
from kcoral_server.router.forwarding.client_connection import notice_hang_up, report_body_failures
from kcoral_server.router.forwarding.headers import forwarded_headers
from kcoral_server.router.identity import MAX_FRAME_DATA, is_valid_node_id
from kcoral_server.router.nodes.frames import encode_data
from kcoral_server.router.nodes.slot import CONTROL, WORKER, SlotBroken

T = TypeVar("T")
BODY_FAILED_MESSAGE = "client request body failed while streaming"


async def relay_ended(relay: asyncio.Task[None]) -> None:
    """Wait for a request's relay. One cancelled because the client left or its body was
    refused is logged already (``request_finished``): raising its ``CancelledError`` would
    only add an "Uncaught exception" traceback to the log for an ordinary hang-up (every
    routed ``job.result()`` used to end its event stream so). The waiting handler's own
    cancellation (the router stopping) still propagates."""
    try:
        await asyncio.shield(relay)
    except asyncio.CancelledError:
        if not relay.cancelled():
            raise


def too_large_message(limit: int, declared: int | None) -> str:
    """ROUTER §8's 413 text, then the sizes and the flag that moves the limit (as a server's
    413 does, EXTENSIONS §10); ``declared`` None: a chunked body that passed the limit."""
    size = over_limit(limit, declared)
    return f"request body is too large: {size} (kcoral router --max-request-bytes)"


#: the 503 ``no_node`` messages: no slot within the wait; the router stops (ROUTER §7.3)
NO_SLOT = "no compatible node has an available slot"
STOPPING = "the router is shutting down"
NO_READY_NODE = "no node is ready (the router's /health says when one is, its log why not)"


def no_node_answer(cause: NoNode | None, none_ready: bool = False) -> tuple[str, str, str]:
    """The kind, message and ``finish_reason`` of a 503 for a request no slot was found
    for: no slot came within the wait (``none_ready``: a control request, while no node is
    ready); the one node the request must reach (its job's) is not connected (ROUTER §13);
    the router stops, and no request waits any more (§7.3); every node the request's
    selector fits has left (``no_matching_node``, §7)."""
    if none_ready and (cause is None or type(cause) is NoNode):  # the wait ended
        return "no_node", NO_READY_NODE, "queue_timeout"
    if isinstance(cause, NoMatchingNode):
        return NO_MATCHING_NODE, str(cause), "request_rejected"
    if isinstance(cause, RouterStopping):
        return "no_node", STOPPING, "shutting_down"
    if isinstance(cause, NodeGone):
        gone = f"node {cause.node_id}, which holds it, is not connected to the router"
        return "no_node", gone, "node_gone"
    return "no_node", NO_SLOT, "queue_timeout"


def control_wait(handler: Any, required: str | None) -> float | None:
    """How long a control request may wait for a slot: one any node may answer waits at
    most its handler's ``wait_without_a_ready_node`` while no node is ready (`curl
    /v1/info` of a router whose nodes never came up waited 30 minutes, saying nothing);
    otherwise (None) the whole --queue-wait-timeout-seconds."""
    if required is not None or handler.state.registry.any_ready_with_slots():
        return None
    wait: float | None = getattr(handler, "wait_without_a_ready_node", None)
    return wait


async def timed_wait(handler: Any, acquire: Awaitable[T]) -> T:
    """``acquire``, noting in ``handler.queue_wait_ms`` how long the request waited for it
    before any answer is written: a refusal after the wait (503 ``no_node`` after the queue
    wait) is logged as it is sent. A line written while it still waits (its client left)
    takes the wait so far (``waiting_for_node``): it said ``queue_wait_ms=0.0``."""
    handler.waiting_for_node = True
    try:
        return await acquire
    finally:
        handler.waiting_for_node = False
        handler.queue_wait_ms = (time.monotonic() - handler.received_at) * 1000


@tornado.web.stream_request_body
class ForwardHandler(AnswerRelay):
    """Forward the request on a slot of ``SLOT_KIND`` as it arrives (choosing the node and the
    slot first); ``AnswerRelay`` relays the answer."""

    ALLOWED: tuple[str, ...] = ("POST",)
    #: held as long as any client-token holder likes (a stream, a session's program, a result
    #: read slowly): never takes a node's last free control slot (docs/scaling.md)
    holds_slot_long = False

    def initialize(self, state: Any) -> None:
        super().initialize(state)
        self.declared: int | None = None
        self.relay_task: asyncio.Task[None] | None = None
        self.acquire_task: asyncio.Task[Any] | None = None
        self.hung_up = False  # ``client_hung_up``

    # -- what subclasses choose ------------------------------------------------------------

    async def choose_node(self) -> str | None:
        """Control slots only: the node that must answer (None = any ready node); may
        answer the request itself (then ``self._finished`` is set)."""
        return None

    def no_node(self, cause: NoNode | None = None) -> None:
        """No slot for this request: 503 ``no_node`` (or ``no_matching_node``), saying why
        (``no_node_answer``)."""
        none_ready = self.SLOT_KIND == CONTROL and not self.state.registry.any_ready_with_slots()
        self.send_router_error(503, *no_node_answer(cause, none_ready))

    # -- request side ----------------------------------------------------------------------

    async def prepare(self) -> None:
        if self.check_request() and check_length(self):
            await self.forward_head()

    async def forward_head(self, gpu_count: int | None = None) -> None:
        """Choose the node and a slot (``gpu_count``: ROUTER §7), then send the head there."""
        loop = asyncio.get_running_loop()
        if self.SLOT_KIND == CONTROL:
            required = await self.choose_node()
            if self._finished:
                return
            wait, control = control_wait(self, required), self.state.control
            long, who = self.holds_slot_long, self.identity.name
            acquire = control.acquire(required, self.request_id, wait, spare=long, identity=who)
        else:
            selector = self.read_selector()  # an affinity never overrides it (ROUTER §7)
            if selector is None or not self.offered(selector):
                return
            affinity = None
            preferred = self.request.headers.get_list("X-KCoral-Node")
            if len(preferred) == 1 and is_valid_node_id(preferred[0]):
                affinity = preferred[0]
            acquire = self.state.admission.acquire(
                affinity, self.request_id, selector, self.identity.name, gpu_count
            )
        waited = timed_wait(self, acquire)  # 401 if revoked since (for_caller)
        self.acquire_task = loop.create_task(self.for_caller(waited))
        watch = notice_hang_up(self, self.acquire_task)
        try:
            node, slot = await self.acquire_task
        except RouterBusy as busy:  # the queue is full, the caller's share of it, or of slots
            self.send_router_error(503, "router_busy", str(busy), busy.finish_reason)
            return
        except NoNode as exc:
            self.no_node(exc)
            return
        except asyncio.CancelledError:
            return  # the client went away while queued
        finally:
            watch.cancel()
        self.node, self.slot = node.node_id, slot
        if self.SLOT_KIND == WORKER:
            self.state.in_progress += 1
            self.counted = True
        self.forwarding = True
        headers = forwarded_headers(self.request, self.identity, self.request_id, self.declared)
        head = pb.RequestHead(headers=headers)
        if self.declared is not None:
            head.content_length = self.declared
        self.relay_task = loop.create_task(self.relay_answer())
        await self._send(pb.SlotFrame(request_id=self.request_id, request_head=head))
        if self.declared == 0 and self.request.method != "POST":
            await self._finish_body()  # nothing will arrive: end the request body now

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
            self._reject_body(413, "request_too_large", too_large_message(limit, None))
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
        if self.hung_up:  # left while queued: no answer, not even an empty one
            self.abort_connection()
            return
        await self._finish_body()
        if self.relay_task is not None:
            await relay_ended(self.relay_task)

    async def post(self, *args: str) -> None:
        await self._complete()

    async def get(self, *args: str) -> None:
        await self._complete()

    async def delete(self, *args: str) -> None:
        await self._complete()

    async def body_failed(self, reason: str) -> None:
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
            self.abort_connection()

    def client_hung_up(self) -> None:
        """Seen by ``notice_hang_up`` while the request waits for a slot (Tornado, which
        reads nothing then, has not seen it): leave the queue and log it. Its connection is
        closed once Tornado hands the request back (``_complete``): closed here, Tornado
        went on to finish the request under it and logged an uncaught exception."""
        self.hung_up = True
        if self.acquire_task is not None and not self.acquire_task.done():
            self.acquire_task.cancel()
        self.finish_reason = self.finish_reason or "client_disconnected"
        self.log_finished()

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
        super().on_connection_close()  # ends the wait for the rest of a streamed body

    def on_finish(self) -> None:
        self.slot_done()
        self.log_finished()


def check_length(handler: ForwardHandler) -> bool:
    """``handler``'s ``Content-Length`` checks (ROUTER §8 step 2); False once the request is
    answered."""
    lengths = handler.request.headers.get_list("Content-Length")
    if lengths:
        values = {v.strip() for v in ",".join(lengths).split(",")}
        value = next(iter(values))
        # ASCII digits only: str.isdigit() also takes "²" or "٣", which int() refuses
        if len(values) != 1 or not (value.isascii() and value.isdigit()):
            handler.send_router_error(
                400, "invalid_request", "invalid Content-Length", "request_rejected"
            )
            return False
        handler.declared = int(value)
        if handler.declared > handler.state.settings.max_request_bytes:
            message = too_large_message(handler.state.settings.max_request_bytes, handler.declared)
            handler.send_router_error(413, "request_too_large", message, "request_rejected")
            return False
    elif handler.request.method != "POST" and "Transfer-Encoding" not in handler.request.headers:
        handler.declared = 0  # a bodiless GET or DELETE
    else:
        report_body_failures(handler.request.connection, handler.body_failed)
    return True


class ProgramForwardHandler(ForwardHandler):
    """A program's ``POST`` (``/execute``, ``/v1/jobs``): its node is chosen once its program
    part is read, among the nodes with the GPUs its ``options.gpu_count`` asks for (ROUTER
    §7). Before, a two-GPU program could go to a one-GPU node of its kind and get that
    node's ``400`` while a two-GPU node was free."""

    def initialize(self, state: Any) -> None:
        super().initialize(state)
        self.held: bytearray | None = None  # the body's start, until the program is read

    async def prepare(self) -> None:
        if self.request.method != "POST":
            await super().prepare()
        elif self.check_request() and check_length(self):
            # The selector's refusals come at once, as before; the node waits for the program.
            selector = self.read_selector()
            if selector is not None and self.offered(selector):
                self.held = bytearray()

    async def data_received(self, chunk: bytes) -> None:
        if self.held is None:
            await super().data_received(chunk)
        else:
            await self._read_program(chunk)

    async def _complete(self) -> None:
        if self.held is not None:  # the body ended before its program part did
            await self._read_program(None)
        await super()._complete()

    async def _read_program(self, chunk: bytes | None) -> None:
        """Hold the body's start (``chunk``; None: the body ended) until its program part is
        whole, at most ``PROGRAM_PEEK_LIMIT`` bytes, then choose the node by the program's
        ``gpu_count`` and send what was held."""
        assert self.held is not None
        if chunk is not None:
            self.held += chunk
        found = program_gpu_count(bytes(self.held), self.request.headers.get("Content-Type"))
        if found == MORE and chunk is not None and len(self.held) < PROGRAM_PEEK_LIMIT:
            return
        held, self.held = bytes(self.held), None
        await self.forward_head(found if isinstance(found, int) else None)
        if held:
            await self.data_received(held)
