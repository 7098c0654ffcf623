"""What a node may answer, against a real router and in-process fake nodes: a rogue node (a
holder of the node token) that answers with a head that cannot carry a body, or with JSON
the router cannot read, gets its request refused (502) or its answer left out, and never
reaches the client's connection outside HTTP framing; the router keeps serving, with no
500 page, no traceback and no slot lost. Also the malformed client requests that used to
be a 500 (ROUTER §8)."""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from pathlib import Path

import pytest
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from raw_http import read_until_closed
from router_helpers import FakeNode, RouterProcess, http_request, start_router, wait_for_health

OK = [(b"content-type", b"application/json")]
#: A whole forged answer, which a node's body must never become on the client's connection.
FORGED = (
    b"HTTP/1.1 200 OK\r\nSet-Cookie: session=attacker\r\n"
    b"Access-Control-Allow-Origin: *\r\nContent-Length: 8\r\n\r\nINJECTED"
)
#: Deeper than Python's JSON parser goes (RecursionError), within a buffered answer's 64 KiB.
DEEP = b"[" * 50000
GENEROUS_SECONDS = 30.0


def target(head: pb.RequestHead) -> tuple[str, str]:
    pseudo = {h.name.decode(): h.value.decode() for h in head.headers if h.name.startswith(b":")}
    return pseudo.get(":method", "POST"), pseudo.get(":path", "/execute")


