"""Attack: one client-token holder fills the router's queue, so that every other identity's
program is refused at once (ROUTER §7, ``--max-queued-requests``).

The router serves waiting identities in turn, but the queue's bound was shared: bob's
programs, as many as ``--max-queued-requests`` (1024 by default: one connection each),
filled it, and alice's one program got ``503 router_busy`` (``router queue is full``) for as
long as bob kept it full. With two or more identities, one now holds at most half of the
queue, rounded up (as a server's job slots, EXTENSIONS §5), and is told so; the other half
stays for the others.

A real router and a real node (one worker seat); the queue bound is 4 here so that the
attack needs 4 waiting programs, not 1024.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import kcoral

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from router_helpers import Node, ready_nodes, start_router, stopping

pytestmark = pytest.mark.slow

ALICE, BOB = "alice-queue-token-5d0a", "bob-queue-token-8e1c"
NODE_ENV = {"KCORAL_NODE_TOKEN": "queue-node-token-2f7b"}

WAIT_FOR_FILE = """
import os, time
def f(go):
    while not os.path.exists(go):
        time.sleep(0.05)
    return "done"
"""


def program(*args: object) -> kcoral.Program:
    built = kcoral.Program()
    module = built.upload(kind="module", source=WAIT_FOR_FILE)
    function = built.get_function(module=module, name="f")
    built.return_(key="r", value=built.run(fn=function, args=list(args)))
    return built


def router_load(router_url: str) -> dict:
    with kcoral.Client(router_url) as client:
        return client.health()["load"]


def until(condition: Callable[[], object], what: str) -> None:
    """Poll until true (a hang guard, not a timing check)."""
    for _ in range(1200):
        if condition():
            return
        threading.Event().wait(0.05)
    raise AssertionError(f"never: {what}")


def test_one_identity_holds_at_most_half_the_routers_queue(tmp_path: Path) -> None:
    tokens = tmp_path / "clients"
    tokens.write_text(f"alice {ALICE}\nbob {BOB}\n")
    tokens.chmod(0o600)
    router = start_router(
        tmp_path, "--auth-token-file", str(tokens), "--max-queued-requests", "4", env=NODE_ENV
    )
    node = Node(tmp_path, router, "node-a", NODE_ENV, "--num-workers", "1")
    go = tmp_path / "go"
    bobs: list[object] = []
    alices: list[object] = []

    def run(token: str, outcomes: list[object]) -> None:
        with kcoral.Client(router.url, token=token) as client:
            try:
                outcomes.append(client.execute(program(str(go))))
            except kcoral.KCoralError as exc:
                outcomes.append(exc)

    def start(token: str, outcomes: list[object]) -> None:
        thread = threading.Thread(target=run, args=(token, outcomes), daemon=True)
        thread.start()
        threads.append(thread)

    threads: list[threading.Thread] = []
    with stopping(router, [node]):
        ready_nodes(router, 1)
        try:
            start(BOB, bobs)  # on the node's one seat, until the test lets it end
            until(lambda: router_load(router.url)["requests_in_progress"] == 1, "bob's first")
            for sent in range(1, 5):  # then as many as the whole queue holds
                start(BOB, bobs)
                until(
                    lambda sent=sent: (
                        router_load(router.url)["requests_waiting"] + len(bobs) == sent
                    ),
                    f"bob's program {sent} queued or refused",
                )
            # bob got two places in the queue; the rest was refused, naming the share
            assert router_load(router.url)["requests_waiting"] == 2, bobs
            assert [getattr(e, "status_code", e) for e in bobs] == [503, 503], bobs
            assert "half of --max-queued-requests 4" in str(bobs[0]), bobs[0]
            start(ALICE, alices)  # before: 503 router queue is full, at once
            until(
                lambda: alices or router_load(router.url)["requests_waiting"] == 3,
                "alice's program queued or refused",
            )
            assert alices == [], alices
        finally:
            go.touch()
            for thread in threads:
                thread.join(60)
    assert [outcome.status for outcome in alices] == ["COMPLETED"], alices
