"""In a restarted router's first seconds (``--reconnect-grace-seconds``), an id no node knows
is answered 503 "session not found yet" and the client asks again for up to 10 s
(ROUTER §13, EXTENSIONS §11). Where the router can know better it now says so at once: a
session its node listed when it reconnected, and that the node no longer holds (its server
restarted since), gets the final ``410``; and a session's end asked for before its node is
back is kept and answered at once, then carried out when the node lists the session.
Before, both waited the client's 10 s for the 503, a script's ``session.close()`` raised
it, and a kernel's exit (which read the record first) gave up and left the session open. A
real router, restarted on its port, and a real CPU node."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import re
import signal
import urllib.error
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path

import psutil
import pytest
from kcoral_jupyter.notebook_session import NotebookSession, SessionHolder
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.router.routes.session_index import MAX_KEPT_ENDS, SessionIndex
from router_helpers import FakeNode, Node, RouterProcess, ready_nodes, start_router, stopping
from server_process import client_token_file
from test_router_restart_grace import (
    NODE_ENV,
    REMEMBER,
    TOKEN,
    a_session_on_one_node,
    router_on,
    session_call,
)
from waiting import wait_for

import kcoral

pytestmark = pytest.mark.slow


def logs(router: RouterProcess, node: Node) -> Callable[[], str]:
    """The router's log and the node's, what shows why a wait ran out."""
    return lambda: f"{router.log()}\n{node.log_path.read_text()}"


def wait_until_listed(router: RouterProcess, node: Node, node_id: str, sessions: int) -> None:
    """Until ``router`` logs that ``node_id`` listed ``sessions`` sessions as it connected."""
    listed = f"node_sessions_listed node={node_id} sessions={sessions}"
    wait_for(
        lambda: listed in router.log(),
        f"{node_id} listing {sessions} sessions",
        90.0,
        detail=logs(router, node),
    )


def wait_for_its_second_server(router: RouterProcess, node: Node) -> None:
    """Until ``node``'s supervisor has started the server that replaces the one killed."""
    wait_for(
        lambda: node.log_path.read_text().count("server_child_started") == 2,
        "a new server",
        90.0,
        detail=logs(router, node),
    )


def test_a_session_whose_node_restarted_its_server_after_the_router_is_ended_at_once(
    tmp_path: Path,
) -> None:
    with a_session_on_one_node(tmp_path) as (router, node, _client, session):
        router.stop()
        restarted = router_on(tmp_path, router.port)
        with stopping(restarted, []):
            wait_until_listed(restarted, node, "only", 1)
            os.kill(node.server_pid(), signal.SIGKILL)  # its supervisor starts another
            wait_for_its_second_server(restarted, node)
            ready_nodes(restarted, 1)
            with pytest.raises(kcoral.KCoralError) as ended:
                session.execute(session_call(REMEMBER, 42))
    assert (ended.value.status_code, ended.value.kind) == (410, "session_ended")
    assert ended.value.message == (
        "session ended: its node only restarted its server; its state is lost"
    )


def end_as_a_kernel_exits(session: kcoral.Session, router: RouterProcess) -> None:
    """What a notebook's kernel does with its session as it exits (``atexit``)."""
    holder = SessionHolder()
    holder.current = NotebookSession(session, router.url, TOKEN, keep=False)
    holder.end_at_exit()


@pytest.mark.parametrize("closed_by", ["script", "kernel exit", "script, a rogue node listing"])
def test_a_session_closed_before_its_node_is_back_is_ended_there_when_it_is(
    tmp_path: Path, closed_by: str
) -> None:
    # "a rogue node listing": a rogue node (it holds the node token) that learnt alice's
    # session id connects to the restarted router before her node and lists the id. The end
    # was sent to the rogue alone, and her session, told ended, ran on to its idle timeout.
    with a_session_on_one_node(tmp_path) as (router, node, client, session):
        os.kill(node.process.pid, signal.SIGSTOP)  # its supervisor cannot reconnect yet
        try:
            router.stop()
            restarted = router_on(tmp_path, router.port)
            with stopping(restarted, []):
                # answered at once: a script's close raised the 503 after 10 s, and a
                # kernel's exit waited 10 s for its read of the record, then gave up
                if closed_by == "kernel exit":
                    end_as_a_kernel_exits(session, restarted)
                else:
                    session.close()
                if closed_by.endswith("a rogue node listing"):
                    asyncio.run(a_rogue_lists(restarted, node, session.id))
                os.kill(node.process.pid, signal.SIGCONT)
                ended = partial(ended_on_its_node, client, session.id)
                wait_for(ended, "the node ends it", 90.0, detail=logs(restarted, node))
                record = client.attach_session(session.id).info()
                # the node's answer to the kept end is said (ROUTER §10)
                done = f"kept_session_end_done node=only session={session.id}"
                assert done in restarted.wait_log(done)
        finally:
            os.kill(node.process.pid, signal.SIGCONT)
    assert record["end_reason"] == "deleted"


