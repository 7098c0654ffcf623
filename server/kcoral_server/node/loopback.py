"""One routed request delivered to the node's own loopback server, and its answer streamed
back on the slot (ROUTER §5): which methods and paths a router may reach (``FORWARDABLE``),
which headers cross, and one kept-alive loopback connection per slot."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field

import grpc

from kcoral.connection.keep_alive import POOLED_IDLE_SECONDS
from kcoral_server.node.http11 import HttpConnection, HttpError
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.router.nodes.channel import Channel, ChannelClosed
from kcoral_server.router.nodes.frames import SlotCall, encode_data

METHOD_HEADER, PATH_HEADER = b":method", b":path"
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
# Never taken from the router's head: the tunnel sets host and authorization itself, and a
# browser's origin and cookies have no business on the node (the router drops them before).
SET_BY_TUNNEL = frozenset({b"host", b"authorization", b"origin", b"cookie"})
FORWARDABLE_METHODS = frozenset({b"GET", b"POST", b"DELETE"})


#: The node's own endpoints a router may reach; never /internal/* (it trusts loopback peers).
FORWARDABLE = re.compile(
    rb"/(?:execute|v1/info|v1/jobs(?:/[A-Za-z0-9_~%-][A-Za-z0-9_.~%-]*(?:/events|/result)?)?"
    rb"|v1/sessions(?:/[0-9a-f-]{36}(?:/execute|/jobs|/interrupt)?)?"
    rb"|v1/revocations(?:/[A-Za-z0-9][A-Za-z0-9_.@-]{0,63})?)"
    rb"(?:\?[\x21-\x7e]*)?"
)
#: what grpc.aio raises for a write to a slot stream that ended (or this node half-closed)
STREAM_ENDED = (grpc.RpcError, asyncio.InvalidStateError)


def request_target(head: pb.RequestHead) -> tuple[str, str]:
    """``(method, path)`` of a request head: its pseudo-headers, else ``POST /execute``."""
    methods = [h.value for h in head.headers if h.name == METHOD_HEADER]
    paths = [h.value for h in head.headers if h.name == PATH_HEADER]
    if not methods and not paths:
        return "POST", "/execute"
    if len(methods) != 1 or len(paths) != 1:
        raise ProtocolViolation("a request head needs exactly one :method and one :path")
    if methods[0] not in FORWARDABLE_METHODS or FORWARDABLE.fullmatch(paths[0]) is None:
        raise ProtocolViolation("request method or path not forwardable")
    return methods[0].decode(), paths[0].decode()


class ProtocolViolation(Exception):
    """The router sent a frame the node must not accept; the stream is dropped."""


@dataclass(eq=False)
class RelayedRequest:
    """One request on a slot: its body as the router sends it, to the loopback server."""

    request_id: str
    body: Channel[bytes | memoryview | None] = field(default_factory=lambda: Channel(capacity=2))
    body_open: bool = True
    task: asyncio.Task[None] | None = None
    # The router sent the slot's next request (it reads our end frame as "slot idle"), maybe
    # before this relay finished: the slot's idle mark and drain half-close are then the
    # next request's, not this one's.
    followed: bool = False


async def send_body(connection: HttpConnection, request: RelayedRequest, chunked: bool) -> None:
    """Stream ``request``'s body to the local server as the router sends it."""
    try:
        while True:
            piece = await request.body.get()
            if piece is None:
                await connection.send_end(chunked=chunked)
                return
            await connection.send(piece, chunked=chunked)
    except ChannelClosed:
        return


class HttpConnectionPool:
    """At most one kept-alive loopback connection per slot (slots carry one request at a time)."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.idle: HttpConnection | None = None
        self.idle_since = 0.0

    async def get(self) -> HttpConnection:
        connection, self.idle = self.idle, None
        # The child closes a connection idle for its head deadline (10 s by default); one
        # idle for half of that is replaced rather than raced (kcoral.connection.keep_alive).
        fresh = time.monotonic() - self.idle_since < POOLED_IDLE_SECONDS
        if connection is not None and connection.usable and fresh:
            return connection
        if connection is not None:
            connection.close()
        connection = HttpConnection(self.host, self.port)
        await connection.open()
        return connection

    def put(self, connection: HttpConnection, answered: bool) -> None:
        """Keep ``connection`` for the slot's next request if its answer was read to its end
        (``answered``). One a cancel left (the client went away) or a failed write still
        carries the rest of its answer, which the next request would read as its own."""
        if answered and connection.usable:
            self.idle = connection
            self.idle_since = time.monotonic()
        else:
            connection.close()

    def close(self) -> None:
        if self.idle is not None:
            self.idle.close()
            self.idle = None


async def exchange(
    call: SlotCall,
    head_frame: pb.SlotFrame,
    request: RelayedRequest,
    pool: HttpConnectionPool,
    local_headers: list[tuple[bytes, bytes]],
) -> str | None:
    """Send ``request`` (its head ``head_frame``, with ``local_headers``: the Host and the
    router secret) to the loopback server on a connection of ``pool`` and write its answer
    to ``call`` as it comes. None once the answer went whole; else what failed, with the
    slot stream dropped (the router answers 502)."""
    rid = request.request_id
    head = head_frame.request_head
    method, path = request_target(head)
    chunked = not head.HasField("content_length")
    headers = [
        (h.name, h.value)
        for h in head.headers
        if h.name.lower() not in HOP_BY_HOP
        and h.name.lower() not in SET_BY_TUNNEL
        and not h.name.startswith(b":")
        and not (chunked and h.name.lower() == b"content-length")
    ]
    headers.extend(local_headers)
    if chunked:
        headers.append((b"transfer-encoding", b"chunked"))
    connection = await pool.get()
    body_task = asyncio.get_running_loop().create_task(send_body(connection, request, chunked))
    answered = False  # read to its end: only then may the connection serve another
    try:
        await connection.send_head(method, path, headers)
        status, response_headers = await connection.read_head()
        await call.write(
            pb.SlotFrame(
                request_id=rid,
                response_head=pb.ResponseHead(
                    status=status,
                    # lowercase on the gRPC stream, as HTTP/2 requires (ROUTER §5)
                    headers=[pb.HttpHeader(name=n.lower(), value=v) for n, v in response_headers],
                ),
            )
        )
        async for piece in connection.body(status, response_headers, method):
            await call.write(encode_data(rid, piece))
        if not body_task.done():
            # Early answer: the rest of the body is not wanted; this connection is spent.
            connection.reusable = False
            body_task.cancel()
        answered = True
        await call.write(pb.SlotFrame(request_id=rid, end=pb.EndOfBody()))
    except (HttpError, OSError, asyncio.IncompleteReadError, *STREAM_ENDED) as exc:
        # The local server failed us (dropping the stream tells the router: 502), or the
        # slot stream ended under the answer (said by the caller, or the error went unread).
        connection.close()
        call.cancel()
        return str(exc) or type(exc).__name__
    finally:
        # Drop the body still coming, or serve() blocks and never sees the slot end.
        request.body.close("the answer has ended")
        if not body_task.done():
            body_task.cancel()
        await asyncio.gather(body_task, return_exceptions=True)
        pool.put(connection, answered)
    return None
