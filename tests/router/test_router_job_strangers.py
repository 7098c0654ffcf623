"""Another identity's job reads as an unknown id through the router, also while the job's
node is away (ROUTER §13): a real router with two client identities and a real CPU node
that is killed under a running job. Before, the router answered such a probe itself with
its ``503`` naming the job's node, where an unknown id got ``404``: a holder of someone's
job id could tell that the job lives."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest
from raw_http import Response, request
from router_helpers import Node, ready_nodes, start_router, stopping
from server_process import client_token_file

import kcoral

pytestmark = pytest.mark.slow

ALICE, BOB, ROOT = "strangers-alice-token", "strangers-bob-token", "strangers-root-token"
NODE_ENV = {"KCORAL_NODE_TOKEN": "strangers-node-token"}
UNKNOWN_JOB = "0c8f7a4e-4d7e-4a51-9d55-000000000001"

# Holds its seat until the file it names appears (never, here: its node is killed).
HOLD = (
    "import os, time\n\n"
    "def main(path):\n"
    "    while not os.path.exists(path):\n"
    "        time.sleep(0.05)\n"
    "    return 1\n"
)


def holding(path: Path) -> kcoral.Program:
    program = kcoral.Program()
    module = program.upload(kind="module", source=HOLD)
    held = program.run(fn=program.get_function(module=module, name="main"), args=[str(path)])
    program.return_(key="done", value=held)
    return program


def as_caller(router_url: str, method: str, path: str, token: str) -> Response:
    return request(router_url, method, path, headers={"Authorization": f"Bearer {token}"})


def kill_node(node: Node) -> None:
    """SIGKILL the supervisor and everything under it: its stream to the router breaks."""
    supervisor = psutil.Process(node.process.pid)
    tree = [supervisor, *supervisor.children(recursive=True)]
    for process in tree:
        process.kill()
    psutil.wait_procs(tree, timeout=30)


def test_another_identitys_job_reads_as_unknown_while_its_node_is_away(tmp_path: Path) -> None:
    tokens = client_token_file(tmp_path, f"alice {ALICE}\nbob {BOB}\nroot {ROOT} admin\n")
    router = start_router(
        tmp_path,
        "--auth-token-file",
        str(tokens),
        "--reconnect-grace-seconds",
        "0",
        "--status-check-interval-seconds",
        "0.2",
        env=NODE_ENV,
    )
    node = Node(tmp_path, router, "only", NODE_ENV)
    with stopping(router, [node]):
        ready_nodes(router, 1)
        with kcoral.Client(router.url, token=ALICE) as client:
            job_id = client.submit(holding(tmp_path / "never"), timeout_seconds=600).id
        path = f"/v1/jobs/{job_id}"
        # With its node there, the node answers bob as the router answers an unknown id.
        stranger = as_caller(router.url, "GET", path, BOB)
        assert stranger.status == 404
        unknown_there = as_caller(router.url, "GET", f"/v1/jobs/{UNKNOWN_JOB}", BOB)
        assert stranger.body["error"] == unknown_there.body["error"]

        kill_node(node)
        deadline = time.monotonic() + 60
        while request(router.url, "GET", "/health").status != 503:
            assert time.monotonic() < deadline, router.log()
            time.sleep(0.1)

        unknown = as_caller(router.url, "GET", f"/v1/jobs/{UNKNOWN_JOB}", BOB)
        assert unknown.status == 404
        for method in ("GET", "DELETE"):
            probe = as_caller(router.url, method, path, BOB)
            assert probe.status == unknown.status, probe.body
            assert probe.body["error"] == unknown.body["error"]
            assert probe.headers.get("X-KCoral-Node") is None
        # Its owner, and an admin, are told where the job is and why it cannot be reached.
        for token in (ALICE, ROOT):
            owner = as_caller(router.url, "GET", path, token)
            assert owner.status == 503, owner.body
            assert owner.body["error"]["kind"] == "no_node"
            assert "node only, which holds it" in owner.body["error"]["message"]
