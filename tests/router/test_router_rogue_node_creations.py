"""A rogue node (it holds the node token) that is sent a token holder's new session or job, list
or look-up answers it with the id of another identity's session or job, which it learnt, and
names that identity as the owner. The router bound the id to the rogue for that owner, so the
owner's own programs (and reads, cancels) went to the rogue with the owner's identity (ROUTER
§13). A node answers a caller only with what the caller may see: a created id is the
caller's, and a record of an owner the caller may not see is believed of no node. A real
router with client tokens and fake nodes."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from router_helpers import FakeNode, RouterProcess, http_request, start_router, wait_for_health
from server_process import client_token_file

OK = [(b"content-type", b"application/json")]
ALICE, BOB = "rogue-creations-alice", "rogue-creations-bob"
NODE_TOKEN = "rogue-creations-node-token"
NOT_FOUND = {"status": "ERROR", "request_id": "x", "error": {"kind": "not_found"}}


@pytest.fixture
def router(tmp_path: Path) -> Iterator[RouterProcess]:
    tokens = client_token_file(tmp_path, f"alice {ALICE}\nbob {BOB}\n")
    process = start_router(
        tmp_path,
        "--auth-token-file",
        str(tokens),
        "--reconnect-grace-seconds",
        "0",
        env={"KCORAL_NODE_TOKEN": NODE_TOKEN},
    )
    yield process
    process.stop()


def as_(token: str) -> list[tuple[str, str]]:
    return [("Authorization", f"Bearer {token}")]


def request_of(head: pb.RequestHead) -> tuple[str, str, str]:
    """The method, path and forwarded identity of a request a node received."""
    named = {h.name.decode(): h.value.decode() for h in head.headers}
    return named.get(":method", ""), named.get(":path", ""), named.get("x-kcoral-identity", "")


def alices_node(held: str) -> FakeNode:
    """A node holding alice's session or job ``held`` (for alice alone), and no free seat; it
    lists her session to the router (asked as the admin ``kcoral-router``), as a node lists
    every session it holds."""

    async def handler(head: pb.RequestHead, body: bytes):
        _method, path, identity = request_of(head)
        if path == "/v1/info":
            info = {"features": ["jobs", "sessions"], "sessions": {"max": 1, "active": 1}}
            return 200, OK, json.dumps(info).encode()
        if path == "/v1/sessions" and identity.startswith("kcoral-router;"):
            return 200, OK, json.dumps([{"session_id": held, "owner": "alice"}]).encode()
        if path in ("/v1/sessions", "/v1/jobs"):
            return 200, OK, b"[]"  # nothing of bob's (alice does not list here)
        if held in path and "alice" in identity:
            record = {"session_id": held, "job_id": held, "owner": "alice"}
            return 200, OK, json.dumps(record).encode()
        return 404, OK, json.dumps(NOT_FOUND).encode()

    node = FakeNode(0, "alices", handler=handler, control_slots=2, token=NODE_TOKEN)
    control_only = node.open_slot

    async def open_slot(kind: str = "worker") -> object:
        # no worker slot: bob's new job goes to the rogue (a session's node is chosen by seats)
        return await control_only(kind) if kind != "worker" else None

    node.open_slot = open_slot  # type: ignore[method-assign]
    return node


def a_rogue(stolen: str, seen: list[tuple[str, str, str]], to_bob_alone: bool = False) -> FakeNode:
    """A node that offers free seats and answers every creation with ``stolen``, alice's;
    ``to_bob_alone``: it answers others as a node without it (it lists nothing to the router
    and answers alice's look-up 404), so that only bob's answer lies."""

    async def handler(head: pb.RequestHead, body: bytes):
        method, path, identity = request_of(head)
        seen.append((method, path, identity))
        if path == "/v1/info":
            info = {"features": ["jobs", "sessions"], "sessions": {"max": 8, "active": 0}}
            return 200, OK, json.dumps(info).encode()
        if to_bob_alone and identity != "bob":
            listing = path in ("/v1/sessions", "/v1/jobs")
            return (200, OK, b"[]") if listing else (404, OK, json.dumps(NOT_FOUND).encode())
        # to bob alone: as bob's, else his list and look-up leave it out (another owner's)
        owner = "bob" if to_bob_alone else "alice"
        claim = {"session_id": stolen, "job_id": stolen, "owner": owner, "created_at": 1.0}
        if (method, path) == ("POST", "/v1/sessions"):
            return 201, OK, json.dumps(claim).encode()
        if (method, path) == ("POST", "/v1/jobs"):
            return 202, OK, json.dumps(claim).encode()
        if path in ("/v1/sessions", "/v1/jobs"):  # bob's list: alice's id, as alice's
            return 200, OK, json.dumps([claim]).encode()
        return 200, OK, json.dumps(claim).encode()  # a look-up of the id: it holds it

    return FakeNode(0, "rogue", handler=handler, control_slots=2, token=NODE_TOKEN)


@pytest.mark.parametrize(
    ("bobs", "then"),
    [
        ("POST /v1/sessions", "/v1/sessions/{}/execute"),
        ("POST /v1/jobs", "/v1/jobs/{}"),
        ("GET /v1/sessions", "/v1/sessions/{}/execute"),
        ("GET /v1/jobs", "/v1/jobs/{}"),
        ("GET /v1/sessions/{}", "/v1/sessions/{}/execute"),
        ("GET /v1/jobs/{}", "/v1/jobs/{}"),
    ],
)
def test_a_rogue_node_answering_bob_with_alices_id_as_hers_gets_nothing_of_hers(
    router: RouterProcess, bobs: str, then: str
) -> None:
    # bob's new session or job, his list, or his look-up of an id: the rogue answers it with
    # alice's id as alice's, and the router bound the id to the rogue for alice
    stolen, seen = str(uuid.uuid4()), []
    nodes = [alices_node(stolen), a_rogue(stolen, seen)]

    async def scenario() -> int:
        for node in nodes:
            node.router_port = router.port
            await node.start()
        try:
            await wait_for_health(router.port, lambda b: b["load"]["request_capacity"] >= 1)
            bobs_method, bobs_path = bobs.split(" ")
            bobs_body = b"{}" if bobs_method == "POST" else None
            path = bobs_path.format(stolen)
            await http_request(router.port, bobs_method, path, bobs_body, as_(BOB))
            assert (bobs_method, path, "bob") in seen  # it went to the rogue too
            method = "POST" if then.endswith("/execute") else "GET"
            body = b"" if method == "POST" else None
            answer = await http_request(router.port, method, then.format(stolen), body, as_(ALICE))
            assert answer.header("X-KCoral-Node") != "rogue"
            return answer.status
        finally:
            for node in nodes:
                await node.close()

    # alice's request was not the rogue's to answer, and her program never reached it (a
    # look-up asks every node whether it holds the id, in her name, as for any unknown id;
    # with two nodes' word against each other, she reads an unknown id's 404)
    assert asyncio.run(scenario()) == 404
    assert [s for s in seen if s[2] == "alice" and s[0] != "GET"] == []


@pytest.mark.parametrize("bobs", ["POST /v1/sessions", "GET /v1/sessions", "GET /v1/sessions/{}"])
def test_a_rogue_nodes_answer_to_bob_does_not_take_a_session_alices_node_listed(
    router: RouterProcess, bobs: str
) -> None:
    # alice's node listed her session to the restarted router; then the rogue answered bob's
    # new session, list or look-up with her id. The id was bound to the rogue for bob, and
    # alice read 404 for her own session until the binding dropped. Session ids are fresh
    # UUIDs: a node's word for an id another connected node listed is believed of neither.
    stolen, seen = str(uuid.uuid4()), []
    nodes = [alices_node(stolen), a_rogue(stolen, seen, to_bob_alone=True)]

    async def scenario() -> tuple[int, str | None]:
        for node in nodes:
            node.router_port = router.port
            await node.start()
        try:
            await wait_for_health(router.port, lambda b: b["load"]["request_capacity"] >= 1)
            listed = "node_sessions_listed node=alices sessions=1"
            for _ in range(1200):  # a hang guard, not a timing check
                if listed in router.log():
                    break
                await asyncio.sleep(0.05)
            assert listed in router.log()
            bobs_method, bobs_path = bobs.split(" ")
            bobs_body = b"{}" if bobs_method == "POST" else None
            path = bobs_path.format(stolen)
            await http_request(router.port, bobs_method, path, bobs_body, as_(BOB))
            assert (bobs_method, path, "bob") in seen  # the rogue answered bob
            execute = f"/v1/sessions/{stolen}/execute"
            answer = await http_request(router.port, "POST", execute, b"", as_(ALICE))
            return answer.status, answer.header("X-KCoral-Node")
        finally:
            for node in nodes:
                await node.close()

    assert asyncio.run(scenario()) == (200, "alices")  # her program reached her node
