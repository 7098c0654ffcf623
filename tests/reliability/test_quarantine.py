"""Clean-up that cannot be confirmed (PROTOCOL §6.5, §7.1; SERVER §8, §11).

Whoever supervises a worker (the fork server, or the supervisor of a spawned worker) reports
its exit only once every descendant is gone. When that report never comes, or says that a
descendant survived ``SIGKILL``, the front-end answers 500 ``engine``, quarantines the GPUs
and stops admitting requests. A process that survives ``SIGKILL`` (uninterruptible sleep)
cannot be made on purpose, so these tests stop the supervisor itself (``SIGSTOP``: it can no
longer vouch for anything) or run it with a ``kill`` that spares one process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from kcoral_server.processes import procfs
from kcoral_server.processes.launcher.front_end import supervised_command
from kcoral_server.processes.launcher.wire import ORPHAN_KILL_ENV
from reliability_support import (
    TRIVIAL,
    check_documented,
    check_error,
    check_healthy,
    execute,
    get,
    launch,
    module_program,
)
from waiting import wait_until

CLEANUP_MESSAGE = "worker cleanup was not confirmed; affected devices unavailable"
#: the supervisor gives up on orphans this fast here (the default is 10 s)
FAST = {ORPHAN_KILL_ENV: "0.3"}

REPORT_PARENT = """
import os, time
def run(marker, go):
    with open(marker + ".tmp", "w") as f:
        f.write(str(os.getppid()))  # the launcher, or the spawned worker's supervisor
    os.rename(marker + ".tmp", marker)
    while not os.path.exists(go):
        time.sleep(0.01)
    return "done"
