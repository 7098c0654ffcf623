"""A router stopped while it relays a program (SIGTERM from systemd, Slurm or Kubernetes: a
restart, an upgrade) lets the program finish within ``--stop-grace-seconds`` (default 20;
ROUTER §11), then cuts its tunnel; the client's 502 says the router is shutting down.

Before, the grace was 1 s, so every restart by systemd or a Kubernetes rollout (both allow
30 s) cut each program running longer (deploy soak); and the 502 said "the tunnel to the
node failed", which sent users (and whoever they asked) to look at a node that had done
nothing wrong, while the operator had only restarted the router."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from raw_http import call_program, post_execute
from router_helpers import Node, RouterProcess, start_router, stopping
from test_router_fleet_status import HOLD, only_kind
from waiting import wait_for

pytestmark = pytest.mark.slow
OLD_GRACE_SECONDS = 1.0
MARKED_HOLD = (
    "import os, time\n\n"
    "def main(started, path):\n"
    "    open(started, 'w').close()\n"
    "    while not os.path.exists(path):\n"
    "        time.sleep(0.02)\n"
    "    return os.getpid()\n"
)


def stop_while_held(
    tmp_path: Path, router: RouterProcess, meanwhile: Callable[[Path], None]
) -> Any:
    """Stop ``router`` (SIGTERM) while it relays a program that runs until ``release``
    exists; ``meanwhile(release)`` runs after the signal. The program's answer."""
    node = Node(tmp_path, router, "cpu-a")
    with stopping(router, [node]):
        wait_for(
            lambda: (k := only_kind(router)) and k["seats"] == 1, "ready", 90.0, detail=router.log
        )
        release = tmp_path / "release"
        answers: dict[str, Any] = {}

        def run() -> None:
            answers["held"] = post_execute(router.url, call_program(HOLD, args=[str(release)]))

        held = threading.Thread(target=run, daemon=True)
        held.start()
        wait_for(
            lambda: only_kind(router)["free_seats"] == 0, "the seat taken", 90.0, detail=router.log
        )
        router.process.send_signal(signal.SIGTERM)
        meanwhile(release)
        held.join(60)
        assert router.process.wait(60) == 0
        return answers["held"]


def test_a_program_running_when_the_router_stops_finishes_and_gets_its_answer(
    tmp_path: Path,
) -> None:
    router = start_router(tmp_path, "--status-check-interval-seconds", "0.3")

    def after_the_old_grace(release: Path) -> None:
        wait_for(
            lambda: "router_stopping" in router.log(), "the router's stop", 90.0, detail=router.log
        )
        time.sleep(2 * OLD_GRACE_SECONDS)  # past what the router used to give
        assert router.process.poll() is None, "the router stopped before the program ended"
        release.touch()

    answer = stop_while_held(tmp_path, router, after_the_old_grace)
    assert answer.status == 200, (answer.status, answer.body)
    assert answer.body["status"] == "COMPLETED"
    assert "in_progress=1" in router.log() and "stop_grace_seconds=20" in router.log()


def test_a_program_cut_by_the_routers_stop_is_told_the_router_is_shutting_down(
    tmp_path: Path,
) -> None:
    router = start_router(
        tmp_path, "--status-check-interval-seconds", "0.3", "--stop-grace-seconds", "0.5"
    )
    answer = stop_while_held(tmp_path, router, lambda release: None)  # never released
    assert answer.status == 502, (answer.status, answer.body)
    assert answer.body["error"]["kind"] == "server_transport"
    assert answer.body["error"]["message"] == (
        "the router is shutting down and closed the tunnel to the node; the execution"
        " outcome is unknown and was not retried"
    )


def test_a_sessions_program_running_when_the_router_stops_finishes_too(tmp_path: Path) -> None:
    """A session's program travels on a control slot, which the stop's wait did not count:
    with no other program running, it was cut at once (review of a9a620e)."""
    import kcoral

    router = start_router(tmp_path, "--status-check-interval-seconds", "0.3")
    node = Node(tmp_path, router, "cpu-a")
    release, started = tmp_path / "release", tmp_path / "started"
    answers: dict[str, Any] = {}
    with stopping(router, [node]):
        wait_for(
            lambda: (k := only_kind(router)) and k["seats"] == 1, "ready", 90.0, detail=router.log
        )
        with kcoral.Client(router.url) as client:
            session = client.session()
            program = kcoral.Program()
            module = program.upload(kind="module", source=MARKED_HOLD)
            main = program.get_function(module=module, name="main")
            arguments = [str(started), str(release)]
            program.return_(key="pid", value=program.run(fn=main, args=arguments))

            def run() -> None:
                answers["held"] = session.execute(program)

            held = threading.Thread(target=run, daemon=True)
            held.start()
            wait_for(started.exists, "the session's program started", 90.0, detail=router.log)
            router.process.send_signal(signal.SIGTERM)
            wait_for(
                lambda: "router_stopping" in router.log(),
                "the router's stop",
                90.0,
                detail=router.log,
            )
            time.sleep(2 * OLD_GRACE_SECONDS)  # past what the router used to give
            assert router.process.poll() is None, "the router stopped under the program"
            release.touch()
            held.join(60)
            assert router.process.wait(60) == 0
    assert answers["held"].completed, answers["held"].error
