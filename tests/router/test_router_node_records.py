"""What a node-token holder can make the router keep, against a real router (ROUTER §4.3,
§6): a status's instance ids, slot key, ``target`` and ``versions`` are bounded (a status
over the bounds ends its stream ``INVALID_ARGUMENT``), and short streams under ever new
node ids leave at most ``MAX_RETAINED_NODES`` records of disconnected nodes, the oldest
forgotten first, while connected nodes and a node that comes back are served as before."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import grpc
import pytest
from kcoral_server.node.tunnel import auth_metadata, open_channel
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.proto import kcoral_gateway_pb2_grpc as pb_grpc
from kcoral_server.router.nodes.registry import MAX_RETAINED_NODES
from prometheus_client.parser import text_string_to_metric_families
from router_helpers import (
    FakeNode,
    RouterProcess,
    http_request,
    start_router,
    stream_status,
    wait_for_health,
)

TOKEN = "node-token"


def healthy_status(node_id: str, gpu: str = "") -> pb.SupervisorStatus:
    status = pb.SupervisorStatus(
        node_id=node_id,
        server_healthy=True,
        supervisor_instance_id=str(uuid.uuid4()),
        server_instance_id=str(uuid.uuid4()),
        worker_count=1,
        health_age_millis=1,
        slot_key="k" * 43,
    )
    status.kind.gpu = gpu
    return status


def oversized(field: str) -> pb.SupervisorStatus:
    status = healthy_status("big")
    if field == "target entries":
        status.target.update({f"k{i}": "v" for i in range(33)})
    elif field == "versions value":
        status.versions["torch"] = "9" * 257
    elif field == "versions key":
        status.versions["k" * 65] = "1"
    elif field == "server instance id":
        status.server_instance_id = "i" * 129
    elif field == "slot key":
        status.slot_key = "k" * 129
    return status


@pytest.mark.parametrize(
    "field",
    ["target entries", "versions value", "versions key", "server instance id", "slot key"],
)
def test_a_status_over_the_bounds_ends_its_stream_invalid(router: RouterProcess, field: str):
    async def attempt() -> tuple[grpc.StatusCode | None, str]:
        channel = open_channel(router.url)
        try:
            call = pb_grpc.RouterGatewayStub(channel).ConnectSupervisor(
                metadata=auth_metadata(None)
            )
            await call.write(oversized(field))
            try:
                await asyncio.wait_for(call.read(), 30)
            except grpc.aio.AioRpcError as exc:
                return exc.code(), exc.details() or ""
            return await call.code(), ""
        finally:
            await channel.close()

    assert asyncio.run(stream_status(attempt)) is grpc.StatusCode.INVALID_ARGUMENT


def test_a_slot_hello_with_an_overlong_slot_id_is_refused(router: RouterProcess):
    async def attempt() -> tuple[grpc.StatusCode | None, str]:
        channel = open_channel(router.url)
        try:
            call = pb_grpc.RouterGatewayStub(channel).ConnectSlot(metadata=auth_metadata(None))
            hello = pb.SlotHello(
                node_id="n1", server_instance_id="i", slot_id="s" * 129, protocol_version=1
            )
            await call.write(pb.SlotFrame(hello=hello))
            try:
                await asyncio.wait_for(call.read(), 30)
            except grpc.aio.AioRpcError as exc:
                return exc.code(), exc.details() or ""
            return await call.code(), ""
        finally:
            await channel.close()

    assert asyncio.run(stream_status(attempt)) is grpc.StatusCode.INVALID_ARGUMENT


def junk_records(port: int) -> float:
    """How many node records of kind ``junk`` the router holds, by its own gauge."""
    text = asyncio.run(http_request(port, "GET", "/metrics")).body.decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "kcoral_router_kind_nodes" and sample.labels.get("kind") == "junk"
    )


@pytest.mark.slow
def test_short_streams_under_ever_new_node_ids_leave_a_bounded_number_of_records(
    tmp_path: Path,
):
    router = start_router(tmp_path, "--node-token", TOKEN, "--status-check-interval-seconds", "0.2")
    flood = MAX_RETAINED_NODES + 100

    async def short_stream(stub: pb_grpc.RouterGatewayStub, node_id: str) -> None:
        call = stub.ConnectSupervisor(metadata=auth_metadata(TOKEN))
        await call.write(healthy_status(node_id, gpu="junk"))
        assert (await asyncio.wait_for(call.read(), 60)) is not grpc.aio.EOF
        call.cancel()

    async def scenario() -> None:
        honest = FakeNode(router.port, "honest", token=TOKEN)
        away = FakeNode(router.port, "away", token=TOKEN)
        await honest.start()
        await away.start()
        await wait_for_health(router.port, lambda b: b["load"]["request_capacity"] >= 2)
        await away.close()  # a node that leaves: the oldest disconnected record
        channel = open_channel(router.url)
        stub = pb_grpc.RouterGatewayStub(channel)
        for start in range(0, flood, 50):
            ids = [f"junk-{i}" for i in range(start, min(start + 50, flood))]
            await asyncio.gather(*(short_stream(stub, node_id) for node_id in ids))
        await channel.close()
        # the connected node was never touched, and serves
        executed = await http_request(router.port, "POST", "/execute", b"x")
        assert executed.status == 200 and executed.header("X-KCoral-Node") == "honest"
        # the node that left, whose record went first, is taken back as a new one
        back = FakeNode(router.port, "away", token=TOKEN)
        await back.start()
        await wait_for_health(router.port, lambda b: b["load"]["request_capacity"] >= 2)
        answer = await http_request(
            router.port, "POST", "/execute", b"y", [("X-KCoral-Node", "away")]
        )
        assert answer.status == 200
        await back.close()
        await honest.close()

    try:
        asyncio.run(scenario())
        deadline = time.monotonic() + 60
        while junk_records(router.port) > MAX_RETAINED_NODES and time.monotonic() < deadline:
            time.sleep(0.2)  # streams that ended last are counted at the next check
        assert junk_records(router.port) <= MAX_RETAINED_NODES
        assert "Traceback" not in router.log()
    finally:
        router.stop()
