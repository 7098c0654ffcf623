"""The gRPC service ``kcoral.gateway.v1.RouterGateway`` (ROUTER.md §2–§5)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import grpc

from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.proto import kcoral_gateway_pb2_grpc as pb_grpc
from kcoral_server.router.identity import (
    PROTOCOL_VERSION,
    NodeGrant,
    is_valid_node_id,
    node_grant,
)
from kcoral_server.router.log import OncePerPeer, RouterLog
from kcoral_server.router.nodes.frames import SERVICE, parse_frame, serialize_frame
from kcoral_server.router.nodes.registry import (
    SERVER_STOPPED,
    SLOT_KEY_REFUSAL,
    Registry,
    SupervisorStream,
)
from kcoral_server.router.nodes.slot import CONTROL, SLOT_KIND_METADATA, WORKER, RouterSlot
from kcoral_server.router.settings import RouterSettings
from kcoral_server.settings.config import MAX_NODE_LABELS, node_label_problem

FIRST_MESSAGE_TIMEOUT = 10.0
#: at most one ``node_token_invalid`` line per peer address in this many seconds
TOKEN_REFUSAL_LOG_SECONDS = 60.0

#: The server side of a ``ConnectSupervisor`` stream and of a ``ConnectSlot`` stream.
SupervisorContext = grpc.aio.ServicerContext[pb.SupervisorStatus, pb.SupervisorAck]
SlotContext = grpc.aio.ServicerContext[pb.SlotFrame, pb.SlotFrame]
Message = TypeVar("Message")


KIND_KEY = re.compile(r"[a-z0-9]{0,32}", re.ASCII)  # "" from published supervisors
#: Bounds of what a status (or a slot's hello) names, which the router keeps per node
#: record, per baseline and per slot (ROUTER §4.3): a node-token holder cannot make it hold
#: up to a whole 320 KiB message for each of its records. Ours send a UUID (36
#: characters), a 43-character slot key, a few short target and version entries.
MAX_ID_CHARS = 128  # supervisor_instance_id, server_instance_id, slot_key; slot_id
MAX_MAP_ENTRIES = 32  # each of target and versions
MAX_MAP_KEY_CHARS = 64
MAX_MAP_VALUE_CHARS = 256


def status_problem(
    status: pb.SupervisorStatus, settings: RouterSettings, node_id: str | None
) -> str | None:
    """Why a ``SupervisorStatus`` is invalid (§4.3), or None."""
    if not is_valid_node_id(status.node_id):
        return "invalid node_id"
    if node_id is not None and status.node_id != node_id:
        return "node_id changed on the stream"
    if not status.supervisor_instance_id:
        return "supervisor_instance_id is empty"
    if status.server_healthy:
        if not status.server_instance_id:
            return "a healthy status needs a server_instance_id"
        if status.worker_count < 1:
            return "a healthy status needs worker_count >= 1"
        if status.busy_workers > status.worker_count:
            return "busy_workers exceeds worker_count"
        if status.health_age_millis > settings.max_status_age_seconds * 1000:
            return "health_age_millis exceeds the maximum status age"
    if max(map(len, (status.supervisor_instance_id, status.server_instance_id))) > MAX_ID_CHARS:
        return f"an instance id is over {MAX_ID_CHARS} characters"
    if len(status.slot_key) > MAX_ID_CHARS:
        return f"slot_key is over {MAX_ID_CHARS} characters"
    return kind_problem(status) or maps_problem(status) or lease_stats_problem(status)


def maps_problem(status: pb.SupervisorStatus) -> str | None:
    """Why a status's ``target`` or ``versions`` is over its bounds, or None."""
    for name, entries in (("target", status.target), ("versions", status.versions)):
        if len(entries) > MAX_MAP_ENTRIES:
            return f"more than {MAX_MAP_ENTRIES} {name} entries"
        for key, value in entries.items():
            if len(key) > MAX_MAP_KEY_CHARS or len(value) > MAX_MAP_VALUE_CHARS:
                return (
                    f"a {name} key over {MAX_MAP_KEY_CHARS} or value over "
                    f"{MAX_MAP_VALUE_CHARS} characters"
                )
    return None


