"""A node whose node token the router does not accept (a wrong one, or the old one after the
router's tokens were rotated) retries for ever; only the node's own log said why. The router
now logs one ``node_token_invalid`` WARNING per peer address a minute (ROUTER §10)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kcoral_server.node.tunnel import auth_metadata, open_channel
from kcoral_server.proto import kcoral_gateway_pb2_grpc as pb_grpc
from kcoral_server.router.log import OncePerPeer
from router_helpers import FakeNode, RouterProcess, start_router

GOOD = "the-token-of-slurm-nodes"
OLD = "the-token-before-the-rotation"


async def connect(router: RouterProcess, token: str) -> grpc.StatusCode:
    node = FakeNode(router.port, "slurm-7-gpu01", slots=1, token=token)
    channel = open_channel(router.url)
    try:
        call = pb_grpc.RouterGatewayStub(channel).ConnectSupervisor(metadata=auth_metadata(token))
        await call.write(node.status())
        await asyncio.wait_for(call.read(), 30)
        return await call.code()
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    finally:
        await channel.close()


def test_a_node_refused_for_its_token_is_named_once_in_the_router_log(tmp_path: Path) -> None:
    tokens = tmp_path / "node-tokens"
    tokens.write_text(f"slurm-* {GOOD}\n")
    tokens.chmod(0o600)
    router = start_router(tmp_path, "--node-token-file", str(tokens))
    try:
        for _ in range(3):  # the node's retries
            assert asyncio.run(connect(router, OLD)) == grpc.StatusCode.UNAUTHENTICATED
        router.lines_after_mark()  # every line of the calls above is in by now
        lines = [line for line in router.log().splitlines() if "node_token_invalid" in line]
        assert len(lines) == 1, router.log()
        assert "WARNING" in lines[0] and "peer=ipv4:127.0.0.1:" in lines[0]
        assert "--node-token-file" in lines[0] and OLD not in router.log()
    finally:
        router.stop()


def test_the_refusal_line_repeats_per_address_after_its_window() -> None:
    now = [0.0]
    due = OncePerPeer(60.0, clock=lambda: now[0]).due
    assert due("ipv4:10.0.0.1:40000") and not due("ipv4:10.0.0.1:40001")
    assert due("ipv6:%5B::1%5D:40002") and due("ipv4:10.0.0.2:40003")
    now[0] = 61.0
    assert due("ipv4:10.0.0.1:40004")