"""


@pytest.mark.parametrize("launch_mode", ["fork", "spawn"])
def test_a_gpu_set_whose_worker_cleanup_is_unconfirmed_is_quarantined_and_admission_stops(
    tmp_path: Path, launch_mode: str
) -> None:
    server = launch(
        tmp_path / "server",
        [
            "--device",
            "fake-gpu",
            "--fake-gpu-count",
            "2",
            "--workers-per-gpu",
            "1",
            "--worker-termination-grace-seconds",
            "0.2",
        ],
        env={**FAST, "KCORAL_WORKER_LAUNCH": launch_mode},
    )
    marker, go = tmp_path / "parent", tmp_path / "go"
    program = module_program(REPORT_PARENT, "run", [str(marker), str(go)], gpu_count=1)
    answers: list = []
    thread = threading.Thread(target=lambda: answers.append(execute(server.url, program)))
    supervisor = None
    try:
        thread.start()
        assert wait_until(marker.exists, 60)
        supervisor = int(marker.read_text())
        os.kill(supervisor, signal.SIGSTOP)  # from now on nobody can vouch for the worker
        go.touch()
        thread.join(60)
        (answer,) = answers
        check_error(answer, 500, "engine")
        assert answer.body["error"]["message"] == CLEANUP_MESSAGE

        # The server keeps serving, but admits nothing more.
        later = execute(server.url, TRIVIAL)
        check_error(later, 503, "busy")
        # ...and says so: this is no wait worth retrying (the message names the cause).
        message = later.body["error"]["message"]
        assert message.startswith("server saturated: it admits no program since a worker's end")
        assert message.endswith("its operator must restart it")
        assert later.headers["retry-after"] == "1"
        health = get(server.url, "/health")
        assert health.status == 200 and health.body["status"] == "ok"
        assert health.body["load"]["request_capacity"] == 0

        events = server.events()
        (quarantine,) = [e for e in events if e["event"] == "devices_quarantined"]
        assert quarantine["level"] == "ERROR" and len(quarantine["gpu_ids"]) == 1
        assert quarantine["quarantined"] == quarantine["gpu_ids"]
        finished = [
            e
            for e in events
            if e["event"] == "request_finished" and e["request_id"] == answer.body["request_id"]
        ]
        assert finished[0]["finish_reason"] == "server_error"
        assert finished[0]["error_message"] == CLEANUP_MESSAGE
    finally:
        if supervisor is not None:
            os.kill(supervisor, signal.SIGCONT)
        thread.join(60)
        server.stop()
    assert server.process.returncode == 0, server.stderr()[-3000:]


def test_a_request_queued_when_devices_are_quarantined_is_answered_503(tmp_path: Path) -> None:
    server = launch(
        tmp_path / "server",
        ["--num-workers", "1", "--worker-termination-grace-seconds", "0.2"],
        env={**FAST, "KCORAL_WORKER_LAUNCH": "spawn"},
    )
    marker, go = tmp_path / "parent", tmp_path / "go"
    # One reused worker, asked to retire after this request: its clean-up is then checked.
    program = module_program(REPORT_PARENT, "run", [str(marker), str(go)], timeout_seconds=3)
    answers: dict[str, object] = {}
    first = threading.Thread(target=lambda: answers.update(first=execute(server.url, program)))
    queued = threading.Thread(target=lambda: answers.update(queued=execute(server.url, TRIVIAL)))
    supervisor = None
    try:
        first.start()
        assert wait_until(marker.exists, 60)
        supervisor = int(marker.read_text())
        os.kill(supervisor, signal.SIGSTOP)
        queued.start()
        # (queued unless the quarantine came first, which answers it 503 just the same)
        wait_until(lambda: get(server.url, "/health").body["load"]["requests_waiting"] == 1, 5)
        # the program never finishes by itself: its timeout kills it, unconfirmably
        first.join(60)
        queued.join(60)
        check_error(answers["first"], 500, "engine")
        assert answers["first"].body["error"]["message"] == CLEANUP_MESSAGE
        check_error(answers["queued"], 503, "busy")
        check_documented(answers["queued"])
    finally:
        if supervisor is not None:
            os.kill(supervisor, signal.SIGCONT)
        go.touch()
        first.join(60)
        queued.join(60)
        server.stop()
    assert server.process.returncode == 0, server.stderr()[-3000:]


# ------------------------------------------------------------------ the supervisors

#: a ``kill_process`` that spares the pids listed in a file: a descendant that "survives"
SPARING_KILL = """
import os, signal
import kcoral_server.processes.launcher.family as launcher
from kcoral_server.processes.launcher import spawn_supervisor, wire
_real_kill = launcher.kill_process
def _sparing_kill(pid, sig=signal.SIGKILL):
    try:
        with open(os.environ["SPARE_FILE"]) as f:
            spared = {int(p) for p in f.read().split()}
    except OSError:
        spared = set()
    if pid not in spared:
        _real_kill(pid, sig)
launcher.kill_process = _sparing_kill
"""

#: a worker command that leaves a daemon behind (its pid in SPARE_FILE) and exits 3
LEAVES_A_DAEMON = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    with open(os.environ["SPARE_FILE"] + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(os.environ["SPARE_FILE"] + ".tmp", os.environ["SPARE_FILE"])
    time.sleep(120)
    os._exit(0)
while not os.path.exists(os.environ["SPARE_FILE"]):
    time.sleep(0.01)
sys.exit(3)
"""


