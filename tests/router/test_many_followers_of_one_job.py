"""Many people following one job through a router all see its output live (docs/scaling.md,
control slots). A one-seat node opened four control slots and an event stream never takes
the last free one, so three followers saw the output live and the rest saw nothing until
the job ended, without a word (jobs soak). The node now opens more control slots as they
fill, up to its ceiling.

Liveness is proven by order: the program cannot end before every follower has seen its
first line, since it waits for a file the test creates only then. Never by timing.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from kcoral_server.node.control_slots import CEILING, ControlSlots
from router_helpers import Node, ready_nodes, start_router, stopping

import kcoral

pytestmark = pytest.mark.slow
TOKEN = "followers-client-token"
NODE_ENV = {"KCORAL_NODE_TOKEN": "followers-node-token"}
FOLLOWERS = 10

WAIT_FOR_FILE = """
import os, time
def f(go):
    print("first", flush=True)
    while not os.path.exists(go):
        time.sleep(0.01)
    print("second")
    return 7
"""


def waiting_program(go: Path) -> kcoral.Program:
    program = kcoral.Program()
    module = program.upload(kind="module", source=WAIT_FOR_FILE)
    function = program.get_function(module=module, name="f")
    program.return_(key="r", value=program.run(fn=function, args=[str(go)]))
    return program


def follow(url: str, job_id: str, saw_first: threading.Event, texts: list[str]) -> None:
    with kcoral.Client(url, token=TOKEN) as client:
        for event in client.job(job_id).events():
            if event.kind == "stdout":
                texts.append(event.text)
                if "first" in event.text:
                    saw_first.set()


def test_ten_people_following_one_job_on_a_one_seat_node_all_see_it_live(
    tmp_path: Path,
) -> None:
    router = start_router(tmp_path, env={"KCORAL_AUTH_TOKEN": TOKEN, **NODE_ENV})
    node = Node(tmp_path, router, "node-a", NODE_ENV, "--num-workers", "1")
    go = tmp_path / "go"
    with stopping(router, [node]):
        ready_nodes(router, 1)
        with kcoral.Client(router.url, token=TOKEN) as client:
            job = client.submit(waiting_program(go))
            seen = [threading.Event() for _ in range(FOLLOWERS)]
            texts: list[list[str]] = [[] for _ in range(FOLLOWERS)]
            followers = [
                threading.Thread(target=follow, args=(router.url, job.id, seen[i], texts[i]))
                for i in range(FOLLOWERS)
            ]
            for thread in followers:
                thread.start()
            deadline = time.monotonic() + 60
            for event in seen:
                event.wait(max(0.0, deadline - time.monotonic()))
            live = sum(event.is_set() for event in seen)
            go.touch()  # let the program end whatever happened, so the followers stop
            for thread in followers:
                thread.join(60)
            assert live == FOLLOWERS, f"only {live} of {FOLLOWERS} followers saw output live"
            assert job.result(timeout=60).results["r"] == 7
            assert all("".join(t) == "first\nsecond\n" for t in texts), texts


def test_a_node_opens_control_slots_as_they_fill_up_to_its_ceiling() -> None:
    slots = ControlSlots(1, {})
    assert (slots.base, slots.ceiling) == (4, CEILING)
    worker_slots = 1
    opened = []
    for index in range(worker_slots, worker_slots + CEILING):
        if slots.taken(index):
            slots.open_one()
            opened.append(index)
    assert slots.opened == CEILING and len(opened) == CEILING - slots.base
    # at the ceiling every slot may be taken, and none more opens
    assert len(slots.busy) == CEILING and not slots.taken(worker_slots)
    slots.freed(worker_slots)
    assert len(slots.busy) == CEILING - 1


def test_a_fixed_control_slot_count_never_grows() -> None:
    slots = ControlSlots(1, {"KCORAL_NODE_CONTROL_SLOTS": "2"})
    assert (slots.base, slots.ceiling) == (2, 2)
    assert not slots.taken(1) and not slots.taken(2)


def test_a_control_slot_whose_relay_is_cancelled_before_it_starts_is_free_again() -> None:
    """A relay cancelled while it waited for the request before it never reached its own
    ``finally``: the slot stayed counted busy and the node opened slots it did not need
    (review). The count is kept by the relay task's done callback now."""
    import asyncio
    from types import SimpleNamespace

    slots = ControlSlots(1, {})
    request = SimpleNamespace(followed=False)

    async def scenario() -> None:
        slots.taken(1)
        task = asyncio.get_running_loop().create_task(asyncio.sleep(60))
        task.add_done_callback(slots.freer(request, 1))
        task.cancel()  # before it ever ran
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
    assert slots.busy == set()
    followed = SimpleNamespace(followed=True)  # its slot carries the next request already
    slots.taken(2)
    slots.freer(followed, 2)(None)
    assert slots.busy == {2}


def test_a_control_slot_the_router_refuses_for_its_bound_is_given_up_and_no_more_open() -> None:
    """A router whose ``--max-slots-per-node`` is below what a node opens refuses the extra
    slot (``RESOURCE_EXHAUSTED``): the node retried it for as long as it ran, each refusal a
    WARNING at the router (review). It now gives that slot up and opens no more."""
    slots = ControlSlots(1, {})  # 4 control slots at start, numbered 0 to 3
    slots.open_one()  # number 4, beyond the start's count
    slots.refused(2, "RESOURCE_EXHAUSTED: this node id already holds 5 slot streams")
    assert not slots.given_up(2)  # a slot of the start's count is retried, as before
    slots.refused(4, "UNAVAILABLE: connection lost")
    assert not slots.given_up(4)  # only the router's bound gives a slot up
    slots.refused(4, "RESOURCE_EXHAUSTED: this node id already holds 5 slot streams")
    assert slots.given_up(4) and slots.opened == 4 == slots.ceiling
    for index in range(1, 5):  # every slot taken: none more is opened
        assert not slots.taken(index)
