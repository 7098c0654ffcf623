"""A node whose server alone gets SIGTERM (not its supervisor) reads ``draining`` at the
router (ROUTER §6, SERVER §12): through a real router onto two real CPU nodes, a program
holds cpu-a's seat and cpu-a's server is sent SIGTERM; new requests go to cpu-b, never
to cpu-a's ``503 busy``; the held program's answer reaches its client; and once the
drained server has stopped, cpu-a's supervisor starts a new one and the node reads
``starting`` then ``ready``, never ``unhealthy``.

Before, the server's ``/internal/worker-status`` still said ``ok`` while it drained, so
its supervisor reported the node healthy and the router kept it ``ready``. The same holds
when the server and its supervisor get SIGTERM at once (Slurm's scancel, Kubernetes),
except that the node then leaves."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
from raw_http import call_program, post_execute
from router_helpers import Node, start_router, stopping
from test_router_drain_waiters import wait_until_draining
from test_router_mixed_fleet import node_states, served_by
from test_router_stop_names_itself import MARKED_HOLD
from waiting import wait_for

pytestmark = pytest.mark.slow


def cpu_a_states(router) -> list[str]:
    """cpu-a's states in order, from the router's node_state lines."""
    lines = [line for line in router.log().splitlines() if "node_state" in line]
    mine = [line for line in lines if "node=cpu-a " in line and " state=" in line]
    return [line.split(" state=")[1].split()[0] for line in mine]


def states_after_draining(router) -> list[str]:
    states = cpu_a_states(router)
    return states[states.index("draining") + 1 :]


@pytest.mark.parametrize(
    "signalled",
    ["the server alone", "the server and its supervisor at once"],
)
def test_a_sigtermed_server_drains_its_node_and_new_work_goes_elsewhere(
    tmp_path: Path, signalled: str
) -> None:
    # "at once": as Slurm's scancel and Kubernetes send it, the server's signal first
    router = start_router(tmp_path, "--status-check-interval-seconds", "0.3")
    cpu_a = Node(tmp_path, router, "cpu-a", None)
    cpu_b = Node(tmp_path, router, "cpu-b", None)
    with stopping(router, [cpu_a, cpu_b]):
        ready = {"cpu-a": "ready", "cpu-b": "ready"}
        wait_for(lambda: node_states(router) == ready, "both ready", 90.0, detail=router.log)
        started, release = tmp_path / "started", tmp_path / "release"
        answers: dict[str, Any] = {}

        def hold() -> None:
            program = call_program(MARKED_HOLD, args=[str(started), str(release)])
            select = {"X-KCoral-Select": "node=cpu-a"}
            answers["held"] = post_execute(router.url, program, headers=select)

        held = threading.Thread(target=hold, daemon=True)
        held.start()
        wait_for(started.exists, "the held program started", 90.0, detail=router.log)

        os.kill(cpu_a.server_pid(), signal.SIGTERM)
        if signalled != "the server alone":
            cpu_a.process.send_signal(signal.SIGTERM)
        wait_until_draining(router, cpu_a)

        for _ in range(3):  # new work meanwhile: never the draining node's 503 busy
            answer = post_execute(router.url, call_program("def main():\n    return 7\n"))
            assert answer.status == 200, (answer.status, answer.body)
            assert answer.body["results"]["value"]["value"] == 7
        # the router logs an answer just after sending it
        wait_for(
            lambda: served_by(router, 3) == ["cpu-b"] * 3,
            "served by cpu-b",
            90.0,
            detail=router.log,
        )

        release.write_text("go")
        held.join(120)
        assert answers["held"].status == 200, answers["held"].body
        assert answers["held"].body["results"]["value"]["value"] > 0

        # a planned stop, not a failure: alone, its supervisor starts a new server; with
        # its supervisor, the node leaves
        after = ["starting", "ready"] if signalled == "the server alone" else ["left"]
        wait_for(
            lambda: states_after_draining(router)[-1:] == after[-1:],
            after[-1],
            90.0,
            detail=router.log,
        )
        assert states_after_draining(router) == after, router.log()
