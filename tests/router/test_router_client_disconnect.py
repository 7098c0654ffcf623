"""A client that goes away while its program runs on a real node (ROUTER §5, §8.8): the
router cancels the slot, and the node's tunnel must not keep the loopback connection that
still waits for the abandoned answer. Before, it put that connection back in its slot's
pool: the next request on the slot was sent behind the abandoned one and got its answer
(another identity's result), and every later request on that slot got the answer of the
one before it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from kcoral_server.node.http11 import HttpConnection
from router_helpers import Node, ready_nodes, start_router, stopping

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
