"""Attacks on the defaults (issue 16, points 4 and 7c): a silent downgrade to no sandbox, a
reused worker that carries one identity's files to the next, and a program that starts
processes without bound.

Before the fix ``--sandbox bubblewrap`` that could not run quietly continued unconfined,
nothing told a client which sandbox it got, the notebook's embedded server ran with
``--sandbox none``, a reused bubblewrap worker showed one client's ``/tmp`` and ``HOME`` to
the next, and a worker had no process limit by default.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from kcoral_server.processes import cgroups, limits
from sandbox_default_support import (
    broken_bwrap,
    bwrap_problem,
    execute,
    request,
    returned,
    run_source,
)
from server_process import start_server, strays_once_settled

NO_BWRAP = bwrap_problem()
needs_bwrap = pytest.mark.skipif(NO_BWRAP is not None, reason=f"bubblewrap unusable: {NO_BWRAP}")


def _path_with(directory: Path) -> dict[str, str]:
    return {"PATH": f"{directory}{os.pathsep}{os.environ.get('PATH', '')}"}


def test_an_explicit_bubblewrap_sandbox_that_cannot_run_refuses_to_start(tmp_path: Path) -> None:
    stub = broken_bwrap(tmp_path / "bin")
    command = [sys.executable, "-m", "kcoral", "server", "--port", "0", "--device", "cpu"]
    command += ["--sandbox", "bubblewrap", "--log-dir", "", "--disk-cache-dir", ""]
    done = subprocess.run(
        command,
        env={**os.environ, **_path_with(stub)},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert "--sandbox bubblewrap cannot run here" in done.stderr
    assert "Permission denied" in done.stderr  # the reason bwrap gave
    assert "listening" not in done.stderr


def test_the_auto_sandbox_falls_back_to_none_loudly(tmp_path: Path) -> None:
    stub = broken_bwrap(tmp_path / "bin")
    server = start_server(tmp_path / "server", ["--sandbox", "auto"], env=_path_with(stub))
    try:
        status, info = request(server.url, "GET", "/v1/info")
        events = server.events()
    finally:
        server.stop()
    assert status == 200 and info["sandbox"] == "none", info
    disabled = [e for e in events if e["event"] == "sandbox_disabled"]
    assert len(disabled) == 1 and disabled[0]["level"] == "WARNING", disabled
    assert "Permission denied" in disabled[0]["error"]


@needs_bwrap
def test_a_server_without_a_sandbox_flag_confines_programs(tmp_path: Path) -> None:
    from kcoral_jupyter.settings import KCoral

    # exactly the notebook's embedded server (its default arguments), plus a private cache
    args = [*KCoral().local_args, "--disk-cache-dir", str(tmp_path / "cache")]
    assert "--sandbox" not in args
    server = start_server(tmp_path / "server", args, defaults=False)
    try:
        status, info = request(server.url, "GET", "/v1/info")
        where = returned(
            execute(
                server.url,
                run_source("import json, os\ndef main():\n    return json.dumps(os.getcwd())\n"),
            )
        )
    finally:
        server.stop()
    assert status == 200 and info["sandbox"] == "bubblewrap", info
    assert where.startswith("/work") or where.startswith("/kcoral-work"), where


LEAVE = """
import json, os
def main(mark):
    for directory in ("/tmp", os.environ["HOME"], os.environ.get("XDG_CACHE_HOME", "/tmp")):
        with open(os.path.join(directory, "left-by-" + mark), "w") as f:
            f.write(mark)
    return json.dumps(True)
"""
LOOK = """
import json, os
def main():
    found = []
    for directory in ("/tmp", os.environ["HOME"], os.environ.get("XDG_CACHE_HOME", "/tmp")):
        found += [n for n in os.listdir(directory) if n.startswith("left-by-")]
    return json.dumps(sorted(set(found)))
