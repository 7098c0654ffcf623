"""The node's slot tunnel (ROUTER.md §5): one ``ConnectSlot`` stream per worker seat, each
request relayed to the node's own loopback ``POST /execute`` while streaming both ways.

Beyond the spec (docs/scaling.md): a request head may name another method and path with the
pseudo-headers ``:method`` / ``:path`` (only the endpoints in ``loopback.FORWARDABLE``), and
the node also opens *control* slots (gRPC metadata ``kcoral-slot-kind: control``) for ``/v1/info``
and the job reads, so long-lived event streams never occupy a worker seat's slot; more as
they fill (control_slots.py).

Started by the child server once it listens: ``handle = await start_tunnel(...)``;
``await handle.close()`` on shutdown closes idle slots at once and lets busy ones finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import grpc

from kcoral_server.node.control_slots import ControlSlots
from kcoral_server.node.loopback import (
    STREAM_ENDED,
    HttpConnectionPool,
    ProtocolViolation,
    RelayedRequest,
    exchange,
    request_target,
)
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.router.identity import (
    MAX_FRAME_DATA,
    MAX_GRPC_MESSAGE,
    PROTOCOL_VERSION,
    parse_router_origin,
)
from kcoral_server.router.nodes.frames import SlotCall, connect_slot_callable
from kcoral_server.router.nodes.slot import CONTROL, SLOT_KIND_METADATA
from kcoral_server.settings.command_line import ServerSettings

if TYPE_CHECKING:
    from kcoral_server.settings.config import ServerConfig
    from kcoral_server.storage.event_log import EventLog

ACK_TIMEOUT = 10.0
MIN_DELAY, MAX_DELAY, JITTER = 1.0, 30.0, 0.2


def channel_options() -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE),
        ("grpc.max_send_message_length", MAX_GRPC_MESSAGE),
        ("grpc.keepalive_time_ms", 15000),
        ("grpc.keepalive_timeout_ms", 5000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.enable_retries", 0),
    ]


def open_channel(router_endpoint: str) -> grpc.aio.Channel:
    """A gRPC channel to the router origin (TLS with default roots for ``https://``)."""
    _origin, host, port, tls = parse_router_origin(router_endpoint)
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if tls:
        return grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(), channel_options())
    return grpc.aio.insecure_channel(target, channel_options())


#: ROUTER §4.1: how long the supervisor waits for a connection to the router per attempt.
CONNECT_TIMEOUT_SECONDS = 2.0


async def wait_connected(
    channel: grpc.aio.Channel, timeout: float = CONNECT_TIMEOUT_SECONDS
) -> None:
    """Wait until ``channel`` is connected; ``ConnectionError`` after ``timeout`` seconds
    (a router that accepts TCP but never speaks HTTP/2 must not hold the supervisor)."""
    try:
        await asyncio.wait_for(channel.channel_ready(), timeout)
    except asyncio.TimeoutError:
        raise ConnectionError(f"no connection to the router within {timeout:g} s") from None


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


def jittered(delay: float) -> float:
    return delay * random.uniform(1 - JITTER, 1 + JITTER)


def say_disconnected(
    tunnel: Tunnel, index: int, expected: bool, failures: int, error: str, wait: float
) -> None:
    """Log a slot's end (``tunnel_disconnected``). A router out of reach failed every slot's
    every retry: five WARNING lines each time on a one-seat node (flags soak). A slot says
    its first failure in a row, then every 16th (about every 8 min at the longest delay),
    with the count; an expected end (INFO) always."""
    if not expected and failures % 16 != 1:
        return
    tunnel.emit(
        "tunnel_disconnected",
        "INFO" if expected else "WARNING",
        node_id=tunnel.node_id,
        slot=index,
        error=error,
        reconnect_delay_seconds=round(wait, 3),
        **({"failures_in_a_row": failures} if failures > 1 else {}),
    )


