"""A real node (supervisor + CPU server child) under ``kcoral router``: a SIGTERM stop
removes the supervisor's ``kcoral-supervisor-*`` work folder (issue 28 point 9), every
process of the node runs with its soft descriptor limit raised to the hard one (point 1),
and the server child does not outlive a supervisor killed with SIGKILL (ROUTER §12)."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
from pathlib import Path

import psutil
import pytest
from child_setup import under_open_file_limit
from router_helpers import HERE, RouterProcess, node_command, ready_nodes


def open_files_limits(pid: int) -> tuple[str, str]:
    """(soft, hard) from the process's ``/proc/PID/limits``."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return soft, hard
    raise AssertionError(f"no open-files line for {pid}")


def start_node(
    tmp_path: Path,
    router: RouterProcess,
    open_files: tuple[int, int | None] | None = None,
    **variables: str,
) -> subprocess.Popen:
    """Node ``n1`` of ``router``, without the environment's ``KCORAL_NODE_TOKEN`` and with
    ``variables`` added to it, its output in ``node.log``."""
    environment = {k: v for k, v in os.environ.items() if k != "KCORAL_NODE_TOKEN"}
    with open(tmp_path / "node.log", "w") as log:
        command = node_command(tmp_path, router.url, "n1")
        if open_files is not None:
            command = under_open_file_limit(command, *open_files)
        return subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**environment, **variables},
            cwd=str(HERE),
        )


def test_a_node_stopped_with_sigterm_leaves_no_work_folder_and_raised_its_limits(
    tmp_path: Path, router: RouterProcess
) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip(f"this machine's hard limit ({hard}) leaves nothing to raise")
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    # TMPDIR: where tempfile puts the supervisor's folder
    node = start_node(tmp_path, router, TMPDIR=str(temporary), open_files=(256, None))
    try:
        ready_nodes(router, 1)
        assert list(temporary.glob("kcoral-supervisor-*")), "the supervisor made no folder"
        processes = [psutil.Process(node.pid), *psutil.Process(node.pid).children(True)]
        assert len(processes) >= 3, "expected the supervisor, its server and a worker"
        for process in processes:
            soft, hard_seen = open_files_limits(process.pid)
            assert soft == hard_seen != "256", process.cmdline()
        node.send_signal(signal.SIGTERM)
        assert node.wait(60) == 0
        assert not list(temporary.glob("kcoral-supervisor-*")), (tmp_path / "node.log").read_text()
    finally:
        if node.poll() is None:
            for child in psutil.Process(node.pid).children(recursive=True):
                child.kill()
            node.kill()
            node.wait()


def test_a_node_child_and_its_workers_exit_when_its_supervisor_is_killed_with_sigkill(
    tmp_path: Path, router: RouterProcess
) -> None:
    """Before, the child lived on as an orphan with its port, workers and slots: a node
    restarted with the same ``--port`` failed to listen (``Address already in use``) and
    never rejoined until someone found and killed the orphan."""
    node = start_node(tmp_path, router)
    processes: list[psutil.Process] = []
    try:
        ready_nodes(router, 1)
        processes = psutil.Process(node.pid).children(recursive=True)
        assert processes, "expected the supervisor's server child"
        node.kill()
        node.wait()
        _gone, alive = psutil.wait_procs(processes, timeout=30)
        assert not alive, [(p.pid, p.cmdline()) for p in alive]
    finally:
        for process in processes:
            with contextlib.suppress(psutil.Error):
                process.kill()
        if node.poll() is None:
            node.kill()
            node.wait()