"""


@needs_bwrap
def test_a_reused_sandboxed_worker_shows_nothing_of_one_identity_to_another(
    tmp_path: Path,
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("alice alice-token-77c1\nbob bob-token-3a9e\n")
    os.chmod(tokens, 0o600)
    server = start_server(
        tmp_path / "server",
        [
            "--sandbox",
            "bubblewrap",
            "--max-requests-per-worker",
            "0",
            "--auth-token-file",
            str(tokens),
        ],
    )
    try:
        alice, bob = "alice-token-77c1", "bob-token-3a9e"
        assert returned(execute(server.url, run_source(LEAVE, args=["alice"]), alice))
        # the same identity keeps its reused worker (and what it left there)
        assert returned(execute(server.url, run_source(LOOK), alice)) == ["left-by-alice"]
        assert returned(execute(server.url, run_source(LOOK), bob)) == []
        assert returned(execute(server.url, run_source(LEAVE, args=["bob"]), bob))
        assert returned(execute(server.url, run_source(LOOK), alice)) == []
        retired = [e for e in server.events() if e["event"] == "worker_retired"]
    finally:
        server.stop()
    assert [e["reason"] for e in retired] == ["identity", "identity"], retired


@needs_bwrap
@pytest.mark.parametrize("layout", ["tmp-linked", "tmp-private"])
def test_a_fresh_sandboxed_worker_finds_nothing_its_predecessor_left_in_work_or_tmp(
    tmp_path: Path, layout: str
) -> None:
    # one worker per request (the default): the seat's fork server starts each one in the
    # same sandbox, which must look new to it. A read-only path under /tmp (an install or
    # checkout there, as in a CI clone) makes the sandbox's /tmp a private tmpfs that the
    # front-end cannot empty from outside.
    extra = []
    if layout == "tmp-private":
        readonly = tmp_path / "readonly"
        readonly.mkdir()
        assert str(readonly).startswith("/tmp/"), readonly
        extra = ["--sandbox-readonly-path", str(readonly)]
    server = start_server(
        tmp_path / "server",
        ["--sandbox", "bubblewrap", "--max-requests-per-worker", "1", *extra],
    )
    leave = """
import json, os
def main():
    for directory in (os.getcwd(), "/tmp", "/dev/shm"):
        with open(os.path.join(directory, "left-by-first"), "w") as f:
            f.write("x")
    return json.dumps(os.getpid())
"""
    look = """
import json, os
def main():
    return json.dumps(
        [d for d in (os.getcwd(), "/tmp", "/dev/shm") if "left-by-first" in os.listdir(d)]
    )
"""
    try:
        first = returned(execute(server.url, run_source(leave)))
        second = returned(execute(server.url, run_source(look)))
        third = returned(execute(server.url, run_source(leave)))
    finally:
        server.stop()
    assert second == []
    assert first != third  # a new worker each time


# The reported attack forked 300 processes; threads count against the same limit
# (pids.max) and are far cheaper to pile up to it on a shared test machine.
FORK_UNTIL_REFUSED = """
import json, os, signal, threading, time
def main(forks, most):
    children, threads = [], []
    stop = threading.Event()
    error = None
    try:
        while len(children) < forks:
            pid = os.fork()
            if pid == 0:
                time.sleep(300)
                os._exit(0)
            children.append(pid)
        while len(children) + len(threads) < most:
            thread = threading.Thread(target=stop.wait, daemon=True)
            thread.start()
            threads.append(thread)
    except (OSError, RuntimeError) as exc:
        error = exc.__class__.__name__ + ": " + str(exc)
    finally:
        stop.set()
        for pid in children:
            os.kill(pid, signal.SIGKILL)
        for pid in children:
            os.waitpid(pid, 0)
        for thread in threads:
            thread.join()
    return json.dumps({"processes": len(children), "threads": len(threads), "error": error})
