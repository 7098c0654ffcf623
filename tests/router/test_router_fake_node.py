"""A real router process with in-process fake nodes speaking the gateway protocol."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import uuid
from pathlib import Path

import grpc
import pytest
from kcoral_server.node.tunnel import auth_metadata, open_channel
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.proto import kcoral_gateway_pb2_grpc as pb_grpc
from kcoral_server.router.nodes.registry import SERVER_STOPPED
from router_helpers import (
    FakeNode,
    Response,
    RouterProcess,
    http_request,
    start_router,
    stream_status,
    wait_for_health,
)

from kcoral import Client, KCoralError


def ready(n: int):
    return lambda body: body["load"]["request_capacity"] >= n


def test_a_request_reaches_a_node_with_a_fresh_id_and_filtered_headers(router: RouterProcess):
    async def scenario() -> None:
        node = FakeNode(router.port, "node-a")
        await node.start()
        await wait_for_health(router.port, ready(1))
        client_id = str(uuid.uuid4())
        response = await http_request(
            router.port,
            "POST",
            "/execute",
            b"hello body",
            [
                ("X-Request-ID", client_id),
                ("X-KCoral-Node", "node-a"),
                ("Connection", "keep-alive, X-Secret"),
                ("X-Secret", "dropped"),
                ("X-Keep", "one"),
                ("X-Keep", "two"),
                ("Content-Type", "multipart/form-data; boundary=b"),
            ],
        )
        await node.close()
        assert response.status == 200
        assert response.body == b"hello body"
        request_id = response.header("X-Request-ID")
        assert request_id != client_id and str(uuid.UUID(request_id)) == request_id
        assert uuid.UUID(request_id).version == 4
        assert response.header("X-KCoral-Node") == "node-a"
        assert response.header("Content-Length") is None
        headers = [[h.name.decode().lower(), h.value.decode()] for h in node.heads[-1].headers]
        names = [n.lower() for n, _ in headers]
        assert ["x-keep", "one"] in headers and ["x-keep", "two"] in headers
        assert ["x-request-id", request_id] in headers
        assert ["content-length", "10"] in headers
        for dropped in ("connection", "x-secret", "host", "x-kcoral-node"):
            assert dropped not in names
        assert names.count("x-request-id") == 1
        assert node.requests == [request_id]

    asyncio.run(scenario())
    assert "finish_reason=completed" in router.wait_log("finish_reason=completed")


def test_a_client_asking_a_router_without_nodes_reads_why_rather_than_http_503(
    router: RouterProcess,
) -> None:
    # A router's 503 health body is no ERROR body: the client's message was "HTTP 503", and
    # a notebook cell said "answered HTTP 503: HTTP 503", as for a proxy's page.
    with Client(router.url) as client, pytest.raises(KCoralError) as caught:
        client.health()
    assert caught.value.status_code == 503
    assert str(caught.value) == (
        "HTTP 503: unavailable: no ready node of the router's default kind has connected slots"
    )
    assert not caught.value.without_error_body


def test_health_reports_unavailable_without_nodes_and_ok_with_one(router: RouterProcess):
    async def scenario() -> None:
        empty = await http_request(router.port, "GET", "/health")
        assert empty.status == 503 and empty.header("Retry-After") is None
        body = empty.json()
        assert set(body) == {
            "status",
            "instance_id",
            "started_at",
            "gpu_count",
            "load",
            "target",
            "versions",
        }
        assert body["status"] == "unavailable" and body["gpu_count"] is None
        assert body["target"] == {} and body["versions"] == {}
        assert len(body["started_at"]) == len("2026-01-05T09:30:00.123456Z")
        node = FakeNode(router.port, "n1", slots=2, versions={"torch": "x"})
        await node.start()
        body = await wait_for_health(router.port, ready(2))
        assert body["status"] == "ok" and body["versions"] == {"torch": "x"}
        assert body["load"] == {
            "request_capacity": 2,
            "requests_in_progress": 0,
            "requests_waiting": 0,
        }
        # No entity tags: a conditional GET still gets the whole answer, never a 304.
        conditional = await http_request(
            router.port, "GET", "/health", headers=[("If-None-Match", "*")]
        )
        assert conditional.status == 200 and conditional.header("Etag") is None
        assert conditional.json()["status"] == "ok"
        other = await http_request(router.port, "GET", "/v2/whatever")
        assert other.status == 404
        await node.close()

    asyncio.run(scenario())


def test_requests_spread_over_two_nodes_and_affinity_wins(router: RouterProcess):
    async def scenario() -> None:
        nodes = [FakeNode(router.port, "a", slots=2), FakeNode(router.port, "b", slots=2)]
        for node in nodes:
            await node.start()
        await wait_for_health(router.port, ready(4))
        seen = set()
        for _ in range(12):
            response = await http_request(router.port, "POST", "/execute", b"x")
            seen.add(response.header("X-KCoral-Node"))
        assert seen == {"a", "b"}
        for _ in range(5):
            response = await http_request(
                router.port, "POST", "/execute", b"x", [("X-KCoral-Node", "b")]
            )
            assert response.header("X-KCoral-Node") == "b"
        # Unknown or invalid names are ignored.
        for name in ("zz", "-bad"):
            response = await http_request(
                router.port, "POST", "/execute", b"x", [("X-KCoral-Node", name)]
            )
            assert response.status == 200
        for node in nodes:
            await node.close()

    asyncio.run(scenario())


def test_declared_length_over_the_limit_is_413_and_bad_length_is_400(tmp_path: Path):
    router = start_router(tmp_path, "--max-request-bytes", "100")
    try:

        async def scenario() -> None:
            big = await http_request(router.port, "POST", "/execute", b"x" * 101)
            assert big.status == 413
            body = big.json()
            assert body["error"] == {
                "kind": "request_too_large",
                # ROUTER §8's text, then the sizes and the flag (EXTENSIONS §10)
                "message": "request body is too large: 101 bytes, limit 100 bytes "
                "(kcoral router --max-request-bytes)",
            }
            assert body["request_id"] == big.header("X-Request-ID")
            bad = await http_request(
                router.port, "POST", "/execute", b"", [("Content-Length", "1, 2")]
            )
            assert bad.status == 400
            assert bad.json()["error"] == {
                "kind": "invalid_request",
                "message": "invalid Content-Length",
            }

        asyncio.run(scenario())
    finally:
        router.stop()


def test_a_chunked_body_over_the_limit_is_rejected_while_streaming(tmp_path: Path):
    router = start_router(tmp_path, "--max-request-bytes", "300000")

    async def scenario() -> None:
        node = FakeNode(router.port, "n")
        await node.start()
        await wait_for_health(router.port, ready(1))
        fine = await http_request(router.port, "POST", "/execute", chunks=[b"a" * 1000, b"b"])
        assert fine.status == 200 and fine.body == b"a" * 1000 + b"b"
        too_big = await http_request(
            router.port, "POST", "/execute", chunks=[b"a" * 200000, b"b" * 200000]
        )
        assert too_big.status == 413
        assert too_big.json()["error"] == {
            "kind": "request_too_large",
            "message": "request body is too large: over the limit of 300000 bytes "
            "(kcoral router --max-request-bytes)",
        }
        await wait_for_health(router.port, ready(1))
        # The 413 leaves before the cancel reaches the node (it follows any frame in flight).
        for _ in range(100):
            if node.cancels:
                break
            await asyncio.sleep(0.05)
        assert node.cancels == ["request_rejected"]
        await node.close()

    try:
        asyncio.run(scenario())
    finally:
        router.stop()


def test_no_node_waits_then_503_no_node_and_a_full_queue_is_router_busy(tmp_path: Path):
    router = start_router(
        tmp_path, "--queue-wait-timeout-seconds", "0.3", "--max-queued-requests", "1"
    )

    async def scenario() -> None:
        waiting = asyncio.ensure_future(http_request(router.port, "POST", "/execute", b"x"))
        await asyncio.sleep(0.1)
        busy = await http_request(router.port, "POST", "/execute", b"x")
        assert busy.status == 503 and busy.header("Retry-After") == "1"
        assert busy.json()["error"] == {"kind": "router_busy", "message": "router queue is full"}
        no_node = await waiting
        assert no_node.status == 503 and no_node.header("Retry-After") == "1"
        assert no_node.json()["error"] == {
            "kind": "no_node",
            "message": "no compatible node has an available slot",
        }

    try:
        asyncio.run(scenario())
    finally:
        router.stop()
    assert "finish_reason=queue_full" in router.wait_log("finish_reason=queue_full")
    log = router.wait_log("finish_reason=queue_timeout").splitlines()
    [timed_out] = [line for line in log if "finish_reason=queue_timeout" in line]
    # it says how long it waited (the queue wait), where it said 0.0
    assert float(timed_out.split("queue_wait_ms=")[1].split()[0]) >= 300


def test_a_queued_request_is_served_when_a_node_arrives(router: RouterProcess):
    async def scenario() -> None:
        waiting = asyncio.ensure_future(http_request(router.port, "POST", "/execute", b"late"))
        await wait_for_health(router.port, lambda b: b["load"]["requests_waiting"] == 1)
        node = FakeNode(router.port, "n")
        await node.start()
        response = await waiting
        assert response.status == 200 and response.body == b"late"
        await node.close()

    asyncio.run(scenario())


def test_a_node_that_drops_the_slot_mid_request_yields_502_and_no_replay(router: RouterProcess):
    async def scenario() -> None:
        node = FakeNode(router.port, "n", slots=1)

        async def die(head, body):
            raise grpc.RpcError()  # ends the fake slot's serve loop without replying

        node.handler = die
        await node.start()
        await wait_for_health(router.port, ready(1))
        response_future = asyncio.ensure_future(http_request(router.port, "POST", "/execute", b"x"))
        await asyncio.sleep(0.3)
        # Kill the node's streams (like a crashed server).
        await node.channel.close()
        response = await response_future
        assert response.status == 502
        assert response.json()["error"]["kind"] == "server_transport"
        assert "not retried" in response.json()["error"]["message"]
        assert len(node.requests) == 1

    asyncio.run(scenario())
    assert "finish_reason=tunnel_disconnected" in router.wait_log(
        "finish_reason=tunnel_disconnected"
    )


def test_client_disconnect_cancels_the_slot_and_frees_capacity(router: RouterProcess):
    async def scenario() -> None:
        node = FakeNode(router.port, "n", slots=1)
        release = asyncio.Event()

        async def slow(head, body):
            if body == b"x":
                await release.wait()
            return 200, [], body

        node.handler = slow
        await node.start()
        await wait_for_health(router.port, ready(1))
        request = asyncio.ensure_future(http_request(router.port, "POST", "/execute", b"x"))
        await wait_for_health(router.port, lambda b: b["load"]["requests_in_progress"] == 1)
        request.cancel()
        await asyncio.gather(request, return_exceptions=True)
        await wait_for_health(router.port, lambda b: b["load"]["requests_in_progress"] == 0)
        for _ in range(100):
            if node.cancels:
                break
            await asyncio.sleep(0.05)
        assert node.cancels == ["client_disconnected"]
        # The node replaced the cancelled slot: the router has capacity again.
        body = await wait_for_health(router.port, ready(1))
        assert body["status"] == "ok"
        response = await http_request(router.port, "POST", "/execute", b"again")
        assert response.status == 200
        release.set()
        await node.close()

    asyncio.run(scenario())
    assert "finish_reason=client_disconnected" in router.wait_log(
        "finish_reason=client_disconnected"
    )


def test_node_token_is_required_when_configured(tmp_path: Path):
    router = start_router(tmp_path, env={"KCORAL_NODE_TOKEN": "s3cret"})

    async def once(token: str | None) -> tuple[grpc.StatusCode | None, str]:
        channel = open_channel(router.url)
        stub = pb_grpc.RouterGatewayStub(channel)
        call = stub.ConnectSupervisor(metadata=auth_metadata(token))
        try:
            await call.write(FakeNode(router.port, "n").status())
            await call.read()
            return None, ""
        except grpc.RpcError:
            # The router's status, not the write's: a write racing the router's abort can
            # fail on the client side with another code (``stream_status``).
            return await call.code(), await call.details() or ""
        finally:
            call.cancel()
            await channel.close()

    async def attempt(token: str | None) -> grpc.StatusCode | None:
        return await stream_status(lambda: once(token))

    async def scenario() -> None:
        assert await attempt(None) == grpc.StatusCode.UNAUTHENTICATED
        assert await attempt("wrong") == grpc.StatusCode.UNAUTHENTICATED
        assert await attempt("s3cret") is None

    try:
        asyncio.run(scenario())
    finally:
        router.stop()


def test_a_node_with_other_versions_is_incompatible_and_gets_no_work(router: RouterProcess):
    async def scenario() -> None:
        first = FakeNode(router.port, "first", versions={"torch": "1"})
        await first.start()
        await wait_for_health(router.port, ready(1))
        odd = FakeNode(router.port, "odd", versions={"torch": "2"})
        await odd.start()
        await asyncio.sleep(0.5)
        body = await wait_for_health(router.port, ready(1))
        assert body["load"]["request_capacity"] == 1
        for _ in range(4):
            response = await http_request(
                router.port, "POST", "/execute", b"x", [("X-KCoral-Node", "odd")]
            )
            assert response.header("X-KCoral-Node") == "first"
        assert odd.requests == []
        await first.close()
        await odd.close()

    asyncio.run(scenario())


def test_invalid_hello_and_duplicate_slot_ids_are_refused(router: RouterProcess):
    async def code_for(hello: pb.SlotHello, *, request_id: str = "") -> grpc.StatusCode | None:
        channel = open_channel(router.url)
        call = pb_grpc.RouterGatewayStub(channel).ConnectSlot()
        try:
            await call.write(pb.SlotFrame(request_id=request_id, hello=hello))
            frame = await call.read()
            return None if frame.WhichOneof("payload") == "ack" else frame
        except grpc.RpcError as exc:
            return exc.code()
        finally:
            await channel.close()

    async def scenario() -> None:
        good = dict(node_id="n", server_instance_id="i", slot_id="s", protocol_version=1)
        assert await code_for(pb.SlotHello(**{**good, "protocol_version": 2})) == (
            grpc.StatusCode.FAILED_PRECONDITION
        )
        assert await code_for(pb.SlotHello(**{**good, "node_id": "-x"})) == (
            grpc.StatusCode.INVALID_ARGUMENT
        )
        assert await code_for(pb.SlotHello(**{**good, "slot_id": ""})) == (
            grpc.StatusCode.INVALID_ARGUMENT
        )
        assert await code_for(pb.SlotHello(**good), request_id="r") == (
            grpc.StatusCode.INVALID_ARGUMENT
        )
        channel = open_channel(router.url)
        held = pb_grpc.RouterGatewayStub(channel).ConnectSlot()
        await held.write(pb.SlotFrame(hello=pb.SlotHello(**good)))
        assert (await held.read()).WhichOneof("payload") == "ack"
        assert await code_for(pb.SlotHello(**good)) == grpc.StatusCode.ALREADY_EXISTS
        held.cancel()
        await channel.close()

    asyncio.run(scenario())


async def lowercase_only_handler(
    head: pb.RequestHead, body: bytes
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """A node that reads header names as an ASGI server does: exact lowercase bytes only."""
    names = [h.name for h in head.headers if not h.name.startswith(b":")]
    if any(name != name.lower() for name in names):
        return 400, [(b"content-type", b"text/plain")], b"not lowercase: " + b" ".join(names)
    fields = {h.name: h.value for h in head.headers}
    if not fields.get(b"content-type", b"").startswith(b"multipart/form-data"):
        return 400, [(b"content-type", b"text/plain")], b"expected a multipart/form-data request"
    # Answer with mixed-case names: the router must accept any case from a node.
    return 200, [(b"Content-Type", b"application/json"), (b"Cache-Control", b"no-cache")], b"{}"


def test_a_node_that_reads_only_lowercase_header_names_sees_the_content_type(tmp_path: Path):
    process = start_router(tmp_path, "--status-check-interval-seconds", "0.2")

    async def scenario() -> None:
        node = FakeNode(process.port, "node-lower", handler=lowercase_only_handler)
        await node.start()
        await wait_for_health(process.port, ready(1))
        response = await http_request(
            process.port,
            "POST",
            "/execute",
            b"--b--\r\n",
            [("Content-Type", "multipart/form-data; boundary=b"), ("X-Mixed-Case", "v")],
        )
        await node.close()
        assert response.status == 200, response.body
        assert response.header("Content-Type") == "application/json"
        assert response.header("cache-control") == "no-cache"

    try:
        asyncio.run(scenario())
    finally:
        process.stop()


def test_a_chunked_body_that_breaks_mid_stream_is_400_and_cancels_the_slot(
    router: RouterProcess,
):
    # One whole read's worth (Tornado hands the router a full chunk at once, smaller ones
    # when it would wait), which is no program part: the router forwards it at once, and
    # the slot has the request when the body breaks.
    request = (
        b"POST /execute HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Type: multipart/form-data; boundary=b\r\n\r\n40000\r\n"
        + b"h" * 0x40000
        + b"\r\nnot-a-size\r\n"
    )

    def exchange() -> bytes:
        with socket.create_connection(("127.0.0.1", router.port), timeout=10) as sock:
            sock.sendall(request)
            received = b""
            while chunk := sock.recv(65536):
                received += chunk
            return received

    async def scenario() -> bytes:
        node = FakeNode(router.port, "node-a")
        await node.start()
        await wait_for_health(router.port, ready(1))
        answer = await asyncio.get_running_loop().run_in_executor(None, exchange)
        for _ in range(50):
            if node.cancels:
                break
            await asyncio.sleep(0.05)
        await node.close()
        assert node.cancels == ["request_rejected"]
        return answer

    answer = asyncio.run(scenario())
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    error = json.loads(body)
    assert error["error"] == {
        "kind": "invalid_request",
        "message": "client request body failed while streaming",
    }
    assert f"x-request-id: {error['request_id']}".encode() in head.lower()
    assert "finish_reason=request_rejected" in router.wait_log("finish_reason=request_rejected")


def test_a_router_stopped_with_a_node_connected_ends_its_calls_and_logs_no_traceback(
    router: RouterProcess,
) -> None:
    """grpc used to cancel the open supervisor and slot calls at exit and print a
    ``CancelledError`` traceback for each after ``router_stopped``."""

    async def scenario() -> None:
        node = FakeNode(router.port, "node-a", slots=2)
        await node.start()
        await wait_for_health(router.port, ready(2))
        await asyncio.to_thread(router.stop)
        assert await asyncio.wait_for(node.supervisor.code(), 10) == grpc.StatusCode.OK
        await node.close()

    asyncio.run(scenario())
    log = router.log()
    assert "router_stopped" in log and "node_disconnected node=node-a" in log
    # the router's own stop: nothing went wrong with the node
    assert "INFO    node_disconnected node=node-a" in log, log
    assert "Traceback" not in log and "never retrieved" not in log, log


def test_a_request_being_relayed_when_the_router_stops_still_gets_its_answer(
    router: RouterProcess,
) -> None:
    async def late(head: pb.RequestHead, body: bytes):
        await asyncio.sleep(0.3)
        return 200, [(b"content-type", b"text/plain")], b"late answer"

    async def scenario() -> None:
        node = FakeNode(router.port, "node-a", handler=late)
        await node.start()
        await wait_for_health(router.port, ready(1))
        answer = asyncio.ensure_future(http_request(router.port, "POST", "/execute", b"x"))
        while not node.requests:
            await asyncio.sleep(0.01)
        await asyncio.to_thread(router.stop)  # SIGTERM while the node works on it
        response = await answer
        assert response.status == 200 and response.body == b"late answer"
        await node.close()

    asyncio.run(scenario())
    assert "Traceback" not in router.log()


def test_a_router_stopped_while_requests_wait_for_a_node_answers_them_503_and_exits_at_once(
    router: RouterProcess,
) -> None:
    """Requests queued for a slot (no node yet: an ``/execute`` and a ``/v1/info``) held the
    router's stop for up to ``--queue-wait-timeout-seconds`` (1800 s): its stop waits for
    every client connection, and theirs waited in the queue. Seen in a soak as a router
    that SIGTERM did not stop within 30 s and that had to be killed."""

    async def scenario() -> list[Response]:
        waiting = [
            asyncio.ensure_future(http_request(router.port, "POST", "/execute", b"x")),
            asyncio.ensure_future(http_request(router.port, "GET", "/v1/info")),
        ]
        await wait_for_health(router.port, lambda body: body["load"]["requests_waiting"] == 1)
        await asyncio.sleep(0.3)  # the /v1/info waits for a control slot meanwhile
        router.process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(router.process.wait, 10) == 0
        return await asyncio.gather(*waiting)

    for response in asyncio.run(scenario()):
        assert response.status == 503 and response.json()["error"] == {
            "kind": "no_node",
            "message": "the router is shutting down",  # not "no compatible node has …"
        }
    log = router.log()
    assert "router_stopped" in log and "Traceback" not in log, log
    assert "finish_reason=shutting_down" in log, log


def test_a_draining_node_that_says_goodbye_leaves_at_info_and_one_that_breaks_off_is_lost(
    router: RouterProcess,
) -> None:
    """A drain that ends with the supervisor saying its server stopped and closing its
    stream is what the operator asked for (INFO); a draining node whose stream breaks (it
    crashed or was killed mid-drain) is lost, a WARNING, as any node lost (it read INFO,
    like a planned leave)."""

    async def drain(node_id: str, *, goodbye: bool) -> None:
        node = FakeNode(router.port, node_id, slots=1)
        await node.start()
        await wait_for_health(router.port, ready(1))
        report = node.tasks[0]  # its periodic status, which says nothing of a drain
        report.cancel()
        await asyncio.gather(report, return_exceptions=True)
        node.healthy = False  # as a real supervisor reports its whole drain
        status = node.status()
        status.draining, status.last_error = True, "KCoral Server is shutting down"
        await node.supervisor.write(status)
        await asyncio.to_thread(router.wait_log, f"node={node_id} state=draining")
        if goodbye:
            status.last_error = SERVER_STOPPED  # its server has stopped: the drain is done
            await node.supervisor.write(status)
            await node.supervisor.done_writing()
        else:
            node.supervisor.cancel()  # which the router may read as an end of stream too
        await asyncio.to_thread(router.wait_log, f"node_disconnected node={node_id}")
        await node.close()

    asyncio.run(drain("node-left", goodbye=True))
    asyncio.run(drain("node-lost", goodbye=False))
    log = router.log()
    assert "INFO    node_disconnected node=node-left" in log, log
    assert "WARNING node_disconnected node=node-lost" in log, log