async def sleep_unless_closing(tunnel: Tunnel, seconds: float, index: int) -> None:
    """Wait ``seconds`` before slot ``index`` reconnects, less if the tunnel closes."""
    end = asyncio.get_running_loop().time() + seconds
    while not tunnel.closing_slot(index):
        left = end - asyncio.get_running_loop().time()
        if left <= 0:
            return
        await asyncio.sleep(min(left, 0.2))


class Tunnel:
    def __init__(
        self,
        router_endpoint: str,
        node_id: str,
        token: str | None,
        server_instance_id: str,
        server_url: str,
        slot_count: int,
        event_log: Any,
        server_secret: str | None = None,
        slot_key: str = "",
    ) -> None:
        self.router_endpoint = router_endpoint
        # Presented in every hello: the router takes this node's slots only with the key
        # the supervisor announced for this child start (ROUTER §12).
        self.slot_key = slot_key
        self.node_id = node_id
        self.metadata = auth_metadata(token)
        self.server_instance_id = server_instance_id
        parts = urlsplit(server_url)
        self.server_host = parts.hostname or "127.0.0.1"
        self.server_port = parts.port or 80
        self.server_authority = parts.netloc.encode("ascii")  # 127.0.0.1:PORT, the Host
        # What every relayed request presents to the local server (ROUTER §5): the child's
        # own address as Host (a token-less server refuses foreign Host names, EXTENSIONS
        # §6) and the router secret, without which the child serves nobody (ROUTER §12).
        self.local_headers: list[tuple[bytes, bytes]] = [(b"host", self.server_authority)]
        if server_secret:
            self.local_headers.append((b"authorization", f"Bearer {server_secret}".encode()))
        self.slot_count = slot_count
        self.control = ControlSlots(slot_count)
        self.event_log = event_log
        self.closing = False
        self.closing_workers = False  # worker slots only (``close_worker_slots``)
        self.channel = open_channel(router_endpoint)
        # Data frames go through the wire-level fast path (router/nodes/frames.py); data arrives as
        # memoryviews into the received message, written to the loopback socket uncopied.
        self.connect_slot = connect_slot_callable(self.channel)
        self.tasks: list[asyncio.Task[None]] = []
        self.idle_calls: dict[int, SlotCall] = {}

    def emit(self, event: str, level: str = "INFO", **fields: Any) -> None:
        if self.event_log is not None:
            self.event_log.emit(event, level, **fields)

    def start(self) -> None:
        self.emit(
            "tunnel_started",
            router_endpoint=self.router_endpoint,
            node_id=self.node_id,
            slots=self.slot_count,
            control_slots=self.control.base,
            max_control_slots=self.control.ceiling,
        )
        loop = asyncio.get_running_loop()
        total = self.slot_count + self.control.base
        self.tasks = [loop.create_task(self.run_slot(i)) for i in range(total)]

    async def close_worker_slots(self) -> None:
        """The server drains (SERVER §12.5): its worker slots close, idle ones now and busy
        ones after their answer. Control slots stay until ``close``: a job that finishes
        meanwhile is still read through them (its events, its result); closed at once,
        its client lost the result of a program the node had run to its end."""
        self.closing_workers = True
        for index, call in list(self.idle_calls.items()):
            if index < self.slot_count:
                call.cancel()
        await asyncio.gather(*self.tasks[: self.slot_count], return_exceptions=True)

    async def close(self) -> None:
        """Close idle slots now; busy ones close after delivering their response."""
        self.closing = True
        for call in list(self.idle_calls.values()):
            call.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.channel.close()

    def _open_control_slot(self) -> None:
        """One more control slot: fewer than ``control_slots.RESERVE`` are free."""
        self.control.open_one()
        index = len(self.tasks)
        self.tasks.append(asyncio.get_running_loop().create_task(self.run_slot(index)))

    def closing_slot(self, index: int) -> bool:
        closing_workers = self.closing_workers and index < self.slot_count
        return self.closing or closing_workers or self.control.given_up(index - self.slot_count)

    # -- one slot --------------------------------------------------------------------------

    async def run_slot(self, index: int) -> None:
        delay = MIN_DELAY
        connection = HttpConnectionPool(self.server_host, self.server_port)
        metadata = self.metadata
        if index >= self.slot_count:
            metadata = (*metadata, (SLOT_KIND_METADATA, CONTROL))
        failures = 0  # failed attempts in a row: only the first, then every 16th, is said
        while not self.closing_slot(index):
            slot_id = str(uuid.uuid4())
            call = self.connect_slot(metadata=metadata)
            expected, error = False, ""
            try:
                hello = pb.SlotHello(
                    node_id=self.node_id,
                    server_instance_id=self.server_instance_id,
                    slot_id=slot_id,
                    protocol_version=PROTOCOL_VERSION,
                    slot_key=self.slot_key,
                    max_control_slots=self.control.ceiling,
                )
                await call.write(pb.SlotFrame(request_id="", hello=hello))
                ack = await asyncio.wait_for(call.read(), ACK_TIMEOUT)
                if not isinstance(ack, pb.SlotFrame) or ack.WhichOneof("payload") != "ack":
                    raise ProtocolViolation("the router did not acknowledge the slot")
                delay, failures = MIN_DELAY, 0
                self.emit("tunnel_connected", node_id=self.node_id, slot=index, slot_id=slot_id)
                expected, error = await self.serve(index, slot_id, call, connection)
            except asyncio.CancelledError:
                # grpc.aio reports a locally cancelled call as CancelledError on read/write;
                # only a cancellation of this task itself ends the slot loop (on Python 3.10,
                # which has no Task.cancelling(), every cancellation does).
                current_task = asyncio.current_task()
                if current_task is not None and (
                    sys.version_info < (3, 11) or current_task.cancelling()
                ):
                    call.cancel()
                    connection.close()
                    raise
                error = "slot stream cancelled"
            except asyncio.TimeoutError:
                error = "no ack from the router within 10 s"
            except grpc.RpcError as exc:
                error = f"{exc.code().name}: {exc.details()}" if hasattr(exc, "code") else str(exc)
                self.control.refused(index - self.slot_count, error)
            except (ProtocolViolation, OSError) as exc:
                error = str(exc) or type(exc).__name__
            finally:
                self.idle_calls.pop(index, None)
                call.cancel()
            if self.closing_slot(index):
                break
            wait = 0.0 if expected else jittered(delay)
            if not expected:
                delay = min(delay * 2, MAX_DELAY)
                failures += 1
            say_disconnected(self, index, expected, failures, error, wait)
            await sleep_unless_closing(self, wait, index)
        connection.close()

    async def serve(
        self, index: int, slot_id: str, call: Any, connection: HttpConnectionPool
    ) -> tuple[bool, str]:
        """Read router frames until the stream ends; return ``(expected_cancel, error)``.

        ``call`` stays untyped here: its frames are a ``SlotFrame`` or the fast path's
        ``DataFrame``, told apart by ``WhichOneof``, which the types cannot follow."""
        current: RelayedRequest | None = None
        self.idle_calls[index] = call
        try:
            while True:
                if self.closing_slot(index) and (
                    current is None or current.task is None or current.task.done()
                ):
                    return False, "shutting down"
                frame = await call.read()
                if frame is grpc.aio.EOF:
                    return False, "the router closed the slot"
                kind = frame.WhichOneof("payload")
                if kind == "request_head":
                    if not frame.request_id or (current is not None and current.body_open):
                        raise ProtocolViolation("unexpected request_head")
                    request_target(frame.request_head)  # refuses what may not be forwarded
                    previous = current.task if current is not None else None
                    if current is not None:
                        current.followed = True
                    current = RelayedRequest(frame.request_id)
                    self.idle_calls.pop(index, None)
                    if index >= self.slot_count and self.control.taken(index) and not self.closing:
                        self._open_control_slot()
                    current.task = asyncio.get_running_loop().create_task(
                        self.relay(call, frame, current, previous, connection, index)
                    )
                    if index >= self.slot_count:  # however it ends: also cancelled unstarted
                        current.task.add_done_callback(self.control.freer(current, index))
                elif kind in ("data", "end"):
                    if (
                        current is None
                        or frame.request_id != current.request_id
                        or not current.body_open
                    ):
                        raise ProtocolViolation(f"unexpected {kind} frame")
                    if kind == "data":
                        data = frame.data
                        if len(data) > MAX_FRAME_DATA:
                            raise ProtocolViolation("data frame over 262144 bytes")
                        await current.body.put(data)
                    else:
                        current.body_open = False
                        await current.body.put(None)
                elif kind == "cancel":
                    reason = frame.cancel.reason
                    self.emit(
                        "tunnel_request_cancelled",
                        node_id=self.node_id,
                        request_id=frame.request_id,
                        slot=slot_id,
                        reason=reason,
                    )
                    return current is not None, f"cancelled: {reason}"
                else:
                    raise ProtocolViolation(f"unexpected {kind} frame")
        finally:
            if current is not None and current.task is not None and not current.task.done():
                current.body.close("slot closed")
                current.task.cancel()
                connection.close()
                await asyncio.gather(current.task, return_exceptions=True)

    async def relay(
        self,
        call: SlotCall,
        head_frame: pb.SlotFrame,
        request: RelayedRequest,
        previous: asyncio.Task[None] | None,
        pool: HttpConnectionPool,
        index: int,
    ) -> None:
        """Deliver one request to the loopback server and stream its response back; then
        the slot is idle again, or half-closed while it drains."""
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)
        try:
            error = await exchange(call, head_frame, request, pool, self.local_headers)
            if error is not None:
                rid, node = request.request_id, self.node_id
                event = {"node_id": node, "request_id": rid, "error": error}
                self.emit("tunnel_request_failed", "WARNING", **event)
        finally:
            if request.followed:
                pass  # the slot carries the next request already: its end is that one's
            elif self.closing_slot(index):
                # Draining: half-close, and the router ends the stream once it has read the
                # answer (serve() then sees the end). A cancel here could overtake the frames
                # just written, and the last answer of a draining node was lost.
                with contextlib.suppress(*STREAM_ENDED):
                    await call.done_writing()
            else:
                self.idle_calls[index] = call


