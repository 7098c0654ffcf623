"""A rogue node (it holds the node token) beside alice's real node, at a restarted router: it
connects while her node is still away, and answers for her session or job, which it learnt.
The router bound the id to the rogue first and kept it there after her node was back and
listed it: bob's new session or look-up, answered by the rogue with her id, left her reading
404 for her own session and job, and the rogue's own claim to her look-up kept her programs
going to the rogue. A rogue that flooded the listing and stayed connected made every end kept
in the grace read 503, so her session's end was never carried out (ROUTER §13). A real router
restarted on its port, a real CPU node, and a fake rogue node over the router's real gRPC."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.router.routes.session_index import SessionIndex
from router_helpers import FakeNode, Node, RouterProcess, ready_nodes, start_router, stopping
from server_process import client_token_file
from test_router_restart_grace import (
    NODE_ENV,
    RECALL,
    REMEMBER,
    TOKEN,
    free_port,
    session_call,
    slow_prints,
)
from waiting import wait_for

import kcoral

pytestmark = pytest.mark.slow

BOB = "rogue-beside-bob-token"
OK = [(b"content-type", b"application/json")]
NOT_FOUND = {"status": "ERROR", "request_id": "x", "error": {"kind": "not_found"}}
#: what the rogue answers a request: (method, path, identity) -> (status, document)
Answers = Callable[[str, str, str], tuple[int, Any]]


def router_on(tmp_path: Path, port: int) -> RouterProcess:
    """A router with alice's and bob's tokens, its grace long enough for every step here."""
    tokens = client_token_file(tmp_path, f"alice {TOKEN}\nbob {BOB}\n")
    args = ("--port", str(port), "--auth-token-file", str(tokens))
    return start_router(tmp_path, *args, "--reconnect-grace-seconds", "600", env=NODE_ENV)


def seen(text: str, router: RouterProcess, node: Node) -> None:
    """Wait until ``router`` logs ``text`` (a hang guard, not a timing check)."""

    def logs() -> str:
        return f"{router.log()}\n{node.log_path.read_text()}"

    wait_for(lambda: text in router.log(), text, 120, detail=logs)


@contextmanager
def restarted_with_a_rogue(
    tmp_path: Path, answers: Answers, do: Callable[[kcoral.Client], Any]
) -> Iterator[tuple[RouterProcess, Node, kcoral.Client, Any]]:
    """Alice's real node ``only`` and what ``do`` made on it through a router (its result);
    then the router restarted on its port while her node is stopped, a rogue node connected
    there (it answers as ``answers`` says), her node let go and back, its sessions listed."""
    router = router_on(tmp_path, free_port())
    node = Node(tmp_path, router, "only", NODE_ENV)
    with stopping(router, [node]):
        ready_nodes(router, 1)
        with kcoral.Client(router.url, token=TOKEN) as client:
            made = do(client)
            os.kill(node.process.pid, signal.SIGSTOP)  # its supervisor cannot reconnect yet
            try:
                router.stop()
                restarted = router_on(tmp_path, router.port)
                with stopping(restarted, []), a_rogue(restarted, answers):
                    seen("node=rogue", restarted, node)
                    yield restarted, node, client, made
            finally:
                os.kill(node.process.pid, signal.SIGCONT)


def node_back(router: RouterProcess, node: Node) -> None:
    """Let alice's node go on, and wait until it has listed its sessions to ``router``."""
    os.kill(node.process.pid, signal.SIGCONT)
    seen("node_sessions_listed node=only", router, node)