def raw_exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` on one connection; everything the router sends until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=GENEROUS_SECONDS) as sock:
        sock.sendall(data)
        return read_until_closed(sock)


@pytest.mark.parametrize("status", [204, 304])
def test_a_node_that_answers_204_with_a_body_gets_its_request_a_502(
    router: RouterProcess, status: int
):
    async def forger(head: pb.RequestHead, body: bytes):
        return status, [], FORGED  # data frames after a head that has no body

    async def scenario() -> bytes:
        node = FakeNode(router.port, "rogue", handler=forger)
        await node.start()
        await wait_for_health(router.port, lambda b: b["status"] == "ok")
        # a keep-alive request, then a second one on the same connection
        first = b"POST /execute HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n{}"
        second = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        answer = await asyncio.to_thread(raw_exchange, router.port, first + second)
        while "invalid_response" not in node.cancels:  # the slot is discarded
            await asyncio.sleep(0.05)
        await node.close()
        return answer

    answer = asyncio.run(scenario())
    assert answer.startswith(b"HTTP/1.1 502 ")
    assert b'"kind":"server_transport"' in answer
    assert b"INJECTED" not in answer and b"attacker" not in answer
    # exactly two answers on the connection: the 502 and the /health that followed it
    assert answer.count(b"HTTP/1.1 ") == 2 and b"HTTP/1.1 200 OK" in answer
    log = router.wait_log("finish_reason=invalid_response")
    assert "finish_reason=invalid_response" in log and "Traceback" not in log


def test_an_http_1_0_client_gets_a_streamed_answer_that_ends_with_its_connection(
    tmp_path: Path,
):
    """HTTP/1.0 has no chunked framing: a streamed body (a job's events) ends only where the
    connection does, so the router closes it after the answer, even when the client asked
    to keep it alive; otherwise whatever a node streamed would be followed by the next
    answer with nothing to tell them apart. (No idle deadline here: only the end of the
    answer may close the connection.)"""
    router = start_router(tmp_path, "--request-head-timeout-seconds", "600")

    async def events(head: pb.RequestHead, body: bytes):
        _, path = target(head)
        if path == "/v1/jobs/job-1":
            return 200, OK, b'{"job_id":"job-1"}'
        if path == "/v1/jobs/job-1/events":
            return 200, [(b"content-type", b"text/event-stream")], b"id: 1\n\n" + FORGED
        return 404, OK, b"{}"

    async def scenario() -> bytes:
        node = FakeNode(router.port, "n1", handler=events, control_slots=2)
        await node.start()
        await wait_for_health(router.port, lambda b: b["status"] == "ok")
        request = (
            b"GET /v1/jobs/job-1/events HTTP/1.0\r\nHost: 127.0.0.1\r\n"
            b"Connection: keep-alive\r\n\r\n"
        )
        # read_until_closed raises TimeoutError if the router keeps the connection open
        answer = await asyncio.to_thread(raw_exchange, router.port, request)
        await node.close()
        return answer

    try:
        answer = asyncio.run(scenario())
    finally:
        router.stop()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"chunked" not in head.lower()
    assert body == b"id: 1\n\n" + FORGED  # all body, up to the close


def deep_node(port: int, name: str) -> FakeNode:
    """A node whose every JSON answer is nested deeper than the router's parser goes."""

    async def handler(head: pb.RequestHead, body: bytes):
        method, path = target(head)
        if path == "/execute":
            return 200, OK, b"{}"
        if (method, path) == ("POST", "/v1/jobs"):
            return 202, OK, DEEP  # a buffered answer the router reads for the job id
        return 200, OK, DEEP

    return FakeNode(port, name, handler=handler, slots=1, control_slots=2)


def honest_node(port: int, name: str) -> FakeNode:
    """A node with one job and one session, and a free session seat."""
    session = {"session_id": str(uuid.uuid4()), "owner": "default", "created_at": 1.0}

    async def handler(head: pb.RequestHead, body: bytes):
        method, path = target(head)
        if path == "/v1/info":
            info = {"features": ["jobs", "sessions"], "sessions": {"max": 2, "active": 0}}
            return 200, OK, json.dumps(info).encode()
        if path == "/v1/jobs":
            return 200, OK, json.dumps([{"job_id": f"job-{name}", "submitted_at": "x"}]).encode()
        if (method, path) == ("POST", "/v1/sessions"):
            return 201, OK, json.dumps(session).encode()
        if path == "/v1/sessions":
            return 200, OK, json.dumps([session]).encode()
        return 404, OK, b'{"status":"ERROR","error":{"kind":"not_found","message":"no"}}'

    return FakeNode(port, name, handler=handler, control_slots=2)


def test_a_node_whose_answers_are_nested_too_deep_is_left_out_and_keeps_its_slot(
    router: RouterProcess,
):
    async def scenario() -> None:
        rogue = deep_node(router.port, "rogue")
        honest = honest_node(router.port, "honest")
        await rogue.start()
        await honest.start()
        await wait_for_health(router.port, lambda b: b["load"]["request_capacity"] >= 2)

        async def ask(method: str, path: str, body: bytes | None = None, headers=None):
            reply = http_request(router.port, method, path, body, headers)
            return await asyncio.wait_for(reply, GENEROUS_SECONDS)

        jobs = await ask("GET", "/v1/jobs")
        assert jobs.status == 200 and [j["job_id"] for j in jobs.json()] == ["job-honest"]
        sessions = await ask("GET", "/v1/sessions")
        assert sessions.status == 200 and len(sessions.json()) == 1
        unknown = await ask("GET", f"/v1/sessions/{uuid.uuid4()}")
        assert unknown.status == 404 and unknown.json()["error"]["kind"] == "not_found"
        created = await ask("POST", "/v1/sessions", b"{}")  # the rogue's seats are unreadable
        assert created.status == 201 and created.header("X-KCoral-Node") == "honest"
        info = await ask("GET", "/v1/info", headers=[("X-KCoral-Node", "rogue")])
        assert info.status == 200  # relayed as the node sent it, whichever node answered
        # A buffered answer the router cannot read is relayed, and its worker slot is free
        # again: the rogue's only one, which an /execute for it then gets.
        submitted = await ask("POST", "/v1/jobs", b"{}", [("X-KCoral-Node", "rogue")])
        assert submitted.status == 202 and submitted.body == DEEP
        executed = await ask("POST", "/execute", b"{}", [("X-KCoral-Node", "rogue")])
        assert executed.status == 200 and executed.header("X-KCoral-Node") == "rogue"
        health = (await ask("GET", "/health")).json()
        assert health["load"]["requests_in_progress"] == 0
        await rogue.close()
        await honest.close()

    asyncio.run(scenario())
    log = router.log()
    assert "Traceback" not in log and "http_status=500" not in log


def test_a_session_list_with_odd_created_at_values_still_merges_newest_first(
    router: RouterProcess,
):
    ids = {name: str(uuid.uuid4()) for name in ("honest", "text", "huge", "inf", "bool")}
    # JSON text, since json.dumps would not write 1e400 or a 400-digit number as such
    rogue_list = (
        f'[{{"session_id":"{ids["text"]}","owner":"default","created_at":"not-a-number"}},'
        f'{{"session_id":"{ids["huge"]}","owner":"default","created_at":1{"0" * 400}}},'
        f'{{"session_id":"{ids["inf"]}","owner":"default","created_at":1e400}},'
        f'{{"session_id":"{ids["bool"]}","owner":"default","created_at":true}}]'
    ).encode()

    async def rogue_handler(head: pb.RequestHead, body: bytes):
        return 200, OK, rogue_list

    async def honest_handler(head: pb.RequestHead, body: bytes):
        record = {"session_id": ids["honest"], "owner": "default", "created_at": 5.0}
        return 200, OK, json.dumps([record]).encode()

    async def scenario() -> None:
        nodes = [
            FakeNode(router.port, "rogue", handler=rogue_handler, control_slots=1),
            FakeNode(router.port, "honest", handler=honest_handler, control_slots=1),
        ]
        for node in nodes:
            await node.start()
        await wait_for_health(router.port, lambda b: b["load"]["request_capacity"] >= 2)
        for _ in range(2):  # and again: the router keeps serving
            listed = await http_request(router.port, "GET", "/v1/sessions")
            assert listed.status == 200
            order = [r["session_id"] for r in listed.json()]
            # the 400-digit number is the newest; text and true sort as 0; 1e400 (an
            # infinity, which strict JSON cannot write back) is left out
            assert order[:2] == [ids["huge"], ids["honest"]]
            assert sorted(order[2:]) == sorted([ids["text"], ids["bool"]])
        for node in nodes:
            await node.close()

    asyncio.run(scenario())
    assert "Traceback" not in router.log()


def test_a_content_length_in_other_digits_than_ascii_is_a_400_not_a_500(
    router: RouterProcess,
):
    async def scenario() -> list[bytes]:
        node = FakeNode(router.port, "n1")
        await node.start()
        await wait_for_health(router.port, lambda b: b["status"] == "ok")
        answers = []
        for length in (b"\xb2", b"\xb3", b"\xb9"):  # ², ³, ¹ in Latin-1: str.isdigit() says yes
            request = (
                b"POST /execute HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: "
                + length
                + b"\r\nConnection: close\r\n\r\n{}"
            )
            answers.append(await asyncio.to_thread(raw_exchange, router.port, request))
        executed = await http_request(router.port, "POST", "/execute", b"{}")
        assert executed.status == 200  # still serving
        await node.close()
        return answers

    for answer in asyncio.run(scenario()):
        assert answer.startswith(b"HTTP/1.1 400 ")
        assert b'"message":"invalid Content-Length"' in answer
    assert "Traceback" not in router.log()


def test_a_session_body_nested_too_deep_gets_the_nodes_400_not_a_500(tmp_path: Path):
    router = start_router(tmp_path)

    async def sessions_node(head: pb.RequestHead, body: bytes):
        _, path = target(head)
        if path == "/v1/info":
            info = {"features": ["sessions"], "sessions": {"max": 1, "active": 0}}
            return 200, OK, json.dumps(info).encode()
        error = {"status": "ERROR", "error": {"kind": "invalid_request", "message": "bad"}}
        return 400, OK, json.dumps(error).encode()

    async def scenario() -> None:
        node = FakeNode(router.port, "n1", handler=sessions_node, control_slots=1)
        await node.start()
        await wait_for_health(router.port, lambda b: b["status"] == "ok")
        deep = await http_request(router.port, "POST", "/v1/sessions", b"[" * 60000)
        assert deep.status == 400 and deep.header("X-KCoral-Node") == "n1"
        await node.close()

    try:
        asyncio.run(scenario())
        assert "Traceback" not in router.log()
    finally:
        router.stop()
