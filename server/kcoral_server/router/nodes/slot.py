"""One connected ``ConnectSlot`` stream on the router side (ROUTER.md §5).

The gRPC servicer owns the stream and runs ``read_loop``; the HTTP handler that leased the
slot writes request frames with ``send`` and reads reply frames with ``next_frame``.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Callable
from typing import Any

import grpc

from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.router.nodes.channel import Channel, ChannelClosed


class SlotBroken(Exception):
    """The slot stream failed or was closed; ``reason`` is a ``Cancel.reason`` word."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


WORKER, CONTROL = "worker", "control"
#: gRPC metadata key a node sets on ``ConnectSlot`` to open a control slot (docs/scaling.md).
SLOT_KIND_METADATA = "kcoral-slot-kind"


class RouterSlot:
    """``kind``: ``worker`` slots (one per worker seat) carry ``/execute`` and job submissions;
    ``control`` slots carry the short or long-lived reads (``/v1/info``, job state, events,
    results, cancels) so an open event stream never takes a worker seat's slot."""

    def __init__(
        self,
        node_id: str,
        slot_id: str,
        instance_id: str,
        context: Any,
        kind: str = WORKER,
        slot_key: str = "",
        control_ceiling: int = 0,
    ) -> None:
        self.node_id = node_id
        self.slot_id = slot_id
        self.instance_id = instance_id
        self.slot_key = slot_key  # from the hello; checked against the supervisor's (§12)
        #: the most control slots its node says it opens (the hello's ``max_control_slots``;
        #: 0 from published nodes, which do not say): ``selection.control_ceiling``
        self.control_ceiling = control_ceiling
        self.context = context
        self.kind = kind
        self.request_id: str | None = None
        #: the identity whose request holds this control slot long (a stream, a session's
        #: program, a result): counted in its share of the node (``selection.within_share``)
        self.long_holder: str | None = None
        self.idle_since = time.monotonic()
        self.closed = asyncio.Event()
        # Why the stream ended: None = normal end (status OK), else (code, details).
        self.close_status: tuple[grpc.StatusCode, str] | None = None
        self._replies: Channel[pb.SlotFrame] | None = None
        self._write_lock = asyncio.Lock()
        self._cancelling = False  # set by cancel: no frame of the request may follow it

    def holds_key(self, announced: str) -> bool:
        """Whether this slot presented ``announced``, the key its node's supervisor announced
        (constant time; a supervisor that announced none demands none, ROUTER §12)."""
        if not announced:
            return True
        return hmac.compare_digest(self.slot_key.encode(), announced.encode())

    @property
    def busy(self) -> bool:
        return self.request_id is not None

    # -- used by the HTTP side -------------------------------------------------------------

    def begin(self, request_id: str, long_holder: str | None = None) -> None:
        self.request_id = request_id
        self.long_holder = long_holder
        self._replies = Channel(capacity=2)

    def finish(self) -> None:
        """Both ``end`` frames seen: the slot may take the next request."""
        self.request_id = None
        self.long_holder = None
        self._replies = None
        self.idle_since = time.monotonic()

    async def register_and_acknowledge(self, register: Callable[[RouterSlot], Any]) -> Any:
        """Register the slot and write its ``ack`` under the write lock: a request that takes
        the slot at once cannot write its first frame before (or concurrently with) the ack.
        Returns what ``register`` returned (a refusal, or None)."""
        async with self._write_lock:
            refused = register(self)
            if refused is None:
                await self.context.write(pb.SlotFrame(request_id="", ack=pb.SlotAck()))
            return refused

    async def send(self, frame: pb.SlotFrame | bytes) -> None:
        """Write one frame: a message, or a data frame from ``frames.encode_data``."""
        if self.closed.is_set():
            raise SlotBroken("tunnel_disconnected")
        try:
            async with self._write_lock:
                if self._cancelling:  # cancelled while this frame waited for its turn
                    raise SlotBroken("tunnel_disconnected")
                await self.context.write(frame)
        except SlotBroken:
            raise
        # Any failed write breaks the slot; a write pending when the stream ended raises
        # grpc's internal ExecuteBatchError, which is none of the public classes.
        except Exception as exc:
            self.close(None, "tunnel_disconnected")
            raise SlotBroken("tunnel_disconnected") from exc
        if self.closed.is_set():
            raise SlotBroken("tunnel_disconnected")

    async def next_frame(self) -> pb.SlotFrame:
        replies = self._replies
        if replies is None:
            raise SlotBroken("tunnel_disconnected")
        try:
            return await replies.get()
        except ChannelClosed as exc:
            raise SlotBroken(exc.reason) from None

    def cancel(self, reason: str) -> None:
        """Send ``cancel`` (best effort) and discard the slot; the node opens a new one."""
        if self.closed.is_set() or self._cancelling:
            return
        self._cancelling = True
        request_id = self.request_id or ""
        frame = pb.SlotFrame(request_id=request_id, cancel=pb.Cancel(reason=reason))

        async def send_then_close() -> None:
            # A frame of this request may still be in flight (its head or body, under load):
            # the cancel waits for it, so the node learns why rather than seeing the stream
            # end mid-request. A write stuck for a second (a node that stopped reading) is
            # not waited for: closing is what matters.
            async def write_when_free() -> None:
                async with self._write_lock:
                    await self.context.write(frame)

            try:
                await asyncio.wait_for(write_when_free(), 1.0)
            except Exception:  # the stream may already be gone
                pass
            self.close(None, reason)

        if self._replies is not None:
            self._replies.close(reason)
        asyncio.get_running_loop().create_task(send_then_close())

    def close(
        self, status: tuple[grpc.StatusCode, str] | None, reason: str, *, discard: bool = True
    ) -> None:
        if self.closed.is_set():
            return
        self.close_status = status
        if self._replies is not None:
            self._replies.close(reason, discard=discard)
        self.closed.set()

    # -- used by the gRPC servicer ---------------------------------------------------------

    async def read_loop(self) -> None:
        """Hand node frames to the leased request until the stream ends or breaks."""
        try:
            while not self.closed.is_set():
                frame = await self.context.read()
                if frame is grpc.aio.EOF:
                    # A draining node half-closes its slot after its last answer (SERVER
                    # §12.5): the frames it sent before still reach the client; an answer
                    # cut off before its ``end`` fails as before.
                    self.close(None, "tunnel_disconnected", discard=False)
                    return
                problem = self._check(frame)
                if problem is not None:
                    if self.request_id is not None:
                        self.cancel("invalid_response")
                    else:
                        self.close((grpc.StatusCode.INVALID_ARGUMENT, problem), "invalid_response")
                    return
                replies = self._replies
                if replies is not None:
                    await replies.put(frame)
        except (grpc.RpcError, asyncio.InvalidStateError, RuntimeError):
            self.close(None, "tunnel_disconnected")

    def _check(self, frame: pb.SlotFrame) -> str | None:
        kind = frame.WhichOneof("payload")
        if kind == "hello":
            return "a second hello closes the slot"
        if self.request_id is None:
            return f"unexpected {kind} frame on an idle slot"
        if frame.request_id != self.request_id:
            return "frame for another request id"
        if kind not in ("response_head", "data", "end"):
            return f"unexpected {kind} frame from a node"
        return None
