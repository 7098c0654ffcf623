"""A node whose server does not answer its supervisor's probes for a moment (its event loop
busy, here the server stopped with SIGSTOP for about two seconds) takes no new work while its
statuses fail, and is back at once after: it never reads ``unhealthy`` (ROUTER §6). Before,
its supervisor, probing every 0.3 s, sent the timed-out probe's failure again at every
interval while its next probe waited, the router counted three failing statuses within a
second and took a healthy node out until two healthy ones came. A real router, a real CPU
node."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from router_helpers import Node, stopping, wait_for_health
from router_helpers import start_router as start
from test_router_node_state_lines import state_lines, wait_for_state

pytestmark = pytest.mark.slow


def capacity_is(port: int, wanted: bool) -> None:
    """Wait until the router's ``/health`` counts the node's slots (``wanted``) or not."""
    asyncio.run(
        wait_for_health(port, lambda b: (b["load"]["request_capacity"] > 0) == wanted, timeout=60)
    )


def test_a_node_whose_server_stops_answering_for_a_moment_is_never_unhealthy(
    tmp_path: Path,
) -> None:
    router = start(tmp_path, "--status-check-interval-seconds", "0.3")
    node = Node(tmp_path, router, "cpu-a", None)
    with stopping(router, [node]):
        wait_for_state(router, "cpu-a", "ready")
        capacity_is(router.port, True)
        server = node.server_pid()
        os.kill(server, signal.SIGSTOP)
        try:
            capacity_is(router.port, False)  # a probe timed out: no new work for it
            time.sleep(1.0)  # the failure sent again at each 0.3 s while the next probe waits
        finally:
            os.kill(server, signal.SIGCONT)
        capacity_is(router.port, True)
        states = [state for _, state in state_lines(router, "cpu-a")]
        assert states[-1] == "ready" and "unhealthy" not in states, router.log()