def kind_problem(status: pb.SupervisorStatus) -> str | None:
    """Why a status's kind or labels break ROUTER §6's bounds (they are shown in /v1/info
    and kept per node, so a node cannot make the router hold much), or None."""
    kind = status.kind
    if not KIND_KEY.fullmatch(kind.gpu) or len(kind.arch) > 32 or len(kind.product) > 128:
        return "kind is malformed (gpu: up to 32 of [a-z0-9]; arch, product bounded)"
    if len(status.labels) > MAX_NODE_LABELS:
        return f"more than {MAX_NODE_LABELS} labels"
    for key, value in status.labels.items():
        problem = node_label_problem(f"{key}={value}")
        if problem is not None:
            return f"label {problem}"
    return None


#: bounds of a status's LeaseStats (ROUTER §6): a node cannot make /v1/info's estimates
#: non-finite, negative or absurd for the rows it shares with other nodes
MAX_LEASE_COUNT = 1 << 20
MAX_LEASE_MS = 1e10  # about 115 days
MAX_NODE_QUEUED = 1 << 32


def lease_stats_problem(status: pb.SupervisorStatus) -> str | None:
    """Why a status's ``lease_stats`` is out of bounds, or None."""
    if not status.HasField("lease_stats"):
        return None
    stats = status.lease_stats
    times = (
        stats.seat_held_mean_ms,
        stats.seat_held_p50_ms,
        stats.lease_held_mean_ms,
        stats.lease_held_p50_ms,
    )
    if not all(0.0 <= t <= MAX_LEASE_MS for t in times):  # NaN fails too
        return "lease_stats times must be finite, from 0 to 1e10 ms"
    if stats.count > MAX_LEASE_COUNT or stats.queued > MAX_NODE_QUEUED:
        return "lease_stats count or queued is out of bounds"
    return None


async def read_message(context: grpc.aio.ServicerContext[Message, Any]) -> Message | None:
    """The stream's next message, or None at its end (grpc.aio's ``EOF``, which the
    types-grpcio stubs leave out of ``read``)."""
    message: object = await context.read()
    return None if message is grpc.aio.EOF else cast(Message, message)


async def read_unless_ended(
    context: grpc.aio.ServicerContext[Message, Any], stream: SupervisorStream
) -> Message | None:
    """The stream's next message, or None at its end or once the registry superseded it
    (``stream.ended``): a silent stream would otherwise wait here for ever."""
    if stream.ended.is_set():
        return None
    reading = read_message(context)
    read = asyncio.ensure_future(reading)
    ended = asyncio.ensure_future(stream.ended.wait())
    try:
        await asyncio.wait((read, ended), return_when=asyncio.FIRST_COMPLETED)
    finally:
        ended.cancel()
        if not read.done():  # superseded, or this call cancelled (the router stopping)
            read.cancel()
            # what it ends with (a stopped server's error) is nobody's: asyncio would log
            # "Task exception was never retrieved"
            read.add_done_callback(_retrieve)
    return read.result() if read.done() and not read.cancelled() else None


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


async def ignore_status(node_id: str, status: pb.SupervisorStatus) -> None:
    return None


