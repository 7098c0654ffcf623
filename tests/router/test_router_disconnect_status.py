"""The status a router writes for a client that went away before any answer (ROUTER §10,
EXTENSIONS §13). Nothing was answered, so the line and ``kcoral_router_requests_total`` say
499, as the server's ``request_finished`` does (SERVER §13). Before, they said 200 (Tornado's
default status, never sent): an operator's dashboard read "200 client_disconnected" next to
the node's own "499 client_disconnected" for the same request."""

from __future__ import annotations

import asyncio
import io
import re

import grpc
import tornado.httpserver
import tornado.netutil
from kcoral_server.node.http11 import HttpConnection
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.router.gateway import Gateway, add_gateway_to_server
from kcoral_server.router.http_app import make_app
from kcoral_server.router.log import RouterLog
from kcoral_server.router.main import GRPC_OPTIONS, build_state, end_calls
from kcoral_server.router.settings import parse_router_args
from router_helpers import FakeNode

import kcoral


async def never_answers(
    head: pb.RequestHead, body: bytes
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """A node whose program runs longer than its client waits."""
    await asyncio.sleep(60)
    return 200, [], b""


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


async def send_and_leave(port: int, after: float) -> None:
    head, body = program_request()
    connection = HttpConnection("127.0.0.1", port)
    await connection.open()
    try:
        await connection.send_head("POST", "/execute", [(b"Host", b"127.0.0.1"), *head])
        await connection.send(body, chunked=False)
        await asyncio.sleep(after)
    finally:
        connection.close()


async def queued_then_leave(port: int) -> None:
    await asyncio.sleep(0.3)
    await send_and_leave(port, after=0.3)


def test_a_client_that_leaves_before_any_answer_is_counted_499_not_200() -> None:
    async def scenario() -> tuple[str, str]:
        settings = parse_router_args(["--port", "0"])
        lines = io.StringIO()
        state = build_state(settings, RouterLog(lines))
        grpc_server = grpc.aio.server(options=GRPC_OPTIONS)
        gateway = Gateway(state.registry, settings, state.log, on_status=state.metrics.node_status)
        add_gateway_to_server(gateway, grpc_server)
        grpc_port = grpc_server.add_insecure_port("127.0.0.1:0")
        await grpc_server.start()
        server = tornado.httpserver.HTTPServer(make_app(state), max_body_size=1 << 62)
        sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
        server.add_sockets(sockets)
        port = sockets[0].getsockname()[1]
        node = FakeNode(grpc_port, "node-a", handler=never_answers)
        await node.start()
        try:
            while state.registry.capacity() < 1:
                await asyncio.sleep(0.05)
            # The first holds the node's one slot while the second waits in the queue (the
            # router notices that one left when the slot frees: it reads no more of it).
            await asyncio.gather(send_and_leave(port, after=1.0), queued_then_leave(port))
            for _ in range(100):
                if lines.getvalue().count("finish_reason=client_disconnected") == 2:
                    break
                await asyncio.sleep(0.05)
            return lines.getvalue(), state.metrics.exposition().decode()
        finally:
            await node.close()
            server.stop()
            end_calls(state.registry)
            await grpc_server.stop(0)

    log, exposition = asyncio.run(scenario())
    statuses = re.findall(r"http_status=(\d+) .*finish_reason=client_disconnected", log)
    assert statuses == ["499", "499"], log
    assert (
        'kcoral_router_requests_total{reason="client_disconnected",status="499"} 2.0' in exposition
    ), exposition
