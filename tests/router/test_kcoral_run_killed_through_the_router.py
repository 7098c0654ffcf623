"""A ``kcoral run`` through a real router, killed with SIGKILL while its tool runs on a real
node: the node cancels the job once nobody follows it (``X-KCoral-Cancel-Unfollowed``
crosses the router, and the router's tunnelled event stream ends with the client's;
EXTENSIONS §5, §7). Before, the job ran on to its deadline and no one knew its id."""

from __future__ import annotations

from pathlib import Path

import pytest
from killed_kcoral_run import kill_a_running_kcoral_run, wait_for_the_end
from router_helpers import Node, ready_nodes, start_router, stopping

from kcoral import Client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
NODES_ENV = {"KCORAL_NODE_TOKEN": "run-killed-node-token"}
TOKEN = "run-killed-client-token"


def test_a_kcoral_run_killed_with_sigkill_through_a_router_has_its_job_cancelled(
    tmp_path: Path,
) -> None:
    tokens = tmp_path / "client-tokens"
    tokens.write_text(f"{TOKEN}\n")
    tokens.chmod(0o600)
    router = start_router(tmp_path, "--auth-token-file", str(tokens), env=NODES_ENV)
    nodes = [Node(tmp_path, router, "cpu-a", NODES_ENV)]
    with stopping(router, nodes):
        ready_nodes(router, 1)
        kill_a_running_kcoral_run(router.url, TOKEN, tmp_path)
        with Client(router.url, token=TOKEN) as client:
            (job,) = client.jobs()
            state = wait_for_the_end(client, job["job_id"], 150)
        assert state["status"] == "CANCELLED"