@dataclass
class TunnelHandle:
    tunnel: Tunnel

    async def close_worker_slots(self) -> None:
        await self.tunnel.close_worker_slots()

    async def close(self) -> None:
        await self.tunnel.close()


async def start_tunnel(
    settings: ServerSettings | ServerConfig,
    server_url: str,
    slot_count: int,
    event_log: EventLog,
    *,
    instance_id: str | None = None,
    server_secret: str | None = None,
    slot_key: str = "",
) -> TunnelHandle:
    """Open ``slot_count`` slots for the server listening at ``server_url``.

    ``settings`` is the server's ``ServerSettings`` (or its ``ServerConfig``). Pass the
    server's ``instance_id``; without it, it is read from ``/internal/worker-status`` (the
    slots must name the instance the supervisor reports). ``server_secret`` is the router
    secret the local server requires, ``slot_key`` the key the supervisor announced for
    this child start (ROUTER §12).
    """
    config = settings.config if isinstance(settings, ServerSettings) else settings
    if config.router_endpoint is None or config.node_id is None:
        raise ValueError("a tunnel needs --router and --node-id")
    if instance_id is None:
        instance_id = await _server_instance_id(server_url, server_secret)
    tunnel = Tunnel(
        config.router_endpoint,
        config.node_id,
        config.node_token,
        instance_id,
        server_url,
        slot_count,
        event_log,
        server_secret,
        slot_key,
    )
    tunnel.start()
    return TunnelHandle(tunnel)


async def _server_instance_id(server_url: str, server_secret: str | None) -> str:
    from kcoral_server.node.http11 import get_json

    parts = urlsplit(server_url)
    host = parts.hostname or "127.0.0.1"
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    _status, body = await get_json(
        host, parts.port or 80, "/internal/worker-status", bearer=server_secret
    )
    if not isinstance(body, dict) or not isinstance(body.get("instance_id"), str):
        raise RuntimeError("the server's /internal/worker-status has no instance_id")
    return body["instance_id"]
