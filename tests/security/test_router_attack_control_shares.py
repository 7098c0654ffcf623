"""Attacks: one client-token holder's event streams take all but one control slot of a
node, so that every other identity's streams wait for his to end; or fill the router's
waiting room for control slots, so that every other identity's control request is refused
(docs/scaling.md, "Control slots"; ROUTER §7).

A node opens control slots as they fill, up to 64, and a request that holds its slot long
(an event stream, a session's program, a result read slowly) never takes the last free
one; but bob's 63 streams held the other 63, and alice's stream on her own job waited (her
``kcoral run``, which asks the server to cancel a job nobody follows for 60 s, could lose
its job meanwhile). With two or more identities, one holds at most half of a node's
control-slot ceiling (32 of 64) in long-held requests; past it, his request waits for one
of his own to end, while alice's is served.

The waiting room for control slots (``--max-queued-requests``, as the programs' queue) was
shared the same way: bob's streams waiting for a node's control slots filled it, and
alice's got ``503 router queue is full``. With two or more identities, one holds at most
half of it, as in the programs' queue (``test_router_attack_queue_share.py``).

The router runs in the test's process so that the test sees which slots are taken and what
waits, never a time; a fake node holds 64 control slots (a real one opens them as they
fill) and answers no stream until the test lets it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import tornado.httpserver
import tornado.netutil
import tornado.web
from kcoral_server.node.control_slots import CONTROL_SLOTS_ENV
from kcoral_server.node.tunnel import Tunnel
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.router.nodes.slot import CONTROL

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from router_helpers import FakeNode, InProcessRouter, Response, http_request, in_process_router

ALICE, BOB = "alice-share-token-7a3f", "bob-share-token-1c9e"
NODE_TOKEN = "share-node-token-5b2d"
CONTROL_SLOTS = 64  # the ceiling a real node grows to
SIX = 6  # a node's control slots where KCORAL_NODE_CONTROL_SLOTS fixes them


def pseudo(head: pb.RequestHead, name: bytes, default: str) -> str:
    values = [h.value.decode() for h in head.headers if h.name == name]
    return values[0] if values else default


@contextlib.asynccontextmanager
async def routed_fake_node(
    tmp: Path, *args: str, control_slots: int = CONTROL_SLOTS
) -> AsyncIterator[tuple[InProcessRouter, FakeNode, list[str]]]:
    """An in-process router with alice's and bob's tokens and a fake node whose jobs'
    event streams stay open until the end; yields the paths the node received."""
    tokens = tmp / "clients"
    tokens.write_text(f"alice {ALICE}\nbob {BOB}\n")
    tokens.chmod(0o600)
    release = asyncio.Event()
    received: list[str] = []
    submitted = 0

    async def handler(head: pb.RequestHead, body: bytes):
        nonlocal submitted
        path = pseudo(head, b":path", "/execute")
        received.append(path)
        ok = [(b"content-type", b"application/json")]
        if path == "/v1/jobs":
            submitted += 1
            job = {"job_id": f"job-{submitted}", "status": "QUEUED", "request_id": "r"}
            return 202, ok, json.dumps(job).encode()
        if path.endswith("/events"):
            await release.wait()
            return 200, [(b"content-type", b"text/event-stream")], b"id: 1\nevent: phase\n\n"
        return 404, ok, b"{}"

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KCORAL_NODE_TOKEN", NODE_TOKEN)
        async with in_process_router("--auth-token-file", str(tokens), *args) as router:
            node = FakeNode(
                router.grpc_port,
                "node-a",
                control_slots=control_slots,
                token=NODE_TOKEN,
                handler=handler,
            )
            await node.start()
            try:
                await until(lambda: router.state.registry.any_ready_with_slots(), "the node ready")
                yield router, node, received
            finally:
                release.set()
                await node.close()


async def until(condition: Callable[[], object], what: str) -> None:
    """Wait until ``condition`` holds (a hang guard, not a timing check)."""
    for _ in range(2400):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never: {what}")


async def submit(router: InProcessRouter, token: str) -> str:
    answer = await http_request(
        router.port, "POST", "/v1/jobs", b"program", [("Authorization", f"Bearer {token}")]
    )
    assert answer.status == 202, answer
    return str(answer.json()["job_id"])


async def follow(router: InProcessRouter, job_id: str, token: str) -> asyncio.StreamReader:
    """Open ``job_id``'s event stream and leave it open (its answer is not read)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    writer.write(
        f"GET /v1/jobs/{job_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {token}\r\n\r\n".encode()
    )
    await writer.drain()
    return reader


