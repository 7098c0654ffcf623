"""A node stopped with SIGTERM while a program runs on it delivers that program's answer.

Found running nodes as Slurm jobs (issue 33, point 5; ``#SBATCH --signal=B:TERM@N`` drains a
node before its time limit): the child's tunnel cancelled its slot stream right after writing
the last answer's frames, and the router discarded the frames it had queued when the stream
ended, so the client of the last program got a cut-off answer. Now a draining tunnel
half-closes its slot and the router hands on what arrived before the stream's end. A real
router process, real nodes (supervisor + CPU server) and the real client; the program waits
for the test to let it go, so the stop always lands while it runs.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from waiting import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from router_helpers import Node, http_request, ready_nodes, start_router

import kcoral

HOLD = """
import time
from pathlib import Path

def hold(folder):
    Path(folder, "started").write_text("")
    while not Path(folder, "release").exists():
        time.sleep(0.02)
    return "answer " * 200
"""


def held_program(folder: Path) -> kcoral.Program:
    program = kcoral.Program()
    module = program.upload(kind="module", source=HOLD)
    fn = program.get_function(module=module, name="hold")
    program.return_(key="out", value=program.run(fn=fn, args=[str(folder)]))
    return program


def test_the_program_running_on_a_node_stopped_with_sigterm_completes_for_its_client(
    tmp_path: Path,
) -> None:
    router = start_router(tmp_path, "--status-check-interval-seconds", "0.3")
    try:
        for round_ in range(3):  # the lost answer was a race: give it several chances
            node = Node(tmp_path, router, f"n{round_}")
            try:
                ready_nodes(router, 1)
                folder = tmp_path / f"held-{round_}"
                folder.mkdir()
                outcome: dict[str, Any] = {}

                def run(folder: Path = folder, outcome: dict[str, Any] = outcome) -> None:
                    try:
                        with kcoral.Client(router.url) as client:
                            outcome["result"] = client.execute(held_program(folder))
                    except Exception as exc:  # shown by the assertion below
                        outcome["error"] = exc

                runner = threading.Thread(target=run)
                runner.start()
                wait_for((folder / "started").exists, "the program runs", 60.0)
                node.process.send_signal(signal.SIGTERM)

                def unhealthy() -> bool:
                    health = asyncio.run(http_request(router.port, "GET", "/health")).json()
                    return health["load"]["request_capacity"] == 0

                wait_for(unhealthy, "the router takes the node out", 60.0)
                assert runner.is_alive()
                (folder / "release").write_text("")
                runner.join(60)
                assert "error" not in outcome, (outcome, node.log_path.read_text()[-3000:])
                result = outcome["result"]
                assert result.status == "COMPLETED" and result["out"] == "answer " * 200
                assert node.process.wait(60) == 0
            finally:
                node.stop()
        assert "tunnel_disconnected" not in router.log()
    finally:
        router.stop()


def test_a_job_that_ends_while_its_node_drains_can_still_be_read_through_the_router(
    tmp_path: Path,
) -> None:
    # Before, the node's tunnel closed its control slots at SIGTERM: the job ran to its
    # end during the drain, its client saw every event up to there (or none: the events
    # go through control slots too), and then could not read its result, lost with the
    # server's exit (a soak of `kcoral run` through a router: 2 of 2 node restarts).
    router = start_router(tmp_path, "--status-check-interval-seconds", "0.3")
    node = Node(tmp_path, router, "n0")
    try:
        ready_nodes(router, 1)
        folder = tmp_path / "held"
        folder.mkdir()
        with kcoral.Client(router.url) as client:
            job = client.submit(held_program(folder))
            wait_for((folder / "started").exists, "the program runs", 60.0)
            node.process.send_signal(signal.SIGTERM)
            (folder / "release").write_text("")
            result = job.result(timeout=60)
        assert result.status == "COMPLETED" and result["out"] == "answer " * 200
        assert node.process.wait(60) == 0
    finally:
        node.stop()
        router.stop()


def test_a_request_queued_for_the_only_node_its_selector_fits_is_refused_when_that_node_leaves(
    tmp_path: Path,
) -> None:
    # Before, the queued request waited out the router's queue wait (1800 s by default)
    # for a node that had left, while the same request arriving then was refused at once
    # (a remote-function soak: a call selecting the drained node hung for minutes).
    router = start_router(
        tmp_path, "--status-check-interval-seconds", "0.3", "--queue-wait-timeout-seconds", "90"
    )
    node_a = Node(tmp_path, router, "n-a", None, "--node-label", "zone=a")
    node_b = Node(tmp_path, router, "n-b", None, "--node-label", "zone=b")
    try:
        ready_nodes(router, 2)
        folder = tmp_path / "held"
        folder.mkdir()
        outcomes: dict[str, Any] = {}

        def run(name: str, program: kcoral.Program) -> None:
            try:
                with kcoral.Client(router.url) as client:
                    outcomes[name] = client.execute(program, select={"zone": "a"})
            except Exception as exc:  # checked below
                outcomes[name] = exc

        def router_load() -> dict[str, int]:
            return asyncio.run(http_request(router.port, "GET", "/health")).json()["load"]

        held = threading.Thread(target=run, args=("held", held_program(folder)))
        held.start()
        wait_for((folder / "started").exists, "the program runs on n-a", 60.0)
        queued = threading.Thread(target=run, args=("queued", held_program(tmp_path)))
        queued.start()
        wait_for(lambda: router_load()["requests_waiting"] == 1, "the second one is queued", 60.0)
        node_a.process.send_signal(signal.SIGTERM)
        wait_for(lambda: router_load()["request_capacity"] == 1, "the router takes n-a out", 60.0)
        (folder / "release").write_text("")
        held.join(60)
        queued.join(60)
        assert not queued.is_alive(), "the queued request still waits for the node that left"
        assert outcomes["held"].status == "COMPLETED"
        refused = outcomes["queued"]
        assert isinstance(refused, kcoral.KCoralError), refused
        assert (refused.status_code, refused.kind) == (503, "no_matching_node")
        assert "zone=a" in refused.message and "zone=b: 1 node" in refused.message
        assert node_a.process.wait(60) == 0
    finally:
        node_a.stop()
        node_b.stop()
        router.stop()