class Gateway(pb_grpc.RouterGatewayServicer):
    def __init__(
        self,
        registry: Registry,
        settings: RouterSettings,
        log: RouterLog,
        on_status: Callable[[str, pb.SupervisorStatus], Awaitable[None]] = ignore_status,
    ) -> None:
        self.registry = registry
        self.settings = settings
        self.log = log
        # Called with every valid status once the registry has it: the router's metrics
        # take the node's own series from it (EXTENSIONS §13); it never ends the stream.
        self.on_status = on_status
        self.token_refusals = OncePerPeer(TOKEN_REFUSAL_LOG_SECONDS)

    async def _authenticate(self, context: grpc.aio.ServicerContext[Any, Any]) -> NodeGrant:
        """The node ids the call's node token opens; ``UNAUTHENTICATED`` without one."""
        value = None
        for key, item in context.invocation_metadata() or ():
            if key == "authorization":
                value = item
        grant = node_grant(value, self.settings.node_token, self.settings.node_tokens)
        if grant is None:
            # Only the node logged this: a node left with an old token after a rotation, or
            # given a wrong one, was invisible in the router's log (ROUTER §10).
            if self.token_refusals.due(context.peer()):
                self.log.event(
                    "node_token_invalid",
                    level="WARNING",
                    peer=context.peer(),
                    message="refused a node's invalid or missing node token: give it a token from "
                    "--node-token or --node-token-file",
                )
            # the node logs this text at each retry: say what its operator sets
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "invalid or missing node token (the node's KCORAL_NODE_TOKEN must be one this "
                "router accepts)",
            )
        assert grant is not None  # abort raises
        return grant

    async def _check_grant(
        self, context: grpc.aio.ServicerContext[Any, Any], grant: NodeGrant, node_id: str
    ) -> None:
        """ROUTER §3: a per-node token opens only its own node ids, for the supervisor
        stream and the slots alike; another id is ``PERMISSION_DENIED`` (and a WARNING)."""
        if grant.opens(node_id):
            return
        self.log.event(
            "node_token_refused",
            level="WARNING",
            node=node_id,
            peer=context.peer(),
            message=f"the node token presented opens {grant}, not this one",
        )
        await context.abort(
            grpc.StatusCode.PERMISSION_DENIED, f"this node token does not open node id {node_id}"
        )

    async def _first(self, context: grpc.aio.ServicerContext[Message, Any]) -> Message | None:
        try:
            reading = read_message(context)
            return await asyncio.wait_for(reading, FIRST_MESSAGE_TIMEOUT)
        except asyncio.TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "no first message within 10 s")

    async def ConnectSupervisor(self, request_iterator: object, context: SupervisorContext) -> None:
        grant = await self._authenticate(context)
        first = await self._first(context)
        if first is None:
            return
        problem = status_problem(first, self.settings, None)
        if problem is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        node_id = first.node_id
        await self._check_grant(context, grant, node_id)
        stream = self.registry.attach_supervisor(node_id)
        if stream is None:
            # ROUTER §4.3: the id belongs to a live stream; the claimant gets no traffic.
            self.log.event(
                "node_claim_refused",
                level="WARNING",
                node=node_id,
                supervisor=first.supervisor_instance_id,
                peer=context.peer(),
                message="another supervisor stream for this node id is open and reporting",
            )
            await context.abort(
                grpc.StatusCode.ALREADY_EXISTS,
                "node id is held by a live supervisor stream",
            )
        self.log.event("node_connected", node=node_id, supervisor=first.supervisor_instance_id)
        if not first.slot_key:
            # A published supervisor: its slots are taken on the node token alone, as before.
            self.log.event(
                "node_without_slot_key",
                level="WARNING",
                node=node_id,
                message="this supervisor announces no slot key: whoever holds the node token "
                "and learns its server instance id can open slots for it; upgrade the node",
            )
        last = first
        try:
            self.registry.apply_status(stream, first)
            await context.write(pb.SupervisorAck())
            await self.on_status(node_id, first)
            while True:
                status = await read_unless_ended(context, stream)
                if stream.superseded:
                    await context.abort(
                        grpc.StatusCode.FAILED_PRECONDITION, "superseded by a newer stream"
                    )
                if status is None:
                    return
                problem = status_problem(status, self.settings, node_id)
                if problem is not None:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
                last = status
                self.registry.apply_status(stream, status)  # its node_state line: NodeStateLines
                await self.on_status(node_id, status)
        finally:
            if not stream.superseded:
                # A WARNING is for a node lost; a drained node leaving and the router's own
                # stop ending every stream (``end``) are what the operator asked for. Drained:
                # its last status said its server had stopped. Not how the stream ended: a
                # supervisor exiting right after its goodbye cancels the call, which can
                # read as a break, and a break can read as a clean end. A node that crashed
                # or was killed mid-drain is lost (its statuses said draining all along).
                drained = last.draining and last.last_error == SERVER_STOPPED
                planned = stream.ended.is_set() or drained
                level = "INFO" if planned else "WARNING"
                self.log.event("node_disconnected", level=level, node=node_id)
            self.registry.detach_supervisor(stream)

    async def ConnectSlot(self, request_iterator: object, context: SlotContext) -> None:
        grant = await self._authenticate(context)
        first = await self._first(context)
        if first is None:
            return
        if first.request_id or first.WhichOneof("payload") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "first frame must be hello")
        hello = first.hello
        if hello.protocol_version != PROTOCOL_VERSION:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, "unsupported slot protocol_version"
            )
        if not is_valid_node_id(hello.node_id):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "invalid node_id")
        await self._check_grant(context, grant, hello.node_id)
        if not hello.server_instance_id or not hello.slot_id:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "server_instance_id and slot_id are required"
            )
        if max(map(len, (hello.server_instance_id, hello.slot_id, hello.slot_key))) > MAX_ID_CHARS:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"server_instance_id, slot_id and slot_key are at most {MAX_ID_CHARS} characters",
            )
        kind = WORKER
        for key, value in context.invocation_metadata() or ():
            if key == SLOT_KIND_METADATA:
                kind = value if isinstance(value, str) else ""  # bytes: no kind we know
        if kind not in (WORKER, CONTROL):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unknown slot kind")
        slot = RouterSlot(
            hello.node_id,
            hello.slot_id,
            hello.server_instance_id,
            context,
            kind,
            hello.slot_key,
            hello.max_control_slots,
        )
        try:
            refused = await slot.register_and_acknowledge(self.registry.add_slot)
        except BaseException:  # the ack could not be written: the slot is not usable
            slot.close(None, "tunnel_disconnected")
            self.registry.remove_slot(slot)
            raise
        if refused is not None:
            if refused[1] == SLOT_KEY_REFUSAL or refused[0] == grpc.StatusCode.RESOURCE_EXHAUSTED:
                # Someone holds the node token but not this node's slot key: a stranger
                # trying to take the node's seats (ROUTER §12); or a node opening streams
                # past --max-slots-per-node. Either got no ack and no work.
                self.log.event(
                    "slot_refused",
                    level="WARNING",
                    node=hello.node_id,
                    peer=context.peer(),
                    message=refused[1],
                )
            await context.abort(*refused)
        reader = None
        try:
            reader = asyncio.get_running_loop().create_task(slot.read_loop())
            closed = asyncio.get_running_loop().create_task(slot.closed.wait())
            await asyncio.wait({reader, closed}, return_when=asyncio.FIRST_COMPLETED)
            closed.cancel()
        finally:
            slot.close(None, "tunnel_disconnected")
            if reader is not None and not reader.done():
                reader.cancel()
            self.registry.remove_slot(slot)
        if slot.close_status is not None:
            await context.abort(*slot.close_status)


def add_gateway_to_server(gateway: Gateway, server: grpc.aio.Server) -> None:
    """Register ``gateway`` like the generated ``add_RouterGatewayServicer_to_server``, but
    with the data-frame fast path (``frames.py``) as ``ConnectSlot``'s (de)serializers."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        "ConnectSupervisor": grpc.stream_stream_rpc_method_handler(
            gateway.ConnectSupervisor,
            request_deserializer=pb.SupervisorStatus.FromString,
            response_serializer=pb.SupervisorAck.SerializeToString,
        ),
        "ConnectSlot": grpc.stream_stream_rpc_method_handler(
            gateway.ConnectSlot,
            request_deserializer=parse_frame,
            response_serializer=serialize_frame,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)
