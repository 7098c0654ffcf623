"""Per-worker memory and process limits (issue 11 item 2)."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest
from kcoral_server.processes import cgroups, limits
from kcoral_server.processes.cgroups import WorkerCgroup
from kcoral_server.processes.limits import WorkerLimits
from sandbox_helpers import execute, run_source
from server_process import start_server, stray_processes, strays_once_settled

MEMORY_LIMIT = 512 * 1024 * 1024

ALLOCATE = """
def main():
    chunks = []
    while True:
        chunks.append(bytearray(32 << 20))
"""

FORK_BOMB = """
import os, time

def main():
    while True:
        if os.fork() == 0:
            while True:
                try:
                    os.fork()
                except OSError:
                    time.sleep(0.01)
"""


def _pids_limit_enforceable() -> str | None:
    cgroup = cgroups.create_cgroup(WorkerLimits(processes=32))
    try:
        return None if cgroup.processes else "no writable cgroup with a pids controller"
    finally:
        cgroup.remove()


def _leftover_cgroups(server) -> list[Path]:
    """Worker cgroups of ``server`` (named after its pid) that outlive it: every server makes
    worker cgroups now that limits are on by default, so other servers' are ignored."""
    pattern = f"**/{cgroups.CGROUP_PREFIX}{server.process.pid}-*"
    return list(Path("/sys/fs/cgroup").glob(pattern))


def _worker_count(server) -> int:
    children = psutil.Process(server.process.pid).children(recursive=True)
    return sum(1 for c in children if "kcoral_server.worker" in " ".join(c.cmdline()))


# ---------------------------------------------------------------- units


def test_limits_come_from_the_config_and_the_process_limit_also_from_the_environment() -> None:
    class Config:
        worker_memory_limit_bytes = 1000

    parent = limits.workers_memory_bytes()  # the workers' parent holds an explicit share too
    assert limits.limits_from_config(Config(), {}) == WorkerLimits(1000, 0, False, parent)
    environ = {limits.PROCESS_LIMIT_ENV: "64"}
    assert limits.limits_from_config(Config(), environ) == WorkerLimits(1000, 64, False, parent)
    assert limits.limits_from_config(None, {}) == WorkerLimits(0, 0)


def test_a_server_config_has_limits_by_default_and_flags_win_over_the_environment() -> None:
    from kcoral_server.settings.config import ServerConfig

    environ = {limits.PROCESS_LIMIT_ENV: "64"}
    default = limits.limits_from_config(ServerConfig(), {}, seats=4)
    assert default.processes == limits.DEFAULT_PROCESS_LIMIT
    cache = ServerConfig().cache_capacity_bytes
    # four stateless seats, their spare workers and the default session seat share the
    # workers' memory
    assert default.memory_bytes == limits.default_memory_limit(9, cache_bytes=cache)
    assert default.memory_cgroup_only  # never an address-space rlimit nobody asked for
    assert limits.limits_from_config(ServerConfig(), environ).processes == 64
    explicit = ServerConfig(worker_process_limit=0, worker_memory_limit_bytes=0)
    assert limits.limits_from_config(explicit, environ) == WorkerLimits(0, 0)


def test_the_default_memory_share_is_at_least_4_gib_and_never_above_the_workers_memory() -> None:
    from kcoral_server.settings.config import physical_memory_bytes

    workers = limits.workers_memory_bytes()
    assert 0 < workers < (physical_memory_bytes() or 0)  # the reserve is never the workers'
    assert limits.default_memory_limit(1) == workers
    assert limits.default_memory_limit(10_000) == min(workers, limits.MIN_DEFAULT_MEMORY_BYTES)


def test_a_default_memory_limit_no_cgroup_enforces_is_not_an_rlimit() -> None:
    wanted = WorkerLimits(memory_bytes=1 << 30, memory_cgroup_only=True)
    assert limits.worker_limit_environment(wanted, WorkerCgroup(), "cpu") == {}


