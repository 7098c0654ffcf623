"""Attack: one client-token holder takes every control slot of a node, so that no other
identity can read or cancel its jobs there (docs/scaling.md, "Control slots").

A node's control slots carry every identity's job status, cancel, ``/v1/info`` and job
lists. An event stream never took a node's last free one, but a session's program (held
while it runs) and a job's result (held while its caller reads it, at the caller's pace)
did: bob's three event streams on his own job and then his session's program, or his
result left unread, held all four slots of a node, and alice's ``/v1/info`` waited for
bob's program to end (85 s by hand; at the queue's wait a 503). Now neither takes a
node's last free control slot either.

The router runs in the test's process so that the test can see which of its slots are
taken, never a time; the node is a real one (supervisor, server child, workers), its
control slots fixed at four (``KCORAL_NODE_CONTROL_SLOTS``) so that the attack needs
three streams rather than one per slot the node may open. One identity holds at most half
of them, two, in long-held requests (ROUTER §7; ``test_router_attack_control_shares.py``),
so the three come from bob (two) and carol (one), and carol's program or result is the
request that must not take the last free slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from kcoral_server.router.nodes.slot import CONTROL

import kcoral

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from router_helpers import Node, http_request, in_process_router

pytestmark = pytest.mark.slow

ALICE, BOB, CAROL = "alice-control-token-1b7e", "bob-control-token-6c2d", "carol-token-8d1f"
NODE_ENV = {"KCORAL_NODE_TOKEN": "control-node-token-4e9a", "KCORAL_NODE_CONTROL_SLOTS": "4"}

WAIT_FOR_FILE = """
import os, time
def f(go):
    while not os.path.exists(go):
        time.sleep(0.05)
    return "done"
"""

LARGE_RESULT = """
def f(size):
    return b"r" * size
"""


def program(source: str, *args: object) -> kcoral.Program:
    built = kcoral.Program()
    module = built.upload(kind="module", source=source)
    function = built.get_function(module=module, name="f")
    built.return_(key="r", value=built.run(fn=function, args=list(args)))
    return built


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait until ``condition`` holds (a hang guard, not a timing check)."""
    for _ in range(2400):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never: {what}")


async def open_answer(port: int, path: str, token: str) -> asyncio.StreamWriter:
    """``GET path`` whose answer's head is read and whose body is left unread (an event
    stream followed, a result read at the caller's pace)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {token}\r\n\r\n".encode()
    )
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return writer


@contextlib.asynccontextmanager
async def routed_node(tmp: Path) -> AsyncIterator[tuple[SimpleNamespace, str]]:
    """An in-process router with alice's and bob's tokens and one real node, ready."""
    tokens = tmp / "clients"
    tokens.write_text(f"alice {ALICE}\nbob {BOB}\ncarol {CAROL}\n")
    tokens.chmod(0o600)
    args = ("--auth-token-file", str(tokens), "--reconnect-grace-seconds", "0")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KCORAL_NODE_TOKEN", NODE_ENV["KCORAL_NODE_TOKEN"])
        async with in_process_router(*args, "--queue-wait-timeout-seconds", "60") as router:
            address = SimpleNamespace(url=f"http://127.0.0.1:{router.grpc_port}")
            node = Node(tmp, address, "node-a", NODE_ENV, "--num-workers", "3")
            try:
                registry = router.state.registry
                await until(
                    lambda: (
                        "node-a" in registry.nodes
                        and len(registry.nodes["node-a"].idle_slots(CONTROL)) == 4
                        and registry.any_ready_with_slots()
                    ),
                    "the node ready with its four control slots",
                )
                yield router, f"http://127.0.0.1:{router.port}"
            finally:
                await asyncio.to_thread(node.stop)


def slots_taken_or_waited_for(router: SimpleNamespace) -> Callable[[], bool]:
    """Whether the router took in the last request sent: it holds the node's last free
    control slot (before the fix) or waits for one (now)."""
    node = router.state.registry.nodes["node-a"]
    return lambda: not node.idle_slots(CONTROL) or router.state.control.waiting == 1


async def streams_of_bob_and_carol(
    port: int, bob: kcoral.Client, carol: kcoral.Client, go: Path
) -> list[asyncio.StreamWriter]:
    """Three event streams followed on jobs that wait for ``go``: two of bob's (his share of
    the node's four control slots), one of carol's."""
    streams = []
    for client, token, count in ((bob, BOB, 2), (carol, CAROL, 1)):
        job = await asyncio.to_thread(client.submit, program(WAIT_FOR_FILE, str(go)))
        for _ in range(count):
            streams.append(await open_answer(port, f"/v1/jobs/{job.id}/events", token))
    return streams


async def alices_info(port: int) -> int:
    answer = await http_request(
        port, "GET", "/v1/info", headers=[("Authorization", f"Bearer {ALICE}")]
    )
    return answer.status


def test_a_callers_streams_and_session_program_leave_other_identities_a_control_slot(
    tmp_path: Path,
) -> None:
    go = tmp_path / "go"

    async def scenario() -> None:
        async with routed_node(tmp_path) as (router, url):
            bob, carol = kcoral.Client(url, token=BOB), kcoral.Client(url, token=CAROL)
            streams = await streams_of_bob_and_carol(router.port, bob, carol, go)
            session = await asyncio.to_thread(carol.session)
            running = asyncio.ensure_future(
                asyncio.to_thread(session.execute, program(WAIT_FOR_FILE, str(go)))
            )
            try:
                await until(slots_taken_or_waited_for(router), "carol's session program taken in")
                # before: alice waited for carol's program to end (here: the queue's 60 s, 503)
                assert await alices_info(router.port) == 200
                assert not running.done()
            finally:
                go.touch()
                for stream in streams:
                    stream.close()
                outcome = await running
                await asyncio.to_thread(session.close)
            # carol's program still ran, once a slot was free
            assert outcome.completed and outcome.results["r"] == "done", outcome.error

    asyncio.run(scenario())


def test_a_result_read_at_the_callers_pace_leaves_other_identities_a_control_slot(
    tmp_path: Path,
) -> None:
    go = tmp_path / "go"

    async def scenario() -> None:
        async with routed_node(tmp_path) as (router, url):
            bob, carol = kcoral.Client(url, token=BOB), kcoral.Client(url, token=CAROL)
            # a result far larger than the sockets on its way hold, so unread it holds a slot
            finished = await asyncio.to_thread(carol.submit, program(LARGE_RESULT, 64 << 20))
            await asyncio.to_thread(finished.wait)
            held = await streams_of_bob_and_carol(router.port, bob, carol, go)
            try:
                _reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
                held.append(writer)
                writer.write(
                    f"GET /v1/jobs/{finished.id}/result HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    f"Authorization: Bearer {CAROL}\r\n\r\n".encode()
                )
                await writer.drain()
                await until(slots_taken_or_waited_for(router), "carol's result request taken in")
                assert await alices_info(router.port) == 200
            finally:
                go.touch()
                for writer in held:
                    writer.close()

    asyncio.run(scenario())