"""


def _default_process_limit_problem() -> str | None:
    wanted = limits.WorkerLimits(processes=limits.DEFAULT_PROCESS_LIMIT)
    if cgroups.unenforced(wanted):
        return "no writable pids cgroup here"
    return None


@pytest.mark.skipif(
    _default_process_limit_problem() is not None, reason=str(_default_process_limit_problem())
)
def test_a_program_that_forks_without_end_hits_the_default_process_limit(tmp_path: Path) -> None:
    server = start_server(tmp_path / "server", [])  # no limit flags: the defaults
    try:
        most = limits.DEFAULT_PROCESS_LIMIT + 100
        program = run_source(FORK_UNTIL_REFUSED, args=[300, most])
        found = returned(execute(server.url, program))
        events = server.events()
    finally:
        server.stop()
    assert found["processes"] == 300, found  # what used to run unbounded still works...
    assert found["error"] is not None, found  # ... but the pile stops at the limit
    assert found["processes"] + found["threads"] < limits.DEFAULT_PROCESS_LIMIT, found
    assert not [
        e
        for e in events
        if e["event"] == "worker_limits_unenforced" and "processes" in " ".join(e["missing"])
    ]


CRASH = "import os, signal\ndef main():\n    os.kill(os.getpid(), signal.SIGKILL)\n"
HANG = "def main():\n    while True:\n        pass\n"
DAEMON = """
import json, os, time
def main():
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(600)
        os._exit(0)
    return json.dumps("left a daemon")
"""


@needs_bwrap
def test_a_sandboxed_program_that_crashes_hangs_or_leaves_a_daemon_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    # the seat's sandboxed fork server must clean up like a spawned sandbox did
    server = start_server(
        tmp_path / "server", ["--sandbox", "bubblewrap", "--max-requests-per-worker", "1"]
    )
    try:
        crashed = execute(server.url, run_source(CRASH))
        assert crashed["status"] == "FAILED", crashed
        hang = run_source(HANG)
        hang["options"] = {"timeout_seconds": 2}
        hung = execute(server.url, hang, status=504)
        assert hung["error"]["kind"] == "timeout", hung
        daemon = execute(server.url, run_source(DAEMON))
        assert "left background processes" in daemon["error"]["message"], daemon
        assert returned(execute(server.url, run_source(LOOK))) == []
        assert strays_once_settled(server) == []
        assert server.stop() == 0
    finally:
        server.stop()


OWN_MEMORY_LIMIT = """
import json
def main():
    for line in open("/proc/self/cgroup").read().splitlines():
        _id, controllers, path = line.split(":", 2)
        if controllers == "memory":
            name = f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"
        elif controllers == "":
            name = f"/sys/fs/cgroup{path}/memory.max"
        else:
            continue
        try:
            value = open(name).read().strip()
        except OSError:
            continue
        if value.isdigit():
            return json.dumps(int(value))
    return json.dumps(None)
"""


def _default_memory_limit_problem() -> str | None:
    wanted = limits.WorkerLimits(memory_bytes=limits.default_memory_limit(1))
    if not wanted.memory_bytes or cgroups.unenforced(wanted):
        return "no writable memory cgroup here"
    return None


@pytest.mark.skipif(
    _default_memory_limit_problem() is not None, reason=str(_default_memory_limit_problem())
)
def test_a_worker_runs_under_a_memory_limit_without_any_flag(tmp_path: Path) -> None:
    server = start_server(tmp_path / "server", [])  # no limit flags: the defaults
    try:
        limit = returned(execute(server.url, run_source(OWN_MEMORY_LIMIT)))
    finally:
        server.stop()
    # one stateless seat and the default session seat share what the reserve leaves
    # (``start_server`` reuses workers, so the seat keeps no spare)
    from kcoral_server.settings.config import ServerConfig

    config = ServerConfig(max_requests_per_worker=0)
    assert limit == limits.limits_from_config(config, {}, seats=1).memory_bytes
