"""A node slot's hand-over from one request to the next (``Tunnel.serve`` / ``relay``).

The router reads a request's end frame as "this slot is idle" and may send the slot's next
request before the node's relay of the first has finished. That relay's end (marking the
slot idle, or half-closing it while the node drains) then belongs to the next request. A
soak found both going wrong at node stops: a busy slot recorded idle, and a draining node's
half-close under the next answer, lost with an unretrieved ``InvalidStateError``.

The slot stream is scripted here (what the router sends, what the node writes) and the
local server is a real Tornado server on loopback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import tornado.httpserver
import tornado.netutil
import tornado.web
from kcoral_server.node.loopback import HttpConnectionPool
from kcoral_server.node.tunnel import Tunnel
from kcoral_server.proto import kcoral_gateway_pb2 as pb


class Answer(tornado.web.RequestHandler):
    """``GET /v1/jobs/<name>``: its name back; ``held`` waits for ``release``."""

    def initialize(self, release: asyncio.Event) -> None:
        self.release = release

    async def get(self, name: str) -> None:
        if name == "held":
            await self.release.wait()
        self.finish(name.encode())


class ScriptedSlot:
    """A slot stream as the node sees it: ``incoming`` is what the router sends, ``written``
    what the node wrote (frames, and ``"half-closed"`` where it half-closed)."""

    def __init__(self) -> None:
        self.incoming: asyncio.Queue[Any] = asyncio.Queue()
        self.written: list[Any] = []
        self.half_closed = False
        self.cancelled = False
        self.on_write: Callable[[pb.SlotFrame], Awaitable[None]] | None = None

    async def read(self) -> Any:
        return await self.incoming.get()

    async def write(self, frame: pb.SlotFrame | bytes) -> None:
        if self.half_closed or self.cancelled:
            # what grpc.aio raises for a write after done_writing() or cancel()
            raise asyncio.InvalidStateError("RPC is already finished")
        message = pb.SlotFrame.FromString(frame) if isinstance(frame, bytes) else frame
        self.written.append(message)
        if self.on_write is not None:
            await self.on_write(message)

    async def done_writing(self) -> None:
        self.half_closed = True
        self.written.append("half-closed")

    def cancel(self) -> bool:
        self.cancelled = True
        self.incoming.put_nowait(grpc.aio.EOF)
        return True

    def send(self, request_id: str, path: str) -> None:
        head = pb.RequestHead(
            headers=[
                pb.HttpHeader(name=b":method", value=b"GET"),
                pb.HttpHeader(name=b":path", value=path.encode()),
            ],
            content_length=0,
        )
        self.incoming.put_nowait(pb.SlotFrame(request_id=request_id, request_head=head))
        self.incoming.put_nowait(pb.SlotFrame(request_id=request_id, end=pb.EndOfBody()))

    def answer_of(self, request_id: str) -> tuple[list[str], bytes]:
        """The payload kinds written for ``request_id`` and its body."""
        frames = [f for f in self.written if f != "half-closed" and f.request_id == request_id]
        body = b"".join(f.data for f in frames if f.WhichOneof("payload") == "data")
        return [f.WhichOneof("payload") for f in frames], body


def is_end_of(request_id: str, frame: pb.SlotFrame) -> bool:
    return frame.request_id == request_id and frame.WhichOneof("payload") == "end"


async def until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


async def next_turns() -> None:
    """Let the slot's reader take what the router just sent (a few loop turns)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def with_local_server(scenario: Callable[[Tunnel, ScriptedSlot, asyncio.Event], Any]):
    release = asyncio.Event()
    app = tornado.web.Application([(r"/v1/jobs/(\w+)", Answer, {"release": release})])
    server = tornado.httpserver.HTTPServer(app)
    sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
    server.add_sockets(sockets)
    port = sockets[0].getsockname()[1]
    local = f"http://127.0.0.1:{port}"
    tunnel = Tunnel("http://127.0.0.1:1", "n", None, "instance", local, 1, None)
    slot = ScriptedSlot()
    pool = HttpConnectionPool("127.0.0.1", port)
    serving = asyncio.create_task(tunnel.serve(0, "slot-0", slot, pool))
    try:
        await scenario(tunnel, slot, release)
        assert not serving.done(), serving  # the slot's reader never gave up
    finally:
        slot.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        pool.close()
        await tunnel.channel.close()
        server.stop()


def test_a_slot_that_took_its_next_request_before_the_last_relay_ended_is_not_marked_idle():
    async def scenario(tunnel: Tunnel, slot: ScriptedSlot, release: asyncio.Event) -> None:
        async def next_request_at_once(frame: pb.SlotFrame) -> None:
            if is_end_of("first", frame):
                slot.send("second", "/v1/jobs/held")
                await next_turns()  # the second request starts before this relay ends

        slot.on_write = next_request_at_once
        slot.send("first", "/v1/jobs/one")
        await until(lambda: len(slot.answer_of("first")[0]) == 3, "the first answer")
        await asyncio.sleep(0.2)  # the second request is on the local server, held
        assert slot.answer_of("first") == (["response_head", "data", "end"], b"one")
        assert 0 not in tunnel.idle_calls, "a busy slot was recorded idle"
        release.set()
        await until(lambda: len(slot.answer_of("second")[0]) == 3, "the second answer")
        assert slot.answer_of("second") == (["response_head", "data", "end"], b"held")
        assert tunnel.idle_calls.get(0) is slot  # idle again once its last request ended

    asyncio.run(with_local_server(scenario))


def test_a_draining_node_half_closes_a_slot_only_after_its_last_request_is_answered():
    async def scenario(tunnel: Tunnel, slot: ScriptedSlot, release: asyncio.Event) -> None:
        async def drain_then_next_request(frame: pb.SlotFrame) -> None:
            if is_end_of("first", frame):
                tunnel.closing = True  # the node starts draining right there
                slot.send("second", "/v1/jobs/two")
                await next_turns()

        slot.on_write = drain_then_next_request
        slot.send("first", "/v1/jobs/one")
        await until(lambda: len(slot.answer_of("second")[0]) == 3, "the second answer")
        await asyncio.sleep(0.1)
        assert slot.answer_of("first") == (["response_head", "data", "end"], b"one")
        assert slot.answer_of("second") == (["response_head", "data", "end"], b"two")
        assert slot.written[-1] == "half-closed"  # after the second answer, once
        assert slot.written.count("half-closed") == 1

    asyncio.run(with_local_server(scenario))
