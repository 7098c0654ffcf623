"""What a router counts of requests that ended without a node's answer (ROUTER §10,
EXTENSIONS §13), with a real router in this process and a fake node whose one slot runs a
program longer than anyone waits.

* A client that went away before any answer: its line and ``kcoral_router_requests_total``
  say 499, as the server's ``request_finished`` does (SERVER §13). Before, they said 200
  (Tornado's default status, never sent): a dashboard read "200 client_disconnected" next
  to the node's own "499 client_disconnected" for the same request.
* A request that waited the whole queue wait in vain (503 ``queue_timeout``) is observed in
  ``kcoral_router_queue_wait_seconds``. Before, only requests that got a node were: under
  overload the queue-wait quantiles left out exactly the longest waits.
* So is one whose client left while it waited; its line said ``queue_wait_ms=0.0``."""

from __future__ import annotations

import asyncio
import io
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from kcoral_server.metrics.router_metrics import RouterMetrics
from kcoral_server.node.http11 import HttpConnection
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.router.http_app import RouterState
from router_helpers import FakeNode, in_process_router

import kcoral


async def never_answers(
    head: pb.RequestHead, body: bytes
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """A node whose program runs longer than its client waits."""
    await asyncio.sleep(60)
    return 200, [], b""


@dataclass
class Router:
    port: int
    state: RouterState
    lines: io.StringIO

    def exposition(self) -> str:
        return self.state.metrics.exposition().decode()

    async def lines_with(self, text: str, count: int) -> str:
        for _ in range(200):
            if self.lines.getvalue().count(text) >= count:
                break
            await asyncio.sleep(0.05)
        return self.lines.getvalue()


@asynccontextmanager
async def router_with_one_busy_slot(*args: str) -> AsyncIterator[Router]:
    async with in_process_router(*args) as router:
        node = FakeNode(router.grpc_port, "node-a", handler=never_answers)
        await node.start()
        try:
            while router.state.registry.capacity() < 1:
                await asyncio.sleep(0.05)
            yield Router(router.port, router.state, router.lines)
        finally:
            await node.close()


def program_request() -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The head and body ``kcoral.Client`` sends for a small program."""
    program = kcoral.Program()
    module = program.upload(kind="module", source="def one():\n    return 1\n")
    one = program.get_function(module=module, name="one")
    program.return_(key="one", value=program.run(fn=one))
    with kcoral.Client("http://127.0.0.1:1") as client:
        flow = client.execute_flow(program, timeout_seconds=30)
        request = next(flow)
        flow.close()
    head = [(n.encode(), v.encode()) for n, v in request.headers.items()]
    head.append((b"Content-Length", str(request.length).encode()))
    return head, request.body()


async def send(port: int, *, leave_after: float | None = None, delay: float = 0.0) -> int:
    """Send a program to ``/execute`` after ``delay`` s; leave ``leave_after`` s later
    without reading the answer (0 returned), or read the answer's status."""
    await asyncio.sleep(delay)
    head, body = program_request()
    connection = HttpConnection("127.0.0.1", port)
    await connection.open()
    try:
        await connection.send_head("POST", "/execute", [(b"Host", b"127.0.0.1"), *head])
        await connection.send(body, chunked=False)
        if leave_after is not None:
            await asyncio.sleep(leave_after)
            return 0
        status, _ = await connection.read_head()
        return status
    finally:
        connection.close()


def test_a_client_that_leaves_before_any_answer_is_counted_499_not_200() -> None:
    async def scenario() -> tuple[str, str]:
        async with router_with_one_busy_slot() as router:
            # The first holds the node's one slot while the second waits in the queue (the
            # router notices that one left while it waits, within HANG_UP_CHECK_SECONDS).
            await asyncio.gather(
                send(router.port, leave_after=1.0),
                send(router.port, leave_after=0.3, delay=0.3),
            )
            log = await router.lines_with("finish_reason=client_disconnected", 2)
            return log, router.exposition()

    log, exposition = asyncio.run(scenario())
    statuses = re.findall(r"http_status=(\d+) .*finish_reason=client_disconnected", log)
    assert statuses == ["499", "499"], log
    assert (
        'kcoral_router_requests_total{reason="client_disconnected",status="499"} 2.0' in exposition
    ), exposition


def test_a_request_that_waited_the_whole_queue_wait_in_vain_is_in_the_queue_wait_histogram() -> (
    None
):
    async def scenario() -> tuple[int, str, str]:
        async with router_with_one_busy_slot("--queue-wait-timeout-seconds", "0.5") as router:
            holder = asyncio.ensure_future(send(router.port, leave_after=1.5))
            # the holder on the node's one slot first, however slow this machine is (a
            # fixed head start let the second take the slot on a loaded one)
            while router.state.in_progress < 1:
                await asyncio.sleep(0.02)
            status = await send(router.port)  # the slot is held: it waits 0.5 s
            await holder
            log = await router.lines_with("finish_reason=client_disconnected", 1)
            return status, log, router.exposition()

    status, log, exposition = asyncio.run(scenario())
    assert status == 503, log
    assert "finish_reason=queue_timeout" in log, log
    # the holder's wait (it found the slot free) and the one that waited in vain
    assert "kcoral_router_queue_wait_seconds_count 2.0" in exposition, exposition
    # the second waited at least the configured 0.5 s: not in the 0.25 s bucket
    assert 'kcoral_router_queue_wait_seconds_bucket{le="0.25"} 1.0' in exposition, exposition
    # never a node's: the per-node and per-kind histograms count routed requests only
    assert 'kcoral_router_node_queue_wait_seconds_count{node="node-a"} 1.0' in exposition


def test_a_client_that_left_while_queued_is_in_the_queue_wait_histogram() -> None:
    """A client that gave up while its request waited for a node waited too: left out, the
    router's queue-wait quantiles missed the waits of an overload whose clients leave
    before the router's queue wait ends (a server counts them, EXTENSIONS §13)."""

    async def scenario() -> tuple[str, str]:
        async with router_with_one_busy_slot() as router:
            holder = asyncio.ensure_future(send(router.port, leave_after=1.5))
            while router.state.in_progress < 1:  # the holder on the node's one slot first
                await asyncio.sleep(0.02)
            await send(router.port, leave_after=0.5)  # queued, then gone
            await holder
            log = await router.lines_with("finish_reason=client_disconnected", 2)
            return log, router.exposition()

    log, exposition = asyncio.run(scenario())
    assert log.count("finish_reason=client_disconnected") == 2, log
    # the holder's wait (it found the slot free) and the one that left while queued
    assert "kcoral_router_queue_wait_seconds_count 2.0" in exposition, exposition
    # never a node's: the per-node histogram counts routed requests only
    assert 'kcoral_router_node_queue_wait_seconds_count{node="node-a"} 1.0' in exposition


def queue_waits_counted(reason: str, queue_wait_ms: float) -> str:
    """The queue-wait histogram's count after one request that got no node."""
    metrics = RouterMetrics()
    fields = {"finish_reason": reason, "http_status": 503, "queue_wait_ms": queue_wait_ms}
    metrics.record("request_finished", {**fields, "duration_ms": 0.1, "node": None})
    text = metrics.exposition().decode()
    return re.findall(r"^kcoral_router_queue_wait_seconds_count (\S+)$", text, re.MULTILINE)[0]


def test_a_queue_wait_of_0_s_that_ended_is_in_the_queue_wait_histogram() -> None:
    """With ``--queue-wait-timeout-seconds 0`` a request that finds no free node ends at
    once (503 ``queue_timeout``), its line ``queue_wait_ms=0.0`` where it took under 0.05 ms:
    a wait of 0 s is a wait. Read as "never queued", it was left out. A request whose
    client left before it queued (``client_disconnected`` at 0.0) never waited."""
    assert queue_waits_counted("queue_timeout", 0.0) == "1.0"
    assert queue_waits_counted("client_disconnected", 0.0) == "0.0"
    assert queue_waits_counted("client_disconnected", 0.3) == "1.0"
