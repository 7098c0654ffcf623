"""Every change of a node's state has its ``node_state`` line (ROUTER §6, §10), whatever made
it: through a real router onto a real CPU node, the node's lines chain from ``starting`` to
``ready``; a router started again while the node runs logs the node ``ready`` when it comes
back (its first status on the new stream made that change, and was not logged); and the
node's drain ends in ``left``, when its stream ends (not a status either). Before, the
operator saw ``node_connected`` and nothing after a router restart, and a drain's last line
was ``draining``, while ``kcoral_router_node_state`` read ``ready`` and ``left``."""

from __future__ import annotations

import itertools
import signal
import time
from pathlib import Path

import pytest
from router_helpers import Node, RouterProcess, start_router

pytestmark = pytest.mark.slow


def state_lines(router: RouterProcess, node_id: str) -> list[tuple[str, str]]:
    """(previous, state) of each of the node's ``node_state`` lines, in order."""
    lines = []
    for line in router.log().splitlines():
        if " node_state " in line and f" node={node_id} " in line:
            state = line.split(" state=")[1].split()[0]
            lines.append((line.split(" previous=")[1].split()[0], state))
    return lines


def wait_for_state(router: RouterProcess, node_id: str, state: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not any(now == state for _, now in state_lines(router, node_id)):
        assert time.monotonic() < deadline, f"no {state} line\n{router.log()}"
        time.sleep(0.05)


def assert_chained(lines: list[tuple[str, str]]) -> None:
    """Each line starts where the one before it ended, the first at ``starting``."""
    assert lines and lines[0][0] == "starting", lines
    for (_, before), (previous, _) in itertools.pairwise(lines):
        assert previous == before, lines


def test_a_node_state_line_marks_every_change_a_router_restart_and_a_drain_included(
    tmp_path: Path,
) -> None:
    first = start_router(tmp_path, "--status-check-interval-seconds", "0.3")
    node = Node(tmp_path, first, "cpu-a", None)
    again: list[RouterProcess] = []
    try:
        wait_for_state(first, "cpu-a", "ready")
        assert_chained(state_lines(first, "cpu-a"))

        first.stop()
        # a stopping router ends the streams itself: no node turned unhealthy
        assert state_lines(first, "cpu-a")[-1][1] == "ready", first.log()
        # the same address, so the node's supervisor and slots find it again
        again.append(
            start_router(
                tmp_path, "--status-check-interval-seconds", "0.3", "--port", str(first.port)
            )
        )
        second = again[0]
        wait_for_state(second, "cpu-a", "ready")
        lines = state_lines(second, "cpu-a")
        assert_chained(lines)
        assert lines[-1] == ("starting", "ready"), lines  # its server ran on: a single success

        node.process.send_signal(signal.SIGTERM)
        wait_for_state(second, "cpu-a", "left")
        lines = state_lines(second, "cpu-a")
        assert_chained(lines)
        assert lines[-2:] == [("ready", "draining"), ("draining", "left")], lines
        assert "state=left" in second.log().split("node_disconnected node=cpu-a", 1)[1]
        # a drained node leaving is what its operator asked for
        assert "INFO    node_disconnected node=cpu-a" in second.log(), second.log()
    finally:
        node.stop()
        for router in [*again, first]:
            router.stop()