@contextmanager
def a_rogue(router: RouterProcess, answers: Answers) -> Iterator[FakeNode]:
    """A fake node ``rogue`` with the node token, served on its own event loop (the test's
    clients block), offering free session seats; ``answers`` answers the rest."""

    async def handler(head: pb.RequestHead, body: bytes) -> tuple[int, Any, bytes]:
        named = {h.name.decode(): h.value.decode() for h in head.headers}
        method, path = named.get(":method", ""), named.get(":path", "")
        identity = named.get("x-kcoral-identity", "").split(";")[0]
        if path == "/v1/info":
            info = {"features": ["jobs", "sessions"], "sessions": {"max": 8, "active": 0}}
            return 200, OK, json.dumps(info).encode()
        status, document = answers(method, path, identity)
        encoded = document if isinstance(document, bytes) else json.dumps(document).encode()
        return status, OK, encoded

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    token = NODE_ENV["KCORAL_NODE_TOKEN"]
    rogue = FakeNode(router.port, "rogue", handler=handler, control_slots=4, token=token)
    try:
        asyncio.run_coroutine_threadsafe(rogue.start(), loop).result(60)
        yield rogue
    finally:
        asyncio.run_coroutine_threadsafe(rogue.close(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(60)
        loop.close()


def ask(router: RouterProcess, method: str, path: str, token: str) -> tuple[int, Any]:
    """One request, sent once (the client would ask again on a 503): its status and body."""
    body = b"{}" if method == "POST" else None
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    request = urllib.request.Request(router.url + path, body, headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def a_session_holding_41(client: kcoral.Client) -> kcoral.Session:
    session = client.session()
    assert session.execute(session_call(REMEMBER, 41))["value"] == 41
    return session


def claims(held: str, owner: str, to: str) -> Answers:
    """The rogue lists nothing to the router and claims ``held`` as ``owner``'s to ``to`` (a
    new session's 201, a job's or a session's look-up); anything else is unknown to it."""

    def answers(method: str, path: str, identity: str) -> tuple[int, Any]:
        record = {"session_id": held, "job_id": held, "owner": owner, "created_at": 1.0}
        if identity == "kcoral-router":
            return 200, []
        if identity == to and (method, path) == ("POST", "/v1/sessions"):
            return 201, record
        if identity == to and method == "GET" and path.endswith(held):
            return 200, record
        return 404, NOT_FOUND

    return answers


@pytest.mark.parametrize("taken_by", ["bob's new session", "her own look-up"])
def test_a_session_a_rogue_node_was_bound_to_first_goes_back_to_her_node_when_it_lists_it(
    tmp_path: Path, taken_by: str
) -> None:
    # "bob's new session": the rogue answers bob's POST with her id, so it was bound to the
    # rogue for bob, and her look-up, which her node answered alone, read 404 (her node could
    # not get the id). "her own look-up": the rogue claims her id to her while her node is
    # away, and her programs kept going to the rogue after her node listed the id.
    stolen: dict[str, str] = {}

    def answers(method: str, path: str, identity: str) -> tuple[int, Any]:
        to = "bob" if taken_by.startswith("bob") else "alice"
        return claims(stolen["id"], to, to)(method, path, identity)

    with restarted_with_a_rogue(tmp_path, answers, a_session_holding_41) as (
        router,
        node,
        _client,
        session,
    ):
        stolen["id"] = session.id
        if taken_by.startswith("bob"):
            created = ask(router, "POST", "/v1/sessions", BOB)
            assert (created[0], created[1]["session_id"]) == (201, session.id)
        else:
            assert ask(router, "GET", f"/v1/sessions/{session.id}", TOKEN)[0] == 200
        node_back(router, node)
        recalled = session.execute(session_call(RECALL))
    assert recalled["value"] == 41  # her node's state: the rogue never held it


def a_finished_job(client: kcoral.Client) -> str:
    job = client.submit(slow_prints(2))
    assert job.result()["count"] == 2
    return job.id


def test_her_job_that_a_rogue_node_claimed_to_bob_is_read_from_her_node(tmp_path: Path) -> None:
    # The rogue answers bob's look-up of her job id as bob's job, so the id was bound to the
    # rogue for bob; her own reads, which the rogue answers 404, read 404 until that binding
    # dropped, though her node, back, holds the job.
    stolen: dict[str, str] = {}

    def answers(method: str, path: str, identity: str) -> tuple[int, Any]:
        return claims(stolen["id"], "bob", "bob")(method, path, identity)

    with restarted_with_a_rogue(tmp_path, answers, a_finished_job) as (router, node, client, job):
        stolen["id"] = job
        assert ask(router, "GET", f"/v1/jobs/{job}", BOB)[0] == 200  # bound to the rogue
        node_back(router, node)
        status, record = ask(router, "GET", f"/v1/jobs/{job}", TOKEN)
        result = client.job(job).result()
    assert (status, record.get("owner"), record["status"]) == (200, "alice", "COMPLETED")
    assert result["count"] == 2


def test_her_job_a_rogue_node_claimed_to_her_then_disowned_is_read_from_her_node(
    tmp_path: Path,
) -> None:
    # The rogue claims her job to her own look-up while her node is away, so the id was
    # bound to the rogue for her; then it answers her reads 404, and she read that (in the
    # grace, "job not found yet") until the binding dropped, her node back and holding it.
    stolen: dict[str, str] = {}

    def answers(method: str, path: str, identity: str) -> tuple[int, Any]:
        if "disowned" in stolen:
            return claims(stolen["id"], "alice", "nobody")(method, path, identity)
        return claims(stolen["id"], "alice", "alice")(method, path, identity)

    with restarted_with_a_rogue(tmp_path, answers, a_finished_job) as (router, node, _, job):
        stolen["id"] = job
        assert ask(router, "GET", f"/v1/jobs/{job}", TOKEN)[0] == 200  # bound to the rogue
        node_back(router, node)
        stolen["disowned"] = job
        disowned, _record = ask(router, "GET", f"/v1/jobs/{job}", TOKEN)
        status, record = ask(router, "GET", f"/v1/jobs/{job}", TOKEN)
    assert disowned == 503  # the rogue's 404, in the grace: "job not found yet"
    assert (status, record.get("owner"), record["status"]) == (200, "alice", "COMPLETED")


FLOOD = SessionIndex().capacity + 1


def floods(method: str, path: str, identity: str) -> tuple[int, Any]:
    """The rogue lists more made-up ids than the router's table holds, and holds nothing."""
    if identity != "kcoral-router":
        return 404, NOT_FOUND
    made_up = (f"{number:08x}-0000-4000-8000-000000000000" for number in range(FLOOD))
    listing = [{"session_id": i, "owner": "mallory", "created_at": 1.0} for i in made_up]
    return 200, json.dumps(listing).encode()


def test_her_end_kept_while_a_rogue_that_flooded_the_listing_stays_is_carried_out(
    tmp_path: Path,
) -> None:
    # The rogue's listing lost entries to the table's bound, and while it stayed connected
    # every end in the grace read 503 "not found yet" (it may have listed the id): her
    # client asked again for 10 s and raised it, and her session ran on. Now the end is kept
    # (and sent to the rogue too, which answers 404), and her node ends it when it lists it.
    with restarted_with_a_rogue(tmp_path, floods, a_session_holding_41) as (
        router,
        node,
        client,
        session,
    ):
        seen(f"node_sessions_listed node=rogue sessions={FLOOD}", router, node)
        session.close()  # answered at once: 410, kept
        node_back(router, node)
        seen(f"kept_session_end_done node=only session={session.id}", router, node)
        record = client.attach_session(session.id).info()
    assert (record["state"], record["end_reason"]) == ("ENDED", "deleted")
