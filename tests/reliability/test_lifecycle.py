"""Worker process lifecycle: one-shot workers under a stream of requests, stale workspaces of
a killed front-end, and the launcher's supervision of what a dead worker leaves behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from kcoral_server.processes import ipc, sandbox
from kcoral_server.processes.launcher.front_end import Launcher, supervised_command
from kcoral_server.storage import workspace
from reliability_support import (
    TRIVIAL,
    check_documented,
    exchange,
    execute,
    execute_body,
    get,
    is_alive,
    launch,
    module_program,
    multipart_type,
    request_bytes,
    warm,
    workspaces,
)
from waiting import wait_until

BWRAP_PROBLEM = sandbox.probe()


@pytest.mark.slow
def test_two_hundred_requests_on_one_shot_workers_all_complete(watched_server) -> None:
    """Each worker exits right after its outcome: frames already in the socket must be
    processed before its exit counts as a crash (SERVER §8)."""
    server = watched_server("--num-workers", "2", "--max-requests-per-worker", "1")
    statuses = []
    for _ in range(200):
        answer = execute(server.url, TRIVIAL)
        check_documented(answer)
        statuses.append(answer.body.get("status"))
        if answer.body.get("status") != "COMPLETED":
            pytest.fail(f"request {len(statuses)}: {answer.body}")
    finished = [e for e in server.events() if e["event"] == "request_finished"]
    assert [e["finish_reason"] for e in finished].count("completed") >= 200


# ------------------------------------------------------------------ stale workspaces


def _dead_instance(directory: Path, token: str, locked_by_nobody: bool = True) -> Path:
    """A workspace of an instance that is gone: its lock file exists but nobody holds it."""
    if locked_by_nobody:
        (directory / f"kcoral-instance-{token}.lock").write_bytes(b"")
    path = directory / f"kcoral-program-{token}-abcd1234"
    (path / "sub").mkdir(parents=True)
    (path / "sub" / "file").write_bytes(b"x")
    return path


def test_workspaces_of_a_dead_instance_are_removed_and_live_ones_kept(tmp_path) -> None:
    live = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from kcoral_server.storage import workspace;"
            f"workspace.remove_stale_workspaces({str(tmp_path)!r});"
            f"import tempfile; tempfile.tempdir = {str(tmp_path)!r};"
            "print(workspace.Workspace.create(None, None).path, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        live_workspace = Path(live.stdout.readline().strip())
        assert live_workspace.is_dir()
        dead = _dead_instance(tmp_path, "0123456789ab")
        lockless = _dead_instance(tmp_path, "ba9876543210", locked_by_nobody=False)
        legacy = tmp_path / "kcoral-program-q1w2e3r4"
        legacy.mkdir()
        assert workspace.remove_stale_workspaces(tmp_path) == 2
        assert not dead.exists() and not lockless.exists()
        assert not (tmp_path / "kcoral-instance-0123456789ab.lock").exists()
        assert live_workspace.is_dir() and legacy.is_dir()
    finally:
        live.kill()
        live.wait()
    # Once its owner is gone (SIGKILL: no clean-up), the live one is stale too.
    assert workspace.remove_stale_workspaces(tmp_path) == 1
    assert not live_workspace.exists() and legacy.is_dir()


def test_the_callers_own_workspaces_are_never_taken_for_stale(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    mine = workspace.Workspace.create(None, None)
    try:
        assert workspace.remove_stale_workspaces(tmp_path) == 0
        assert mine.path.is_dir()
    finally:
        mine.remove()


@pytest.mark.slow
def test_a_restarted_front_end_removes_the_workspace_a_killed_one_left(tmp_path) -> None:
    directory = tmp_path / "node"
    first = warm(launch(directory, ["--num-workers", "1"]))
    source = "import time\ndef hang():\n    time.sleep(600)\n"
    program = {
        "instructions": [
            {"op": "upload", "id": "m", "kind": "module", "source": source},
            {"op": "get_function", "id": "f", "module": {"$ref": "m"}, "name": "hang"},
            {"op": "run", "id": "r", "fn": {"$ref": "f"}, "args": []},
        ],
        "options": {"timeout_seconds": 600},
    }
    threading.Thread(target=lambda: _ignore(execute, first.url, program), daemon=True).start()
    assert wait_until(lambda: len(workspaces(first.temp_dir)) == 1, 30)
    time.sleep(0.5)  # the worker is in the program (the workspace exists before it runs)
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(10)
    assert len(workspaces(first.temp_dir)) == 1  # nobody could remove it
    second = warm(launch(directory, ["--num-workers", "1"]))
    try:
        assert workspaces(second.temp_dir) == []
    finally:
        second.stop()


@pytest.mark.slow
@pytest.mark.skipif(
    BWRAP_PROBLEM is not None, reason=f"bubblewrap cannot run here: {BWRAP_PROBLEM}"
)
def test_a_restarted_front_end_removes_the_sandboxes_and_job_store_a_killed_one_left(
    tmp_path,
) -> None:
    """Under bubblewrap (the default) a program's files live in its seat's sandbox
    directory, not in a workspace, and a large job result in the job store: a killed
    front-end left both, and no later start removed them (their names held no instance)."""
    directory = tmp_path / "node"
    args = ["--num-workers", "1", "--sandbox", "bubblewrap"]
    first = warm(launch(directory, args))
    big = module_program("def big():\n    return b'x' * (2 << 20)\n", "big", [])
    submitted = exchange(
        first.url,
        request_bytes("POST", "/v1/jobs", execute_body(big), [("Content-Type", multipart_type())]),
    )
    assert submitted.status == 202, submitted.raw
    job = f"/v1/jobs/{submitted.body['job_id']}"
    assert wait_until(lambda: get(first.url, job).body["status"] == "COMPLETED", 30)

    def left_by_the_first() -> set[str]:
        prefixes = (workspace.SANDBOX_PREFIX, workspace.JOBS_PREFIX)
        return {p.name for p in first.temp_dir.iterdir() if p.name.startswith(prefixes)}

    left = left_by_the_first()
    assert {name.split("-")[1] for name in left} == {"sandbox", "jobs"}
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(10)
    assert left_by_the_first() == left  # nobody could remove them
    second = warm(launch(directory, args))
    try:
        assert left_by_the_first() & left == set()
    finally:
        second.stop()


def _ignore(function, *args) -> None:
    try:
        function(*args)
    except Exception:
        pass


# ------------------------------------------------------------------ the launcher


@pytest.fixture
def launcher():
    launcher = Launcher()
    yield launcher
    launcher.close()


DAEMONIZE = """
import os, time
def go(marker):
    first = os.fork()
    if first == 0:  # a daemon: double fork and setsid, then the worker dies under it
        os.setsid()
        if os.fork() == 0:
            with open(marker + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(marker + ".tmp", marker)
            time.sleep(600)
        os._exit(0)
    os.waitpid(first, 0)
    while not os.path.exists(marker):
        time.sleep(0.01)
    os._exit(3)
"""


def test_a_dead_workers_setsid_descendants_are_killed_before_its_exit_is_reported(
    launcher, tmp_path
) -> None:
    parent, child = socket.socketpair()
    try:
        process = launcher.launch(child.fileno(), dict(os.environ))
    finally:
        child.close()
    channel = ipc.BlockingChannel(parent)
    channel.sock.settimeout(60)
    channel.send(
        ipc.Configure(
            worker_id="cpu/w0",
            generation=1,
            device="cpu",
            log_programs=False,
            allowed_serialization=["json"],
        )
    )
    assert isinstance(channel.receive()[0], ipc.WorkerReady)
    marker = tmp_path / "daemon"
    program = {
        "instructions": [
            {"op": "upload", "id": "m", "kind": "module", "source": DAEMONIZE},
            {"op": "get_function", "id": "f", "module": {"$ref": "m"}, "name": "go"},
            {"op": "run", "id": "r", "fn": {"$ref": "f"}, "args": [str(marker)]},
        ]
    }
    work = tmp_path / "ws"
    work.mkdir()
    channel.send(
        ipc.RunProgram(
            request_id="r1",
            program_json=json.dumps(program),
            workspace=str(work),
            stdout_path=None,
            stderr_path=None,
        )
    )
    try:
        assert process.wait(60) == 3
        # Reported only once the daemon is gone: the launcher, a subreaper, killed it.
        assert not is_alive(int(marker.read_text()))
    finally:
        parent.close()


def test_workers_die_with_their_launcher_and_the_launcher_with_its_front_end(tmp_path) -> None:
    """A stand-in front-end (a plain Python process) starts a launcher and one worker, then
    is killed: the launcher and the worker follow it."""
    out = tmp_path / "pids"
    front_end = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, socket, time\n"
            "from kcoral_server.processes.launcher.front_end import Launcher\n"
            "launcher = Launcher()\n"
            "parent, child = socket.socketpair()\n"
            "process = launcher.launch(child.fileno(), dict(os.environ))\n"
            f"open({str(out)!r}, 'w').write(f'{{launcher._process.pid}} {{process.pid}}')\n"
            "time.sleep(600)\n",
        ]
    )
    try:
        assert wait_until(lambda: out.exists() and out.read_text().count(" ") == 1, 60)
        launcher_pid, worker_pid = map(int, out.read_text().split())
        assert is_alive(launcher_pid) and is_alive(worker_pid)
        front_end.send_signal(signal.SIGKILL)
        front_end.wait(10)
        assert wait_until(lambda: not is_alive(launcher_pid) and not is_alive(worker_pid), 10)
    finally:
        if front_end.poll() is None:
            front_end.kill()
            front_end.wait()


def test_a_supervised_spawned_worker_reports_the_workers_own_exit_code(tmp_path) -> None:
    env = dict(os.environ)
    command = [sys.executable, "-c", "import os; os.kill(os.getpid(), 15)"]
    supervisor = subprocess.Popen(supervised_command(command, env), env=env)
    assert supervisor.wait(60) == -signal.SIGTERM
    plain = [sys.executable, "-c", "raise SystemExit(7)"]
    env = dict(os.environ)
    assert subprocess.run(supervised_command(plain, env), env=env, timeout=60).returncode == 7