async def events(router: InProcessRouter, job_id: str, token: str) -> Response:
    """``GET`` ``job_id``'s event stream, its answer read whole."""
    headers = [("Authorization", f"Bearer {token}")]
    return await http_request(router.port, "GET", f"/v1/jobs/{job_id}/events", headers=headers)


def taken(router: InProcessRouter) -> int:
    node = router.state.registry.nodes["node-a"]
    return len(node.current_slots(CONTROL)) - len(node.idle_slots(CONTROL))


async def bob_then_alice(
    router: InProcessRouter, received: list[str], count: int
) -> tuple[list[asyncio.StreamReader], bool, tuple[int, int]]:
    """bob's ``count`` event streams on his job, each taken in or waiting, then alice's one
    on hers: the streams held, whether alice's reached the node, and bob's streams then
    taken in and waiting."""
    bobs_job, alices_job = await submit(router, BOB), await submit(router, ALICE)
    held = [await follow(router, bobs_job, BOB) for _ in range(count)]
    control = router.state.control
    await until(
        lambda: taken(router) + control.waiting == count, "bob's streams taken in or waiting"
    )
    bobs = (taken(router), control.waiting)
    held.append(await follow(router, alices_job, ALICE))
    alices_path = f"/v1/jobs/{alices_job}/events"
    await until(
        lambda: alices_path in received or control.waiting > bobs[1],
        "alice's stream taken in or waiting",
    )
    return held, alices_path in received, bobs


def opened(router: InProcessRouter) -> int:
    return len(router.state.registry.nodes["node-a"].current_slots(CONTROL))


