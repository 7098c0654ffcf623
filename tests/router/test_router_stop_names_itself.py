"""A router stopped while it relays a program (SIGTERM from systemd, Slurm or Kubernetes: a
restart, an upgrade) cuts the program's tunnel after its short grace (ROUTER §7.3); the
client's 502 says the router is shutting down. Before, it said "the tunnel to the node
failed", which sent users (and whoever they asked) to look at a node that had done nothing
wrong, while the operator had only restarted the router."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import pytest
from raw_http import call_program, post_execute
from router_helpers import Node, start_router, stopping
from test_router_fleet_status import HOLD, only_kind, wait_for

pytestmark = pytest.mark.slow


def test_a_program_cut_by_the_routers_stop_is_told_the_router_is_shutting_down(
    tmp_path: Path,
) -> None:
    router = start_router(
        tmp_path, "--status-check-interval-seconds", "0.3", "--stop-grace-seconds", "0.5"
    )
    node = Node(tmp_path, router, "cpu-a")
    with stopping(router, [node]):
        wait_for(lambda: (k := only_kind(router)) and k["seats"] == 1, "ready", router)
        release = tmp_path / "release"  # never written: the program runs until it is cut
        answers: dict[str, Any] = {}

        def run() -> None:
            answers["held"] = post_execute(router.url, call_program(HOLD, args=[str(release)]))

        held = threading.Thread(target=run, daemon=True)
        held.start()
        wait_for(lambda: only_kind(router)["free_seats"] == 0, "the seat taken", router)

        router.process.send_signal(signal.SIGTERM)
        held.join(60)
        assert router.process.wait(60) == 0

        answer = answers["held"]
        assert answer.status == 502, (answer.status, answer.body)
        assert answer.body["error"]["kind"] == "server_transport"
        assert answer.body["error"]["message"] == (
            "the router is shutting down and closed the tunnel to the node; the execution"
            " outcome is unknown and was not retried"
        )
