"""A job's result reaches its owner when the node's supervisor alone dies (ROUTER §13).

The supervisor's status stream ends with it, so the router counts the node as gone and
sends it no new work; but its server runs on, finishes the job and keeps the node's control
slots open. The router reads the job through them: before, its owner got `503` `no_node`
for a result the server held (jobs soak).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from router_helpers import Node, ready_nodes, start_router, stopping
from waiting import wait_for

import kcoral

pytestmark = pytest.mark.slow
TOKEN = "outlives-client-token"
NODE_ENV = {"KCORAL_NODE_TOKEN": "outlives-node-token"}

WAIT_FOR_FILE = """
import os, time
def f(marker, go):
    print("first", flush=True)
    open(marker, "w").close()
    while not os.path.exists(go):
        time.sleep(0.01)
    return 7
"""


def waiting_program(marker: Path, go: Path) -> kcoral.Program:
    program = kcoral.Program()
    module = program.upload(kind="module", source=WAIT_FOR_FILE)
    function = program.get_function(module=module, name="f")
    program.return_(key="r", value=program.run(fn=function, args=[str(marker), str(go)]))
    return program


def test_a_job_finished_after_its_nodes_supervisor_was_killed_still_gives_its_result(
    tmp_path: Path,
) -> None:
    router = start_router(tmp_path, env={"KCORAL_AUTH_TOKEN": TOKEN, **NODE_ENV})
    node = Node(tmp_path, router, "node-a", NODE_ENV, "--num-workers", "1")
    marker, go = tmp_path / "marker", tmp_path / "go"
    server_pid = None
    try:
        with stopping(router, [node]):
            ready_nodes(router, 1)
            server_pid = node.server_pid()
            with kcoral.Client(router.url, token=TOKEN) as client:
                job = client.submit(waiting_program(marker, go))
                wait_for(marker.exists, "the program's start", 60.0)
                node.process.send_signal(signal.SIGKILL)  # the supervisor only
                node.process.wait(30)
                wait_for(lambda: "node_disconnected" in router.log(), "the node's loss", 60.0)
                go.touch()
                result = job.result(timeout=60)
                assert result.results["r"] == 7 and result.stdout == "first\n"
                assert job.status()["status"] == "COMPLETED"
    finally:
        if server_pid is not None:  # the orphaned server, which no supervisor stops now
            try:
                os.kill(server_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