def test_the_worker_enforces_memory_itself_only_without_a_memory_cgroup() -> None:
    wanted = WorkerLimits(memory_bytes=1 << 30)
    env = limits.worker_limit_environment(wanted, WorkerCgroup(), "cpu")
    assert env == {limits.MEMORY_LIMIT_ENV: str(1 << 30), limits.MEMORY_RLIMIT_ENV: "AS"}
    env = limits.worker_limit_environment(wanted, WorkerCgroup(), "gpu")
    assert env[limits.MEMORY_RLIMIT_ENV] == "DATA"  # CUDA reserves huge address ranges
    enforced = WorkerCgroup([Path("/nonexistent")], memory_bytes=1 << 30)
    env = limits.worker_limit_environment(wanted, enforced, "cpu")
    assert env == {limits.MEMORY_LIMIT_ENV: str(1 << 30)}


def test_an_oom_kill_in_the_cgroup_is_reported_with_the_limit(tmp_path: Path) -> None:
    cgroup = WorkerCgroup([tmp_path], memory_bytes=4096)
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\n")
    assert cgroups.limit_message(cgroup) is None
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    message = cgroups.limit_message(cgroup)
    assert message is not None and "memory limit of 4096 bytes" in message


def test_the_launch_wrapper_enters_every_cgroup_before_the_command(tmp_path: Path) -> None:
    cgroup = WorkerCgroup([tmp_path / "a", tmp_path / "b"])
    wrapped = cgroup.wrap(["python", "-m", "x"])
    assert wrapped[:3] == ["/bin/sh", "-c", cgroups.SHIM]
    assert wrapped[4:] == [
        str(tmp_path / "a" / "cgroup.procs"),
        str(tmp_path / "b" / "cgroup.procs"),
        "--",
        "python",
        "-m",
        "x",
    ]
    assert WorkerCgroup().wrap(["python"]) == ["python"]


def test_the_memory_rlimit_is_applied_from_the_environment(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(limits.resource, "setrlimit", lambda which, v: calls.append((which, v)))
    environ = {limits.MEMORY_LIMIT_ENV: "123456789", limits.MEMORY_RLIMIT_ENV: "AS"}
    assert limits.apply_memory_rlimit(environ) == 123456789
    assert calls == [(limits.resource.RLIMIT_AS, (123456789, 123456789))]
    assert limits.apply_memory_rlimit({limits.MEMORY_LIMIT_ENV: "5"}) == 0  # cgroup enforces


# ---------------------------------------------------------------- servers


def test_a_program_that_allocates_past_the_memory_limit_fails_naming_the_limit(
    tmp_path: Path,
) -> None:
    server = start_server(tmp_path / "server", ["--worker-memory-limit-bytes", str(MEMORY_LIMIT)])
    try:
        status, body, _ = execute(server.url, run_source(ALLOCATE))
        if (
            status == 200
            and body["status"] == "FAILED"
            and "MemoryError" in body["error"]["message"]
        ):
            # rlimit: the allocation failed inside the program
            assert f"memory limit of {MEMORY_LIMIT} bytes" in body["error"]["message"]
            assert body["error"]["kind"] == "runtime"
        else:
            # memory cgroup: the kernel killed the worker; the crash path names the limit
            crashed = [e for e in server.events() if e["event"] == "worker_limit_exceeded"]
            assert crashed and str(MEMORY_LIMIT) in crashed[0]["message"], body
        status, body, _ = execute(server.url, run_source("def main():\n    return 5\n"))
        assert body["status"] == "COMPLETED", body
        assert strays_once_settled(server) == []
    finally:
        server.stop()


@pytest.mark.skipif(_pids_limit_enforceable() is not None, reason="pids limit unavailable")
def test_a_fork_bomb_is_bounded_by_the_process_limit_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    server = start_server(tmp_path / "server", [], env={limits.PROCESS_LIMIT_ENV: "32"})
    try:
        workers = _worker_count(server)
        status, body, _ = execute(server.url, run_source(FORK_BOMB, args=[]))
        assert status == 200 and body["status"] == "FAILED", body
        assert body["error"]["kind"] == "runtime"
        assert "process limit of 32" in body["error"]["message"]
        deadline = time.monotonic() + 30
        while stray_processes(server) or _worker_count(server) > workers:
            assert time.monotonic() < deadline, stray_processes(server)
            time.sleep(0.1)
        status, body, _ = execute(server.url, run_source("def main():\n    return 5\n"))
        assert body["status"] == "COMPLETED", body
    finally:
        server.stop()
    assert _leftover_cgroups(server) == []
