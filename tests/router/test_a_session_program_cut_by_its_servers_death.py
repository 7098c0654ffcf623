"""A session's program running when its node's server dies (ROUTER §13): the first answer
says the session ended with that server (``410 session_ended``), as the next request's
does; before, it was the router's bare ``502 server_transport`` ('the server's connection
failed'), and only the next call said the session's state was gone.

A real router and a real CPU node; the server is killed (SIGKILL, as a crash) while the
session's program waits for a file, and its supervisor starts a new one. A slot that breaks
alone while its server lives (the router in the test's process, a fake node) keeps the
``502`` and the session.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import uuid
from pathlib import Path

import psutil
import pytest
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from router_helpers import (
    FakeNode,
    Node,
    http_request,
    in_process_router,
    ready_nodes,
    start_router,
    stopping,
)

import kcoral
from kcoral.errors import KCoralError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
ALICE = "alice-cut-session-token-3e8a"
NODES_ENV = {"KCORAL_NODE_TOKEN": "cut-session-node-token-9d1f"}

WAIT = """
import os, time
def f(started, go):
    open(started, "w").close()
    while not os.path.exists(go):
        time.sleep(0.05)
    return "done"
"""


def program(*args: object) -> kcoral.Program:
    built = kcoral.Program()
    module = built.upload(kind="module", source=WAIT)
    function = built.get_function(module=module, name="f")
    built.return_(key="r", value=built.run(fn=function, args=list(args)))
    return built


def test_a_session_program_cut_by_its_servers_death_says_the_session_ended(
    tmp_path: Path,
) -> None:
    tokens = tmp_path / "client-tokens"
    tokens.write_text(f"alice {ALICE}\n")
    tokens.chmod(0o600)
    router = start_router(
        tmp_path,
        "--auth-token-file",
        str(tokens),
        "--reconnect-grace-seconds",
        "0",
        env=NODES_ENV,
    )
    node = Node(tmp_path, router, "cut-a", NODES_ENV)
    started, go = tmp_path / "started", tmp_path / "go"
    with stopping(router, [node]):
        ready_nodes(router, 1)
        with kcoral.Client(router.url, token=ALICE) as client:
            session = client.session()
            outcome: list[object] = []

            def run() -> None:
                try:
                    outcome.append(session.execute(program(str(started), str(go))))
                except KCoralError as exc:
                    outcome.append(exc)

            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            try:
                for _ in range(1200):  # a hang guard, not a timing check
                    if started.exists():
                        break
                    threading.Event().wait(0.05)
                assert started.exists(), "the session's program never started"
                psutil.Process(node.server_pid()).send_signal(signal.SIGKILL)
                thread.join(120)
            finally:
                go.touch()
            [error] = outcome
            assert isinstance(error, KCoralError), error
            # before: 502 server_transport
            assert (error.status_code, error.kind) == (410, "session_ended"), error
            # Either is true, and which comes first is a race: the router sees every slot
            # of the dead server closed, or the supervisor reports the server it started
            # after it.
            assert str(error.message) in (
                "session ended: its node cut-a lost its server while a program of the session "
                "ran; its state is lost",
                "session ended: its node cut-a restarted its server; its state is lost",
            ), error
            session.close()


OK = [(b"content-type", b"application/json")]


def test_a_session_program_whose_slot_breaks_alone_keeps_the_session(tmp_path: Path) -> None:
    asyncio.run(cut_a_live_servers_session_program(every_slot=False))


def test_a_live_server_whose_every_slot_dropped_and_came_back_keeps_the_session() -> None:
    # Its slots share one connection: a dropped connection closes them all, as a dead
    # server's, and the tunnel reconnects them. Told gone as soon as every slot had closed,
    # the session was ended for the router while its server still held it (review).
    asyncio.run(cut_a_live_servers_session_program(every_slot=True))


async def cut_a_live_servers_session_program(*, every_slot: bool) -> None:
    """A session's program cut off while its (fake) node's server lives: its slot alone
    breaks, or every slot closes and the node opens new ones; the answer is ``502`` and
    the session lives on."""
    release = asyncio.Event()
    made: dict[str, bytes] = {}

    async def handler(head: pb.RequestHead, body: bytes):
        pseudo = {h.name: h.value.decode() for h in head.headers}
        path = pseudo.get(b":path", "/execute")
        if path == "/v1/info":
            counts = {"max": 2, "active": len(made), "idle_timeout_seconds": 600}
            info = {"features": ["jobs", "sessions"], "sessions": counts}
            return 200, OK, json.dumps(info).encode()
        if path == "/v1/sessions" and pseudo.get(b":method") == "GET":
            # the router's listing of a node's sessions as the node connects (ROUTER §13)
            return 200, OK, json.dumps([json.loads(record) for record in made.values()]).encode()
        if path == "/v1/sessions":
            session_id = str(uuid.uuid4())
            owner = pseudo[b"x-kcoral-identity"]
            made[session_id] = json.dumps({"session_id": session_id, "owner": owner}).encode()
            return 201, OK, made[session_id]
        if path.endswith("/execute"):
            await release.wait()
        return 200, OK, made[path.split("/")[3]]

    async def scenario() -> None:
        async with in_process_router() as router:
            node = FakeNode(router.grpc_port, "alive-a", control_slots=4, handler=handler)
            await node.start()
            try:
                while not router.state.registry.any_ready_with_slots():  # a hang guard
                    await asyncio.sleep(0.05)
                created = await http_request(router.port, "POST", "/v1/sessions", b"{}")
                session_id = created.json()["session_id"]
                path = f"/v1/sessions/{session_id}/execute"
                running = asyncio.ensure_future(http_request(router.port, "POST", path, b"x"))
                slots = router.state.registry.nodes["alive-a"].slots.values()
                while not [s for s in slots if s.busy and s.kind == "control"]:
                    await asyncio.sleep(0.05)
                [slot] = [s for s in slots if s.busy and s.kind == "control"]
                broken = list(slots) if every_slot else [slot]
                for each in broken:  # their streams broke; the server lives
                    each.close(None, "tunnel_disconnected")
                if every_slot:  # the tunnel reconnects, as a live server's does
                    for _ in range(4):
                        await node.open_slot("control")
                cut = await running
                assert cut.status == 502, cut.json()
                assert cut.json()["error"]["kind"] == "server_transport"
                again = await http_request(router.port, "GET", f"/v1/sessions/{session_id}")
                assert again.status == 200, again.json()
            finally:
                release.set()
                await node.close()

    await scenario()
