"""A ``kcoral run`` through a real router, killed with SIGKILL while its tool runs on a real
node: the node cancels the job once nobody follows it (``X-KCoral-Cancel-Unfollowed``
crosses the router, and the router's tunnelled event stream ends with the client's;
EXTENSIONS §5, §7). Before, the job ran on to its deadline and no one knew its id."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from router_helpers import Node, ready_nodes, start_router, stopping

from kcoral import Client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
NODES_ENV = {"KCORAL_NODE_TOKEN": "run-killed-node-token"}
TOKEN = "run-killed-client-token"
#: ``kcoral run`` with its grace shortened, so that the test need not wait a minute
SHORT_GRACE_RUN = (
    "import sys, kcoral.run.command as command; command.UNFOLLOWED_CANCEL_SECONDS = 2; "
    "from kcoral.cli import main; sys.exit(main(sys.argv[1:]))"
)


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
        code = "import time\nprint('started', flush=True)\ntime.sleep(200)\n"
        run = subprocess.Popen(
            [sys.executable, "-c", SHORT_GRACE_RUN, "run", "python", "--url", router.url,
             "--", "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "KCORAL_TOKEN": TOKEN},
            cwd=tmp_path,
        )  # fmt: skip
        try:
            assert run.stdout is not None
            assert run.stdout.readline() == "started\n"  # the remote tool runs
        finally:
            run.send_signal(signal.SIGKILL)
            run.wait()
        with Client(router.url, token=TOKEN) as client:
            (job,) = client.jobs()
            deadline = time.monotonic() + 150
            while (state := client.job(job["job_id"]).status())["status"] == "RUNNING":
                assert time.monotonic() < deadline, f"the job ran on: {state}"
                time.sleep(0.1)
        assert state["status"] == "CANCELLED"