def ended_on_its_node(client: kcoral.Client, session_id: str) -> bool:
    try:
        record = client.attach_session(session_id).info()
    except kcoral.KCoralError:
        return False
    return record["state"] == "ENDED"


async def a_rogue_lists(router: RouterProcess, node: Node, session_id: str) -> None:
    """A fake node ``rogue`` lists ``session_id`` as alice's, then leaves."""

    async def rogue(head: pb.RequestHead, body: bytes):
        record = {"session_id": session_id, "owner": "alice", "created_at": 1.0}
        answer = [record] if any(h.value == b"GET" for h in head.headers) else record
        return 200, [(b"content-type", b"application/json")], json.dumps(answer).encode()

    token = NODE_ENV["KCORAL_NODE_TOKEN"]
    fake = FakeNode(router.port, "rogue", handler=rogue, control_slots=2, token=token)
    await fake.start()
    try:
        await asyncio.to_thread(wait_until_listed, router, node, "rogue", 1)
    finally:
        await fake.close()


def delete_status(router: RouterProcess, session_id: str) -> int:
    """The status of alice's ``DELETE`` of her session, sent once (the client asks again)."""
    request = urllib.request.Request(
        f"{router.url}/v1/sessions/{session_id}",
        method="DELETE",
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return int(refused.code)


def an_end_its_busy_node_misses(
    tmp_path: Path, meanwhile: Callable[[RouterProcess, Node], None] = lambda *_: None
) -> tuple[int, dict]:
    """A router restarted under alice's session, whose node lists it; then ``meanwhile``, and
    alice's ``DELETE`` of it sent once while the node's server is stopped (its look-up waits
    for it, then goes without); then her client's close. The ``DELETE``'s status and the
    session's record after the close.

    The stopped server fails its supervisor's probes: past the start-up grace (60 s from
    ``Node``) the supervisor killed it during the ``DELETE`` under load, and the session with
    it. Its grace here outlasts the test, and the server is checked stopped throughout."""
    grace = ("--startup-grace-seconds", "3600")  # the supervisor never replaces the server
    with a_session_on_one_node(tmp_path, *grace) as (router, node, _client, session):
        router.stop()
        tokens = client_token_file(tmp_path, f"alice {TOKEN}\n")
        args = ("--port", str(router.port), "--auth-token-file", str(tokens))
        restarted = start_router(tmp_path, *args, "--reconnect-grace-seconds", "600", env=NODE_ENV)
        with stopping(restarted, []):
            wait_until_listed(restarted, node, "only", 1)
            meanwhile(restarted, node)
            server = node.stop_server()
            try:
                status = delete_status(restarted, session.id)
                # the server that listed the session missed the look-up: it was stopped
                stopped = psutil.pid_exists(server) and psutil.Process(server).status() == "stopped"
                assert stopped, logs(restarted, node)()
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(server, signal.SIGCONT)
            ready_nodes(restarted, 1)
            session.close()
            with kcoral.Client(restarted.url, token=TOKEN) as client:
                return status, client.attach_session(session.id).info()


def test_an_end_is_not_said_done_where_the_node_that_listed_the_session_missed_its_look_up(
    tmp_path: Path,
) -> None:
    # The node listed the session as it connected, then did not answer the look-up of its
    # DELETE in time (its server busy; likewise a node that connected while the look-up
    # was under way). The router kept the end for a listing that never comes again and
    # answered 410 "session ended for you": the session ran on. Now 503, and the client's
    # end, asked again, reaches the node.
    status, record = an_end_its_busy_node_misses(tmp_path)
    assert status == 503
    assert (record["state"], record["end_reason"]) == ("ENDED", "deleted")


FLOOD = SessionIndex().capacity + 1


def a_rogue_floods(router: RouterProcess, node: Node) -> None:
    """A fake node ``rogue`` lists more made-up session ids than the router's table holds,
    then leaves."""
    made_up = (f"{number:08x}-0000-4000-8000-000000000000" for number in range(FLOOD))
    listing = [{"session_id": i, "owner": "mallory", "created_at": 1.0} for i in made_up]
    body = json.dumps(listing).encode()

    async def rogue(head: pb.RequestHead, _body: bytes):
        return 200, [(b"content-type", b"application/json")], body

    async def flood() -> None:
        token = NODE_ENV["KCORAL_NODE_TOKEN"]
        fake = FakeNode(router.port, "rogue", handler=rogue, control_slots=2, token=token)
        await fake.start()
        try:
            await asyncio.to_thread(wait_until_listed, router, node, "rogue", FLOOD)
        finally:
            await fake.close()

    asyncio.run(flood())


def test_a_rogue_nodes_flood_of_listed_ids_leaves_the_real_nodes_listing_in_place(
    tmp_path: Path,
) -> None:
    # A rogue node (it holds the node token) lists 100,001 made-up ids right after alice's
    # node listed her session: they pushed her node's listing out of the router's table,
    # and her DELETE, whose look-up her busy node missed, was kept and answered 410 "ended
    # for you" for a listing that had come already: her session ran on. Each node's
    # listing now has its share, and the flood loses its own entries.
    status, record = an_end_its_busy_node_misses(tmp_path, a_rogue_floods)
    assert status == 503  # not kept: the client asks again, and its end reaches the node
    assert (record["state"], record["end_reason"]) == ("ENDED", "deleted")


def test_a_token_holders_flood_of_ends_in_the_grace_is_told_to_ask_again_past_its_bound(
    tmp_path: Path,
) -> None:
    # Before any node is back, ending a made-up id costs the router nothing, and each was
    # kept and answered 410: mallory's ends of more ids than the table holds pushed alice's
    # out, and her session, told ended, ran on. Past 1024 kept ends mallory's read the 503.
    tokens = client_token_file(tmp_path, f"alice {TOKEN}\nmallory mallory-token\n")
    args = ("--auth-token-file", str(tokens), "--reconnect-grace-seconds", "600")
    router = start_router(tmp_path, *args, env=NODE_ENV)
    with stopping(router, []):
        connection = http.client.HTTPConnection("127.0.0.1", router.port, timeout=60)
        statuses = []
        for number in range(MAX_KEPT_ENDS + 1):
            made_up = f"{number:08x}-0000-4000-8000-000000000000"
            connection.request(
                "DELETE",
                f"/v1/sessions/{made_up}",
                headers={"Authorization": "Bearer mallory-token"},
            )
            answer = connection.getresponse()
            answer.read()
            statuses.append(answer.status)
        connection.close()
        alices = delete_status(router, "0c8f7a4e-4d7e-4a51-9d55-0000000000aa")
    assert statuses == [410] * MAX_KEPT_ENDS + [503]
    assert alices == 410  # another caller's end is still kept


def test_a_session_whose_node_restarted_before_reconnecting_reads_so_not_only_not_yet(
    tmp_path: Path,
) -> None:
    # The node's server restarted while the router was down, so the node came back without
    # the session and listed none: the router has nothing to say it ended. Its 503 said
    # "the node that holds it may not have reconnected", untrue of the node that had.
    with a_session_on_one_node(tmp_path) as (router, node, _client, session):
        router.stop()
        os.kill(node.server_pid(), signal.SIGKILL)  # its supervisor starts another
        wait_for_its_second_server(router, node)
        restarted = router_on(tmp_path, router.port)
        with stopping(restarted, []):
            wait_until_listed(restarted, node, "only", 0)
            request = urllib.request.Request(
                f"{restarted.url}/v1/sessions/{session.id}",
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=120)
            error = json.loads(refused.value.read())["error"]
    assert (refused.value.code, error["kind"]) == (503, "no_node")
    assert re.fullmatch(
        "session not found yet: the router started [0-9]+ s ago, and the node back since does"
        " not hold it: its node has not reconnected yet, or restarted and lost it",
        error["message"],
    )