def test_the_fork_server_reports_a_descendant_that_survived_sigkill(tmp_path: Path) -> None:
    """The launcher's bookkeeping (a subreaper) reports the exit with one survivor once the
    daemon has outlived ``SIGKILL`` for the configured time."""
    spare = tmp_path / "spare"
    script = SPARING_KILL + textwrap.dedent(
        f"""
        import select, subprocess, sys
        from kcoral_server.worker.reaper import become_subreaper
        become_subreaper()
        family = launcher.Family()
        status_r, status_w = os.pipe()
        worker = subprocess.Popen([sys.executable, "-c", {LEAVES_A_DAEMON!r}])
        family.workers[worker.pid] = status_w
        while not select.select([status_r], [], [], 0.01)[0]:
            family.collect()
        code, survivors = wire.STATUS.unpack(os.read(status_r, wire.STATUS.size))
        daemon = int(open(os.environ["SPARE_FILE"]).read())
        _real_kill(daemon)
        print(json.dumps([code, survivors, family.orphans == [daemon]]))
        """
    )
    env = {**os.environ, **FAST, "SPARE_FILE": str(spare)}
    result = subprocess.run(
        [sys.executable, "-c", "import json\n" + script],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [3, 1, True]


def test_a_spawned_workers_supervisor_stays_until_a_surviving_descendant_is_gone(
    tmp_path: Path,
) -> None:
    """The supervisor's exit is the worker's exit report: while a descendant survives
    ``SIGKILL`` it does not exit, so the front-end cannot take it for a clean-up."""
    spare = tmp_path / "spare"
    env = {**os.environ, **FAST, "SPARE_FILE": str(spare)}
    supervised_command([sys.executable, "-c", LEAVES_A_DAEMON], env)
    entry = SPARING_KILL + "import sys\nsys.exit(spawn_supervisor.supervise(os.getppid()))\n"
    supervisor = subprocess.Popen([sys.executable, "-c", entry], env=env)
    try:
        assert wait_until(spare.exists, 60)
        daemon = int(spare.read_text())
        # Far past the orphan limit (0.3 s), the supervisor still waits for the daemon.
        time.sleep(1.5)
        assert supervisor.poll() is None
        os.kill(daemon, signal.SIGKILL)
        assert supervisor.wait(30) == 3
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()


# ------------------------------------------------------------------ a sandbox proves it


def sandbox_launchers(server_pid: int) -> list[int]:
    """The fork servers of the server's seats: bwrap (outside) -> bwrap (the sandbox PID
    namespace's init) -> the launcher."""
    found = []
    for outer in procfs.children(server_pid):
        for init in procfs.children(outer):
            found += procfs.children(init)
    return found


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (bwrap)")
def test_fork_servers_killed_in_their_sandboxes_leave_a_server_that_keeps_serving(
    tmp_path: Path,
) -> None:
    # A fork server killed from outside (the out-of-memory killer picks the biggest
    # process: a fork server with torch preloaded) cannot report on its workers' orphans.
    # Before, that made every such seat's clean-up unconfirmed: the GPUs were quarantined
    # and the server admitted nothing until restarted. Under the sandbox the proof is the
    # PID namespace: its init exits once everything in it is gone.
    server = launch(
        tmp_path / "server",
        ["--device", "fake-gpu", "--fake-gpu-count", "1", "--workers-per-gpu", "1",
         "--sandbox", "bubblewrap", "--max-requests-per-worker", "1"],
    )  # fmt: skip
    try:
        check_healthy(server.url)
        sleeper = module_program("import time\ndef f():\n    time.sleep(60)\n", "f", [])
        answers: list = []
        thread = threading.Thread(target=lambda: answers.append(execute(server.url, sleeper)))
        thread.start()
        running = lambda: get(server.url, "/health").body["load"]["requests_in_progress"] == 1  # noqa: E731
        assert wait_until(running, 60)
        launchers = sandbox_launchers(server.process.pid)
        assert launchers
        for pid in launchers:
            os.kill(pid, signal.SIGKILL)
        thread.join(60)
        (answer,) = answers
        check_documented(answer)
        assert answer.status != 503, answer.body
        for _ in range(3):  # the seat works again, and no device is quarantined
            again = execute(server.url, module_program("def f():\n    return 7\n", "f", []))
            assert again.status == 200 and again.body["status"] == "COMPLETED", again.body
        capacity = lambda: get(server.url, "/health").body["load"]["request_capacity"] > 0  # noqa: E731
        assert wait_until(capacity, 30)
        assert not [e for e in server.events() if e["event"] == "devices_quarantined"]
    finally:
        server.stop()
