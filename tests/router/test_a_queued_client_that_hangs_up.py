"""A client that hangs up while its request waits for a slot leaves the router's queue then,
not when a slot frees (ROUTER §7). Tornado notices a closed connection only when it reads or
writes, and a queued request does neither: the router kept it queued, then sent it to the
node the moment a slot freed and cancelled it there at once (metrics soak).

Proven by order, not timing: the slot's holder stays on it until after the second client's
departure is logged, and the node never receives a second request.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from kcoral_server.node.http11 import HttpConnection
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from router_helpers import FakeNode, in_process_router
from test_router_request_metrics import program_request

LEFT = "finish_reason=client_disconnected"


async def send(port: int) -> HttpConnection:
    """Send a whole program to ``/execute``; the open connection, its answer unread."""
    head, body = program_request()
    connection = HttpConnection("127.0.0.1", port)
    await connection.open()
    await connection.send_head("POST", "/execute", [(b"Host", b"127.0.0.1"), *head])
    await connection.send(body, chunked=False)
    return connection


def test_a_client_that_hangs_up_while_queued_leaves_the_queue_before_a_slot_frees() -> None:
    received: list[bytes] = []
    release = asyncio.Event()

    async def holds_until_released(
        head: pb.RequestHead, body: bytes
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        received.append(body)
        await release.wait()
        return 200, [], b""

    async def scenario() -> str:
        async with in_process_router() as router:
            node = FakeNode(router.grpc_port, "node-a", handler=holds_until_released)
            await node.start()
            try:
                while router.state.registry.capacity() < 1:
                    await asyncio.sleep(0.05)
                holder = await send(router.port)
                while router.state.in_progress < 1:  # the holder is on the one slot
                    await asyncio.sleep(0.02)
                queued = await send(router.port)
                while router.state.admission.waiting < 1:
                    await asyncio.sleep(0.02)
                queued.close()  # hangs up while queued
                for _ in range(400):  # the departure is logged while the slot is still held
                    if LEFT in router.lines.getvalue():
                        break
                    await asyncio.sleep(0.05)
                log = router.lines.getvalue()
                release.set()
                holder.close()
                return log
            finally:
                release.set()
                await node.close()

    log = asyncio.run(scenario())
    assert log.count(LEFT) == 1, log
    assert "http_status=499" in log, log
    assert len(received) == 1, "the queued request was sent to the node"


def test_a_bodiless_request_whose_client_hangs_up_while_queued_leaves_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``GET /v1/info`` queued for a node (none is ready yet), its client gone: one 499
    line. The router closed the connection under Tornado, which then finished the request
    and logged an uncaught ``InvalidStateError`` (found by a ``kcoral run`` soak)."""

    async def scenario() -> str:
        async with in_process_router() as router:
            connection = HttpConnection("127.0.0.1", router.port)
            await connection.open()
            await connection.send_head("GET", "/v1/info", [(b"Host", b"127.0.0.1")])
            while router.state.control.waiting < 1:  # queued: no node is ready
                await asyncio.sleep(0.02)
            connection.close()
            for _ in range(400):
                if LEFT in router.lines.getvalue():
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # what Tornado does with the request afterwards
            return router.lines.getvalue()

    with caplog.at_level(logging.ERROR):
        log = asyncio.run(scenario())
    assert log.count(LEFT) == 1 and "http_status=499" in log, log
    uncaught = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not uncaught, [r.getMessage() for r in uncaught]
