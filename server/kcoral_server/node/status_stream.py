"""The node supervisor's status reports to the router over ``ConnectSupervisor`` (ROUTER.md
§12): one status at connect, then one whenever it changes or every health interval, with
reconnects backing off up to 30 s; and what each says (``supervisor_status``)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from kcoral_server.node.tunnel import auth_metadata, open_channel, wait_connected
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.proto import kcoral_gateway_pb2_grpc as pb_grpc
from kcoral_server.router.log import RouterLog
from kcoral_server.settings.config import ServerConfig, node_labels

if TYPE_CHECKING:
    from kcoral_server.gpu.kind import NodeKind
    from kcoral_server.node.supervisor import Supervisor

MAX_UINT64 = 2**64 - 1

#: how long the last status waits for the router to end the call (the supervisor waits 2 s
#: for the whole report loop at its stop)
GOODBYE_SECONDS = 1.5

#: LeaseStats' duration fields, as the child's worker-status names them (ROUTER §6)
LEASE_STAT_TIMES = (
    "seat_held_mean_ms",
    "seat_held_p50_ms",
    "lease_held_mean_ms",
    "lease_held_p50_ms",
)


def lease_stats_message(body: dict[str, Any]) -> pb.LeaseStats | None:
    """``lease_stats`` of the child's worker-status as a status's ``LeaseStats`` (ROUTER
    §6), or None when the body has none or a malformed one (a child of another version):
    the node is then reported without them, never unhealthy for it."""
    stats = body.get("lease_stats")
    if not isinstance(stats, dict):
        return None
    count, queued = stats.get("count"), stats.get("queued")
    if type(count) is not int or type(queued) is not int:
        return None
    if not (0 <= count < 2**32 and 0 <= queued < 2**64):
        return None
    message = pb.LeaseStats(count=count, queued=queued)
    for name in LEASE_STAT_TIMES:
        value = stats.get(name)
        if count == 0:
            continue  # no recent programs: the times are null
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        if not math.isfinite(value) or value < 0:
            return None
        setattr(message, name, float(value))
    return message


async def ended_call_text(call: grpc.aio.Call) -> str:
    """Why a call that a write found ended, ended (``UNAVAILABLE: ...``): the write's own
    error says only 'RPC already finished.'. A router that closed it (stopping) ended it OK."""
    ended = "the router ended the supervisor stream"
    try:
        code, details = await asyncio.wait_for(asyncio.gather(call.code(), call.details()), 1)
    except (asyncio.TimeoutError, grpc.RpcError):
        return ended
    if code == grpc.StatusCode.OK:
        return ended
    return f"{code.name}: {details}" if details else code.name


async def stream_status(
    config: ServerConfig,
    status: Callable[[], pb.SupervisorStatus],
    changed: asyncio.Event,
    *,
    interval: float,
    done: Callable[[], bool],
    log: RouterLog,
) -> None:
    """Send ``status()`` to the router of ``config`` at connect, when ``changed`` is set and
    every ``interval`` seconds, reconnecting after failures, until ``done()`` after a send
    (or the task is cancelled)."""
    assert config.router_endpoint is not None  # a node supervisor runs only with --router
    delay = 1.0
    channel = open_channel(config.router_endpoint)
    stub = pb_grpc.RouterGatewayStub(channel)
    metadata = auth_metadata(config.node_token)
    try:
        while True:
            # The call is opened once the channel is up: one opened while the router was
            # still starting failed at once, and the first write after the channel came up
            # then said only 'RPC already finished.' (a WARNING at a node's every start
            # beside its router's, and a second's delay).
            call: grpc.aio.StreamStreamCall | None = None
            try:
                await wait_connected(channel)
                call = stub.ConnectSupervisor(metadata=metadata)
                # Cleared before each status is taken, never after: a change reported while
                # a status or the ack is under way (the child's new slot key) is sent next.
                changed.clear()
                await call.write(status())
                ack = await asyncio.wait_for(call.read(), 12)
                if ack is grpc.aio.EOF:
                    raise ConnectionError("the router ended the supervisor stream")
                delay = 1.0
                log.event("supervisor_connected", node_id=config.node_id)
                while True:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(changed.wait(), interval)
                    changed.clear()
                    # asked before the status is taken: the last one sent then says the
                    # server is gone, which the router reads as a drain done (ROUTER §10)
                    finished = done()
                    await call.write(status())
                    if finished:
                        await call.done_writing()
                        # The router ends the call once it has read the goodbye; cancelling
                        # before then (the finally below) could drop that status, and the
                        # drained node's leave was logged as a lost node's WARNING.
                        with contextlib.suppress(asyncio.TimeoutError):
                            await asyncio.wait_for(call.code(), GOODBYE_SECONDS)
                        return
            # InvalidStateError: a write to a call the router already ended (the router went
            # away between two statuses); like any lost stream, reconnect. Uncaught, it ended
            # the reports for good and the supervisor's stop with a traceback (exit 1).
            except (
                grpc.RpcError,
                ConnectionError,
                asyncio.TimeoutError,
                asyncio.InvalidStateError,
            ) as exc:
                if isinstance(exc, asyncio.InvalidStateError) and call is not None:
                    text = await ended_call_text(call)  # why the router ended it
                elif isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
                    text = f"{exc.code().name}: {exc.details()}"
                else:
                    text = str(exc)
                log.event(
                    "supervisor_disconnected",
                    "WARNING",
                    node_id=config.node_id,
                    error=text or type(exc).__name__,
                    reconnect_delay_seconds=delay,
                )
            except asyncio.CancelledError:
                if call is not None:
                    call.cancel()
                task = asyncio.current_task()
                # Python 3.10 has no Task.cancelling(): every cancellation ends the loop
                if task is not None and (sys.version_info < (3, 11) or task.cancelling()):
                    raise
            finally:
                if call is not None:
                    call.cancel()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)
    finally:
        await channel.close()


def supervisor_status(supervisor: Supervisor) -> pb.SupervisorStatus:
    """What ``supervisor`` reports now: its child's health, offers and load while healthy,
    else why not; its kind, labels, slot key and whether it drains (ROUTER §4, §6, §12)."""
    child_up = supervisor.child is not None and supervisor.child.poll() is None
    healthy = supervisor.healthy and child_up and supervisor.node_kind is not None
    age = (
        MAX_UINT64
        if supervisor.last_healthy_at is None
        else int((time.monotonic() - supervisor.last_healthy_at) * 1000)
    )
    status = pb.SupervisorStatus(
        node_id=supervisor.config.node_id,
        server_healthy=healthy,
        supervisor_instance_id=supervisor.instance_id,
        server_instance_id=supervisor.body.get("instance_id", "") if healthy else "",
        last_error="" if healthy else supervisor.last_error,
        health_age_millis=age,
        slot_key=supervisor.slot_key,
        draining=supervisor.stopping.is_set() or supervisor.child_draining,
    )
    if healthy:
        status.worker_count = supervisor.body["worker_count"]
        status.busy_workers = supervisor.body["busy_workers"]
        status.target.update(supervisor.body["target"])
        status.versions.update({**supervisor.body["versions"], **supervisor.versions_override})
        status.node_metrics = supervisor.metrics.take()  # now and then (metrics_fetch)
        lease_stats = lease_stats_message(supervisor.body)
        if lease_stats is not None:
            status.lease_stats.CopyFrom(lease_stats)
    status.kind.CopyFrom(kind_message(supervisor.node_kind))
    status.labels.update(node_labels(supervisor.config))
    return status


def kind_message(kind: NodeKind | None) -> pb.NodeKind:
    """What a status says of the node's kind (ROUTER §6; empty until it is known, when the
    status is not healthy yet)."""
    return pb.NodeKind() if kind is None else pb.NodeKind(**kind.as_json())
