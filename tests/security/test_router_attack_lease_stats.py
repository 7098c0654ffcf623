"""A rogue node cannot bend the fleet's numbers (ROUTER §6): lease stats that are not
finite or out of bounds end its supervisor stream with ``INVALID_ARGUMENT`` at a real router,
and ``/v1/info``'s ``fleet_status`` keeps the honest node's numbers."""

from __future__ import annotations

import asyncio
import json
import math
import sys
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from kcoral_server.node.tunnel import auth_metadata, open_channel
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.proto import kcoral_gateway_pb2_grpc as pb_grpc
from router_helpers import FakeNode, http_request, start_router, wait_for_health


async def info_handler(
    head: pb.RequestHead, body: bytes
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """A node's /v1/info (the only request this test sends)."""
    info = {"kcoral": "9.9.9", "protocol": 1, "features": ["jobs"], "device": "cpu"}
    return 200, [(b"content-type", b"application/json")], json.dumps(info).encode()


def test_a_node_reporting_non_finite_lease_stats_is_refused_and_moves_no_estimate(
    tmp_path: Path,
) -> None:
    router = start_router(tmp_path)

    async def scenario() -> None:
        honest = FakeNode(router.port, "honest", control_slots=1, handler=info_handler)
        await honest.start()
        await wait_for_health(router.port, lambda b: b["load"]["request_capacity"] >= 1)
        channel = open_channel(f"http://127.0.0.1:{router.port}")
        try:
            for stats in (
                pb.LeaseStats(count=5, seat_held_mean_ms=math.nan),
                pb.LeaseStats(count=5, seat_held_mean_ms=-1e9),
                pb.LeaseStats(count=5, seat_held_mean_ms=1e300),
                pb.LeaseStats(count=2**31, queued=2**60),
            ):
                rogue = FakeNode(router.port, "rogue")
                message = rogue.status()
                message.lease_stats.CopyFrom(stats)
                call = pb_grpc.RouterGatewayStub(channel).ConnectSupervisor(
                    metadata=auth_metadata(None)
                )
                await call.write(message)
                try:
                    await asyncio.wait_for(call.read(), 5)
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
                    assert "lease_stats" in (exc.details() or "")
                else:
                    raise AssertionError(f"the router acked {stats}")
            info = await http_request(router.port, "GET", "/v1/info")
            rows = info.json()["fleet_status"]["kinds"]
            assert [(r["nodes"], r["queued"], r["estimated_wait_seconds"]) for r in rows] == [
                (1, 0, None)
            ]
        finally:
            await channel.close()
            await honest.close()

    try:
        asyncio.run(scenario())
    finally:
        router.stop()
