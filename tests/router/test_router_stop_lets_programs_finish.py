"""A router stopped while it relays a program lets the program finish within
``--stop-grace-seconds`` (default 20; ROUTER §11): a restart or an upgrade (systemd, a
Kubernetes rollout, which allow 30 s) cut every program running longer than the 1 s the
router gave before (deploy soak). It takes nothing new meanwhile.

The program ends only when the test lets it, well after the old 1 s: its answer can then
only come from a router that waited.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from raw_http import call_program, post_execute
from router_helpers import Node, start_router, stopping
from test_router_fleet_status import HOLD, only_kind, wait_for

pytestmark = pytest.mark.slow
OLD_GRACE_SECONDS = 1.0


def test_a_program_running_when_the_router_stops_finishes_and_gets_its_answer(
    tmp_path: Path,
) -> None:
    router = start_router(tmp_path, "--status-check-interval-seconds", "0.3")
    node = Node(tmp_path, router, "cpu-a")
    with stopping(router, [node]):
        wait_for(lambda: (k := only_kind(router)) and k["seats"] == 1, "ready", router)
        release = tmp_path / "release"
        answers: dict[str, Any] = {}

        def run() -> None:
            answers["held"] = post_execute(router.url, call_program(HOLD, args=[str(release)]))

        held = threading.Thread(target=run, daemon=True)
        held.start()
        wait_for(lambda: only_kind(router)["free_seats"] == 0, "the seat taken", router)

        router.process.send_signal(signal.SIGTERM)
        wait_for(lambda: "router_stopping" in router.log(), "the router's stop", router)
        time.sleep(2 * OLD_GRACE_SECONDS)  # past what the router used to give
        assert router.process.poll() is None, "the router stopped before the program ended"
        release.touch()
        held.join(60)
        assert router.process.wait(60) == 0

        answer = answers["held"]
        assert answer.status == 200, (answer.status, answer.body)
        assert answer.body["status"] == "COMPLETED"
        assert "in_progress=1" in router.log() and "stop_grace_seconds=20" in router.log()
