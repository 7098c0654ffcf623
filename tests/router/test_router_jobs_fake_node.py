"""The router's /v1/info, jobs endpoints, control slots and client token, against a real
router process and in-process fake nodes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from kcoral_server.node.control_slots import control_slot_count
from kcoral_server.node.loopback import ProtocolViolation, request_target
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.router.settings import SettingsError, parse_router_args
from router_helpers import FakeNode, Response, http_request, start_router, wait_for_health

SUBMITTED = {"a": "2026-01-05T09:30:00.000001Z", "b": "2026-01-05T09:31:00.000001Z"}


def target(head: pb.RequestHead) -> tuple[str, str]:
    pseudo = {h.name.decode(): h.value.decode() for h in head.headers if h.name.startswith(b":")}
    return pseudo.get(":method", "POST"), pseudo.get(":path", "/execute")


def error(kind: str, status: int = 404) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    body = {"status": "ERROR", "request_id": "x", "error": {"kind": kind, "message": kind}}
    return status, [(b"content-type", b"application/json")], json.dumps(body).encode()


def jobs_node(port: int, name: str, seen: list, release: asyncio.Event | None = None, **kw):
    """A fake node that knows one job, ``job-<name>``."""

    async def handler(head: pb.RequestHead, body: bytes):
        method, path = target(head)
        seen.append((name, method, path, head))
        ok = [(b"content-type", b"application/json")]
        job = {"job_id": f"job-{name}", "status": "RUNNING", "submitted_at": SUBMITTED[name]}
        if (method, path) == ("POST", "/v1/jobs"):
            return 202, ok, json.dumps({**job, "request_id": "r", "status": "QUEUED"}).encode()
        if (method, path) == ("GET", "/v1/jobs"):
            return 200, ok, json.dumps([job]).encode()
        if path in (f"/v1/jobs/job-{name}", f"/v1/jobs/job-{name}/result"):
            return 200, ok, json.dumps(job).encode()
        if path == f"/v1/jobs/job-{name}/events":
            if release is not None:
                await release.wait()
            return 200, [(b"content-type", b"text/event-stream")], b"id: 1\nevent: phase\n\n"
        if path.startswith("/v1/jobs/"):
            return error("job_expired" if "expired" in path else "not_found")
        if path == "/v1/info":
            info = {
                "kcoral": "9.9.9",
                "protocol": 1,
                "features": ["jobs", "sessions"],
                "device": "cpu",
                "sessions": {"max": 1, "active": 0, "idle_timeout_seconds": 600},
            }
            return 200, ok, json.dumps(info).encode()
        return 200, [(b"content-type", b"application/octet-stream")], body

    return FakeNode(port, name, handler=handler, **kw)


def capacity(n: int):
    return lambda body: body["load"]["request_capacity"] >= n


def test_job_requests_follow_the_job_to_its_node_and_lists_are_merged(router):
    async def scenario() -> None:
        seen: list = []
        nodes = [jobs_node(router.port, n, seen, control_slots=2) for n in "ab"]
        for node in nodes:
            await node.start()
        await wait_for_health(router.port, capacity(2))
        submitted = await http_request(
            router.port, "POST", "/v1/jobs", b"program", [("X-KCoral-Node", "b")]
        )
        assert submitted.status == 202 and submitted.json()["job_id"] == "job-b"
        assert submitted.header("X-KCoral-Node") == "b"
        for method, path in [
            ("GET", "/v1/jobs/job-b"),
            ("GET", "/v1/jobs/job-b/result"),
            ("DELETE", "/v1/jobs/job-b"),
        ]:
            answer = await http_request(router.port, method, path)
            assert (answer.status, answer.header("X-KCoral-Node")) == (200, "b"), path
        # A job the router never saw submitted is looked up on every node.
        found = await http_request(router.port, "GET", "/v1/jobs/job-a")
        assert found.status == 200 and found.header("X-KCoral-Node") == "a"
        missing = await http_request(router.port, "GET", "/v1/jobs/nope")
        assert missing.status == 404 and missing.json()["error"]["kind"] == "not_found"
        assert missing.header("X-Request-ID") == missing.json()["request_id"]
        expired = await http_request(router.port, "GET", "/v1/jobs/expired-1/events")
        assert expired.status == 404 and expired.json()["error"]["kind"] == "job_expired"
        listed = await http_request(router.port, "GET", "/v1/jobs")
        assert listed.status == 200
        assert [job["job_id"] for job in listed.json()] == ["job-b", "job-a"]  # newest first
        refused = await http_request(router.port, "POST", "/v1/jobs/job-b/events", b"")
        assert refused.status == 405 and refused.header("Allow") == "GET"
        info = await http_request(router.port, "GET", "/v1/info")
        assert info.status == 200 and info.json()["kcoral"] == "9.9.9"
        assert "auth" not in info.json()["features"]
        # The router routes sessions, so it offers them, without one node's own counts.
        assert info.json()["features"] == ["jobs", "sessions"] and "sessions" not in info.json()
        for node in nodes:
            await node.close()
        # The job's node carried every request for it, and the method/path travelled as
        # pseudo-headers (the submission too, which took a worker slot).
        on_b = [(m, p) for n, m, p, _ in seen if n == "b" and p.startswith("/v1/jobs/job-b")]
        assert ("DELETE", "/v1/jobs/job-b") in on_b and ("GET", "/v1/jobs/job-b/result") in on_b
        assert not [p for n, _, p, _ in seen if n == "a" and p.startswith("/v1/jobs/job-b")]

    asyncio.run(scenario())
    log = router.wait_log("path=/v1/jobs/job-b")
    assert "method=DELETE path=/v1/jobs/job-b node=b" in log


def test_an_open_event_stream_leaves_the_worker_slot_to_execute(router):
    async def scenario() -> None:
        seen: list = []
        release = asyncio.Event()
        node = jobs_node(router.port, "a", seen, release, slots=1, control_slots=1)
        await node.start()
        await wait_for_health(router.port, capacity(1))
        stream = asyncio.ensure_future(http_request(router.port, "GET", "/v1/jobs/job-a/events"))
        while not any(p.endswith("/events") for _, _, p, _ in seen):
            await asyncio.sleep(0.02)
        executed = await http_request(router.port, "POST", "/execute", b"work")
        assert executed.status == 200 and executed.body == b"work"
        health = (await http_request(router.port, "GET", "/health")).json()
        assert health["load"]["request_capacity"] == 1  # control slots are not capacity
        assert not stream.done()
        release.set()
        events: Response = await stream
        assert events.status == 200 and events.body.startswith(b"id: 1")
        await node.close()
        execute_head = next(h for _, m, p, h in seen if p == "/execute")
        assert not [h for h in execute_head.headers if h.name.startswith(b":")]

    asyncio.run(scenario())


def test_event_streams_leave_a_control_slot_free_for_the_status_and_cancel_of_their_job(
    router,
):
    # Before: with as many streams open as the node has control slots, the watched job's
    # status and its cancel waited until a stream ended (jobs soak: still waiting after 30 s).
    async def scenario() -> None:
        seen: list = []
        release = asyncio.Event()
        node = jobs_node(router.port, "a", seen, release, slots=1, control_slots=3)
        await node.start()
        await wait_for_health(router.port, capacity(1))
        streams = [
            asyncio.ensure_future(http_request(router.port, "GET", "/v1/jobs/job-a/events"))
            for _ in range(3)
        ]

        def streaming() -> int:
            return sum(p.endswith("/events") for _, _, p, _ in seen)

        while streaming() < 2:
            await asyncio.sleep(0.02)
        status = await asyncio.wait_for(http_request(router.port, "GET", "/v1/jobs/job-a"), 10)
        assert status.status == 200 and status.json()["status"] == "RUNNING"
        cancel = await asyncio.wait_for(http_request(router.port, "DELETE", "/v1/jobs/job-a"), 10)
        assert cancel.status == 200
        assert streaming() == 2  # the third stream waits for a slot another stream frees
        release.set()
        for stream in streams:
            assert (await stream).status == 200
        assert streaming() == 3
        await node.close()

    asyncio.run(scenario())


def test_the_client_token_guards_every_endpoint_but_health(tmp_path: Path):
    # A router with a client token needs a node token too (ROUTER §3).
    router = start_router(tmp_path, env={"KCORAL_AUTH_TOKEN": "s3cret", "KCORAL_NODE_TOKEN": "n"})
    good = [("Authorization", "Bearer s3cret")]

    async def scenario() -> None:
        node = jobs_node(router.port, "a", [], control_slots=1, token="n")
        await node.start()
        await wait_for_health(router.port, capacity(1))
        for method, path in [
            ("POST", "/execute"),
            ("GET", "/v1/info"),
            ("GET", "/v1/jobs"),
            ("DELETE", "/v1/jobs/job-a"),
            ("GET", "/elsewhere"),
        ]:
            for headers in ([], [("Authorization", "Bearer wrong")]):
                body = b"x" if method == "POST" else None
                answer = await http_request(router.port, method, path, body, headers)
                assert answer.status == 401, (method, path)
                assert answer.json()["error"]["kind"] == "unauthorized"
                assert answer.header("X-Request-ID") == answer.json()["request_id"]
        assert (await http_request(router.port, "GET", "/health")).status == 200
        other = await http_request(router.port, "GET", "/elsewhere", headers=good)
        assert other.status == 404 and other.json()["error"]["kind"] == "not_found"
        executed = await http_request(router.port, "POST", "/execute", b"x", good)
        assert executed.status == 200
        info = await http_request(router.port, "GET", "/v1/info", headers=good)
        assert info.json()["features"] == ["jobs", "sessions", "auth"]
        await node.close()

    try:
        asyncio.run(scenario())
        router.lines_after_mark()  # every answered request's line is in
        assert "s3cret" not in router.log()
    finally:
        router.stop()


def test_a_non_loopback_router_needs_a_client_token_or_an_explicit_opt_out(tmp_path: Path):
    nodes = {"KCORAL_NODE_TOKEN": "n"}  # off loopback a node token is required as well
    with pytest.raises(SettingsError, match="without a client token"):
        parse_router_args(["--host", "0.0.0.0"], nodes)
    assert (
        parse_router_args(["--host", "0.0.0.0", "--allow-unauthenticated"], nodes).auth_token
        is None
    )
    assert (
        parse_router_args(["--host", "::"], {**nodes, "KCORAL_AUTH_TOKEN": "t"}).auth_token == "t"
    )
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    settings = parse_router_args(
        ["--host", "0.0.0.0", "--auth-token-file", str(token_file)],
        {**nodes, "KCORAL_AUTH_TOKEN": "env"},
    )
    assert settings.auth_token == "from-file"
    assert "from-file" not in repr(settings)
    token_file.write_text("  \n")
    with pytest.raises(SettingsError, match="is empty"):
        parse_router_args(["--auth-token-file", str(token_file)], {})
    with pytest.raises(SettingsError, match="cannot be read"):
        parse_router_args(["--auth-token-file", str(tmp_path / "missing")], {})
    assert parse_router_args([], {}).auth_token is None  # loopback: open by default


def test_the_node_forwards_only_its_public_endpoints() -> None:
    def head(*pairs: tuple[bytes, bytes]) -> pb.RequestHead:
        return pb.RequestHead(headers=[pb.HttpHeader(name=n, value=v) for n, v in pairs])

    assert request_target(head((b"content-type", b"x"))) == ("POST", "/execute")
    assert request_target(head((b":method", b"GET"), (b":path", b"/v1/jobs/abc/events"))) == (
        "GET",
        "/v1/jobs/abc/events",
    )
    assert request_target(head((b":method", b"DELETE"), (b":path", b"/v1/jobs/abc")))[0] == (
        "DELETE"
    )
    for pairs in [
        ((b":method", b"GET"), (b":path", b"/internal/worker-status")),
        ((b":method", b"GET"), (b":path", b"/v1/info HTTP/1.1\r\nX: y")),
        ((b":method", b"PUT"), (b":path", b"/v1/jobs")),
        ((b":path", b"/v1/info"),),
        ((b":method", b"GET"), (b":path", b"/v1/jobs/../internal/worker-status")),
    ]:
        with pytest.raises(ProtocolViolation):
            request_target(head(*pairs))
    assert control_slot_count(1, {}) == 4 and control_slot_count(8, {}) == 16
    assert control_slot_count(8, {"KCORAL_NODE_CONTROL_SLOTS": "2"}) == 2


def test_a_job_or_session_id_that_is_not_utf8_is_an_unknown_id_after_the_token_check(
    tmp_path: Path,
):
    # Fuzz audit: Tornado refused such a path itself, before the token check, with an HTML
    # 400 (not the JSON error shape of ROUTER §8); it is an id no node gave, so 404.
    router = start_router(tmp_path, env={"KCORAL_AUTH_TOKEN": "s3cret", "KCORAL_NODE_TOKEN": "n"})
    good = [("Authorization", "Bearer s3cret")]
    paths = [
        ("GET", "/v1/jobs/%ff"),
        ("DELETE", "/v1/jobs/%c0%80"),
        ("GET", "/v1/jobs/%ff/result"),
        ("GET", "/v1/sessions/%ff"),
        ("POST", "/v1/sessions/%fe/execute"),
    ]

    async def scenario() -> None:
        for method, path in paths:
            body = b"x" if method == "POST" else None
            refused = await http_request(router.port, method, path, body)
            assert refused.status == 401, (method, path, refused.body)
            answer = await http_request(router.port, method, path, body, good)
            assert answer.status == 404, (method, path, answer.body)
            assert answer.header("Content-Type") == "application/json"
            assert answer.json()["error"]["kind"] == "not_found"

    try:
        asyncio.run(scenario())
    finally:
        router.stop()


def test_a_request_for_a_job_whose_node_left_is_told_that_node_is_not_connected(router):
    # Before, it got "no compatible node has an available slot" (finish_reason
    # queue_timeout), which points at the fleet's capacity, not at the job's node.
    async def scenario() -> None:
        seen: list = []
        release = asyncio.Event()
        a = jobs_node(router.port, "a", seen, control_slots=1)
        b = jobs_node(router.port, "b", seen, release, control_slots=1)
        for node in (a, b):
            await node.start()
        await wait_for_health(router.port, capacity(2))
        submitted = await http_request(
            router.port, "POST", "/v1/jobs", b"program", [("X-KCoral-Node", "b")]
        )
        assert submitted.status == 202 and submitted.json()["job_id"] == "job-b"
        # b's one control slot follows the job's output; a read of the job waits for it.
        stream = asyncio.ensure_future(http_request(router.port, "GET", "/v1/jobs/job-b/events"))
        while not any(p.endswith("/events") for _, _, p, _ in seen):
            await asyncio.sleep(0.02)
        waiting = asyncio.ensure_future(http_request(router.port, "GET", "/v1/jobs/job-b"))
        await asyncio.sleep(0.3)  # queued for b's control slot (health counts only programs)
        await b.close()
        gone = {
            "kind": "no_node",
            "message": "node b, which holds it, is not connected to the router",
        }
        waited = await waiting  # it was waiting for b's control slot when b left
        assert waited.status == 503 and waited.json()["error"] == gone
        await stream
        await wait_for_health(router.port, capacity(1))
        later = await http_request(router.port, "DELETE", "/v1/jobs/job-b")
        assert later.status == 503 and later.json()["error"] == gone
        assert later.header("Retry-After") == "1"  # b may come back with its jobs
        await a.close()

    asyncio.run(scenario())
    log = router.wait_log("method=DELETE path=/v1/jobs/job-b")
    assert "finish_reason=node_gone" in log and "finish_reason=queue_timeout" not in log


def test_a_looked_up_expired_job_keeps_the_node_s_reason(router):
    # A job id the router has not bound (it restarted) is looked up on every node; a node's
    # 404 job_expired said why the job went, the router's said only "job expired".
    why = "job expired: its --job-retention-seconds passed"
    messages = {"/v1/jobs/gone": why, "/v1/jobs/odd": "<b>gone</b>\n" + "x" * 400}

    async def handler(head: pb.RequestHead, body: bytes):
        _method, path = target(head)
        if path in messages:
            answer = {"status": "ERROR", "request_id": "x"}
            answer["error"] = {"kind": "job_expired", "message": messages[path]}
            return 404, [(b"content-type", b"application/json")], json.dumps(answer).encode()
        return error("not_found")

    async def scenario() -> None:
        node = FakeNode(router.port, "a", handler=handler, control_slots=1)
        await node.start()
        await wait_for_health(router.port, capacity(1))
        gone = await http_request(router.port, "GET", "/v1/jobs/gone/result")
        assert gone.status == 404
        assert gone.json()["error"] == {"kind": "job_expired", "message": why}
        # what does not read as a reason (markup, a line break, too long) is not repeated
        odd = await http_request(router.port, "DELETE", "/v1/jobs/odd")
        assert odd.json()["error"] == {"kind": "job_expired", "message": "job expired"}
        await node.close()

    asyncio.run(scenario())
