"""Clients that go away (ROUTER §5, §8.8). While its program runs on a real node: the
router cancels the slot, and the node's tunnel must not keep the loopback connection that
still waits for the abandoned answer. Before, it put that connection back in its slot's
pool: the next request on the slot was sent behind the abandoned one and got its answer
(another identity's result), and every later request on that slot got the answer of the
one before it. Before its body is whole: the router keeps nothing of the request."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from kcoral_server.node.http11 import HttpConnection
from router_helpers import FakeNode, Node, in_process_router, ready_nodes, start_router, stopping

import kcoral

pytestmark = pytest.mark.slow
ALICE, BOB = "alice-disconnect-token", "bob-disconnect-token"
NODES_ENV = {"KCORAL_NODE_TOKEN": "disconnect-node-token"}

MODULE = """
import time

def nap(seconds):
    time.sleep(seconds)
    return "slept"

def echo(value):
    return value
"""


def call(name: str, *args: object) -> kcoral.Program:
    program = kcoral.Program()
    module = program.upload(kind="module", source=MODULE)
    fn = program.get_function(module=module, name=name)
    program.return_(key="out", value=program.run(fn=fn, args=list(args)))
    return program


async def send_and_leave(port: int, token: str, program: kcoral.Program, after: float) -> None:
    """Send ``program`` to ``/execute`` as the client would, then close the connection
    ``after`` seconds later without reading the answer."""
    with kcoral.Client(f"http://127.0.0.1:{port}") as client:
        flow = client.execute_flow(program, timeout_seconds=30)
        request = next(flow)
        flow.close()
    connection = HttpConnection("127.0.0.1", port)
    await connection.open()
    try:
        head = [
            (b"Host", f"127.0.0.1:{port}".encode()),
            (b"Authorization", f"Bearer {token}".encode()),
        ]
        head += [(n.encode(), v.encode()) for n, v in request.headers.items()]
        head.append((b"Content-Length", str(request.length).encode()))
        await connection.send_head("POST", "/execute", head)
        await connection.send(request.body(), chunked=False)
        await asyncio.sleep(after)
    finally:
        connection.close()


def test_the_request_after_a_client_went_away_gets_its_own_answer_not_the_abandoned_one(
    tmp_path: Path,
):
    token_file = tmp_path / "client-tokens"
    token_file.write_text(f"alice {ALICE}\nbob {BOB}\n")
    token_file.chmod(0o600)
    router = start_router(
        tmp_path,
        "--status-check-interval-seconds",
        "0.3",
        "--auth-token-file",
        str(token_file),
        env=NODES_ENV,
    )
    # One CPU worker: the node opens one worker slot, so every /execute uses its pool.
    node = Node(tmp_path, router, "only", NODES_ENV)
    with stopping(router, [node]):
        ready_nodes(router, 1)
        # Alice's program is on the node when she leaves; it would run 3 s more.
        asyncio.run(send_and_leave(router.port, ALICE, call("nap", 3.0), after=1.0))
        router.wait_log("finish_reason=client_disconnected")
        time.sleep(0.5)  # the node reopens the cancelled slot
        with kcoral.Client(router.url, token=BOB) as client:
            for value in ("first", "second"):
                result = client.execute(call("echo", value), timeout_seconds=30)
                assert result.status == "COMPLETED"
                assert result["out"] == value, f"bob got another request's answer: {result!r}"
    # The node saw its client (the tunnel) go away too and cancelled the program (EXTENSIONS
    # §9); before, the connection stayed open and the program ran its whole 3 s.
    finished = [
        line
        for line in node.log_path.read_text().splitlines()
        if "request_finished" in line and "elapsed_ms=" in line
    ]
    assert "finish_reason=client_disconnected" in finished[0], finished


def test_a_client_that_leaves_before_its_body_is_whole_leaves_no_request_task_behind() -> None:
    """A router in this process with a fake node: each client sends part of its body, which
    the router streams to the node, and goes away. The handler's task waited for the rest
    of the body for ever (the router's ``on_connection_close`` did not end Tornado's wait
    for it): one task, handler and request kept per such client, without bound (a soak's
    router went from 8 to 34 of them in 12 minutes)."""

    async def scenario() -> list[asyncio.Task[object]]:
        async with in_process_router() as router:
            state, grpc_port, port = router.state, router.grpc_port, router.port
            node = FakeNode(grpc_port, "node-a")
            await node.start()
            try:
                while state.registry.capacity() < 1:
                    await asyncio.sleep(0.05)
                for _ in range(5):
                    _reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.write(
                        b"POST /execute HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        b"Content-Length: 100\r\n\r\n0123456789"
                    )
                    await writer.drain()
                    await asyncio.sleep(0.2)  # on the node's slot, the rest of its body awaited
                    writer.close()
                await asyncio.sleep(0.5)
                return [
                    task
                    for task in asyncio.all_tasks()
                    if "RequestHandler._execute" in repr(task.get_coro())
                ]
            finally:
                await node.close()

    assert asyncio.run(scenario()) == []