def test_one_identitys_event_streams_leave_other_identities_half_a_nodes_control_slots(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with routed_fake_node(tmp_path) as (router, _node, received):
            held, alice_served, _bobs = await bob_then_alice(router, received, CONTROL_SLOTS)
            # before: bob held 63 (all but the node's last free one), alice's stream waited
            assert alice_served
            control = router.state.control
            assert (taken(router), control.waiting) == (CONTROL_SLOTS // 2 + 1, CONTROL_SLOTS // 2)
            assert len(held) == CONTROL_SLOTS + 1

    asyncio.run(scenario())


def test_a_stream_past_its_share_is_told_so_after_the_queue_wait(tmp_path: Path) -> None:
    async def scenario() -> None:
        args = ("--queue-wait-timeout-seconds", "1")
        async with routed_fake_node(tmp_path, *args) as (router, _node, _received):
            bobs_job = await submit(router, BOB)
            held = [await follow(router, bobs_job, BOB) for _ in range(CONTROL_SLOTS // 2)]
            await until(lambda: taken(router) == CONTROL_SLOTS // 2, "bob's streams taken in")
            asked = asyncio.ensure_future(events(router, bobs_job, BOB))
            await until(
                lambda: asked.done() or taken(router) > CONTROL_SLOTS // 2, "bob's stream 33"
            )
            assert asked.done(), "bob's 33rd stream took a slot"  # before: it did
            answer = asked.result()
            assert answer.status == 503, answer
            error = answer.json()["error"]
            assert error["kind"] == "router_busy", error
            assert error["message"] == (
                "you hold 32 event streams, session programs or result reads on node "
                "node-a, the most one identity may (half of its 64 control slots); this "
                "request waited for one of them to end until the queue wait ran out"
            )
            assert len(held) == CONTROL_SLOTS // 2

    asyncio.run(scenario())


def test_one_identity_holds_at_most_half_the_waiting_room_for_control_slots(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        args = ("--max-queued-requests", "4")
        async with routed_fake_node(tmp_path, *args, control_slots=2) as (router, _, received):
            bobs_job, alices_job = await submit(router, BOB), await submit(router, ALICE)
            control = router.state.control
            held = [await follow(router, bobs_job, BOB)]  # takes one slot, leaves the last
            await until(lambda: taken(router) == 1, "bob's first stream taken in")
            bobs = [asyncio.ensure_future(events(router, bobs_job, BOB)) for _ in range(4)]
            await until(
                lambda: sum(t.done() for t in bobs) + control.waiting == 4,
                "bob's streams waiting (a stream never takes a node's last free slot) or refused",
            )
            # before: all four waited, the whole room, and alice's got 503 at once
            refused = [t.result() for t in bobs if t.done()]
            assert [answer.status for answer in refused] == [503, 503], refused
            assert refused[0].json()["error"]["message"] == (
                "router queue: you hold 2 requests waiting for a node, the most one identity "
                "may (half of --max-queued-requests 4); send again once one of yours has "
                "reached a node"
            )
            alices = asyncio.ensure_future(events(router, alices_job, ALICE))
            await until(lambda: alices.done() or control.waiting == 3, "alice's stream waiting")
            assert not alices.done(), alices.result()
            assert len(held) == 1 and f"/v1/jobs/{alices_job}/events" not in received

    asyncio.run(scenario())


class StandInChild(tornado.web.RequestHandler):
    """The node's child server, as far as the tunnel reaches it: ``POST /v1/jobs`` takes a
    job, a job's event stream stays open until the test ends it."""

    def initialize(self, release: asyncio.Event, received: list[str]) -> None:
        self.release, self.received = release, received

    def post(self) -> None:
        self.received.append(self.request.path)
        self.set_status(202)
        self.finish({"job_id": f"child-job-{len(self.received)}", "status": "QUEUED"})

    async def get(self, _job_id: str) -> None:
        self.received.append(self.request.path)
        await self.release.wait()
        self.set_header("Content-Type", "text/event-stream")
        self.finish(b"id: 1\nevent: phase\n\n")


def test_a_node_with_six_control_slots_leaves_another_identity_half_of_them(
    tmp_path: Path,
) -> None:
    """A node whose ``KCORAL_NODE_CONTROL_SLOTS`` fixes 6 says so in its slots' hellos, and
    bob's event streams hold 3 of them; before, the router took every node's ceiling for 64,
    bob's streams held 5 (all but the last free one) and alice's stream waited."""

    async def scenario() -> None:
        release, received = asyncio.Event(), []
        routes = [(r"/v1/jobs", StandInChild), (r"/v1/jobs/([^/]+)/events", StandInChild)]
        app = tornado.web.Application(
            [
                (path, handler, {"release": release, "received": received})
                for path, handler in routes
            ]
        )
        child = tornado.httpserver.HTTPServer(app)
        sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
        child.add_sockets(sockets)
        child_url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
        async with routed_fake_node(tmp_path, control_slots=0) as (router, node, _):
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv(CONTROL_SLOTS_ENV, str(SIX))
                endpoint = f"http://127.0.0.1:{router.grpc_port}"
                tunnel = Tunnel(
                    endpoint, "node-a", NODE_TOKEN, node.instance_id, child_url, 1, None
                )
            tunnel.start()
            try:
                await until(lambda: taken(router) == 0 and opened(router) == SIX, "six slots")
                held, alice_served, bobs = await bob_then_alice(router, received, SIX)
                assert bobs == (SIX // 2, SIX // 2)  # taken in, waiting
                assert alice_served  # before: her stream waited for one of bob's to end
                assert taken(router) == SIX // 2 + 1
                assert len(held) == SIX + 1
            finally:
                release.set()
                await tunnel.close()
                child.stop()

    asyncio.run(scenario())
