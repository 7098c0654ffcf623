"""A node adds headers to the router's answer (issue 28, point 3).

Attacker: a rogue node (whoever holds the node token and gets a slot, or a compromised node
server). The router used to pass on every header of a node's answer except hop-by-hop
ones, so a node could set ``Set-Cookie`` or ``Access-Control-Allow-Origin: *`` in the
router's name. Now it passes on only ``headers.RELAYED_RESPONSE_HEADERS``; the second test
collects every header our own server sends, from real answers of each endpoint, and checks
each one is either relayed or deliberately dropped, so the allow-list cannot silently lose
one of ours.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from kcoral_server.front_door.browser_guard import BROWSER_HEADERS
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.router.forwarding.headers import (
    DROPPED_RESPONSE_HEADERS,
    RELAYED_RESPONSE_HEADERS,
)
from raw_http import Response, call_program, execute_body, request
from router_helpers import FakeNode, http_request, start_router, wait_for_health
from server_process import start_server

ROGUE_HEADERS = [
    (b"set-cookie", b"session=stolen; Path=/; HttpOnly"),
    (b"access-control-allow-origin", b"*"),
    (b"access-control-allow-credentials", b"true"),
    (b"location", b"https://evil.example/"),
    (b"refresh", b"0; url=https://evil.example/"),
    (b"link", b"<https://evil.example/x.js>; rel=preload"),
    (b"strict-transport-security", b"max-age=0"),
    (b"content-security-policy", b"default-src *"),
    (b"www-authenticate", b'Basic realm="router"'),
    (b"x-kcoral-identity", b"root;admin"),
    (b"x-anything-else", b"from the node"),
]
#: What the router itself puts on a relayed answer (framing, its ids, its browser headers:
#: a node's ``content-security-policy`` is replaced by the router's own).
ROUTER_OWN = {"x-kcoral-node", "x-request-id", "content-length", "transfer-encoding", "date"}
ROUTER_OWN |= {name.lower() for name, _value in BROWSER_HEADERS}


async def rogue_answer(head: pb.RequestHead, body: bytes):
    return 200, [(b"content-type", b"application/json"), *ROGUE_HEADERS], b'{"ok":true}'


def test_a_rogue_nodes_cookie_cors_and_other_headers_never_reach_the_client(
    tmp_path: Path,
) -> None:
    router = start_router(tmp_path)

    async def scenario() -> None:
        node = FakeNode(router.port, "rogue", handler=rogue_answer)
        await node.start()
        await wait_for_health(router.port, lambda body: body["load"]["request_capacity"] >= 1)
        answer = await http_request(router.port, "POST", "/execute", b"x")
        await node.close()
        assert answer.status == 200 and answer.body == b'{"ok":true}'
        names = {name.lower() for name, _value in answer.headers}
        pairs = {(name.lower(), value) for name, value in answer.headers}
        for name, value in ROGUE_HEADERS:
            assert (name.decode(), value.decode()) not in pairs, name
        for name, value in BROWSER_HEADERS:
            assert answer.header(name) == value, name
        assert names <= RELAYED_RESPONSE_HEADERS | ROUTER_OWN, names
        assert answer.header("Content-Type") == "application/json"
        assert answer.header("X-KCoral-Node") == "rogue"

    try:
        asyncio.run(scenario())
    finally:
        router.stop()


def answers_of_every_endpoint(url: str, token: str) -> list[tuple[str, Response]]:
    """Real answers of each endpoint of a server with sessions and a client token."""
    auth = {"Authorization": f"Bearer {token}"}
    answers: list[tuple[str, Response]] = []

    def ask(label: str, method: str, path: str, body: bytes | None = None, headers=None):
        answer = request(url, method, path, body, {**auth, **(headers or {})})
        answers.append((label, answer))
        return answer

    def run(label: str, path: str, program: dict, blobs=None) -> Response:
        content_type, body = execute_body(program, blobs)
        return ask(label, "POST", path, body, {"Content-Type": content_type})

    ask("health", "GET", "/health")
    ask("worker-status", "GET", "/internal/worker-status")
    answers.append(("worker-status without token", request(url, "GET", "/internal/worker-status")))
    ask("info", "GET", "/v1/info")
    answers.append(("401", request(url, "GET", "/v1/info")))
    ask("404", "GET", "/nowhere")
    ask("405", "POST", "/health", b"")
    hello = call_program("def main():\n    return 'hi'\n")
    assert run("execute", "/execute", hello).status == 200
    blob = "0" * 64
    missing = {
        "instructions": [
            {"op": "upload", "id": "b", "kind": "bytes", "blob": blob},
            {"op": "return", "key": "b", "value": {"$ref": "b"}},
        ]
    }
    run("cache miss", "/execute", missing)
    ask("400", "POST", "/execute", b"not multipart", {"Content-Type": "text/plain"})
    ask("413", "POST", "/execute", None, {"Content-Length": str(10**12)})
    submitted = run("job submit", "/v1/jobs", hello)
    assert submitted.status == 202, submitted.body
    job = submitted.body["job_id"]
    deadline = time.monotonic() + 60
    while ask("job state", "GET", f"/v1/jobs/{job}").body["status"] not in ("COMPLETED",):
        assert time.monotonic() < deadline, "the job never finished"
        time.sleep(0.1)
    ask("job events", "GET", f"/v1/jobs/{job}/events")
    ask("job result", "GET", f"/v1/jobs/{job}/result")
    ask("job list", "GET", "/v1/jobs")
    ask("job delete", "DELETE", f"/v1/jobs/{job}")
    created = ask("session create", "POST", "/v1/sessions", b"{}")
    assert created.status == 201, created.body
    session = created.body["session_id"]
    busy = ask("session seat taken", "POST", "/v1/sessions", b"{}")
    assert busy.status == 503, busy.body
    ask("session list", "GET", "/v1/sessions")
    ask("session state", "GET", f"/v1/sessions/{session}")
    run("session execute", f"/v1/sessions/{session}/execute", hello)
    run("session job", f"/v1/sessions/{session}/jobs", hello)
    ask("session interrupt", "POST", f"/v1/sessions/{session}/interrupt", b"")
    ask("session delete", "DELETE", f"/v1/sessions/{session}")
    return answers


def test_every_header_our_server_sends_is_relayed_or_dropped_on_purpose(tmp_path: Path) -> None:
    token = "alice-token-0123456789abcdef"
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice {token}\n")
    tokens.chmod(0o600)
    server = start_server(
        tmp_path / "server",
        ["--auth-token-file", str(tokens), "--num-workers", "1", "--max-sessions", "1"],
    )
    try:
        answers = answers_of_every_endpoint(server.url, token)
    finally:
        server.stop()
    sent: dict[str, set[str]] = {}
    for label, answer in answers:
        for name in answer.headers:
            sent.setdefault(name.lower(), set()).add(label)
    unclassified = {
        name: labels
        for name, labels in sent.items()
        if name not in RELAYED_RESPONSE_HEADERS | DROPPED_RESPONSE_HEADERS
    }
    assert unclassified == {}, (
        "headers our server sends that forward.RELAYED_RESPONSE_HEADERS neither relays nor "
        f"DROPPED_RESPONSE_HEADERS drops on purpose: {json.dumps(sorted(unclassified))}"
    )
    # And the allow-list holds nothing our server never sends (each entry is deliberate).
    assert RELAYED_RESPONSE_HEADERS <= set(sent), RELAYED_RESPONSE_HEADERS - set(sent)
