"""Disk a sandboxed program can fill (issue 28 point 8).

One program put 1.9 GB into its workspace, ``/tmp`` and ``/dev/shm``: under bubblewrap the
latter two linked into the workspace on the host's disk, and nothing bounded either. Now
``/tmp``, ``/var/tmp`` and ``/dev/shm`` are sized tmpfs (charged to the worker's memory
cgroup) and the front-end ends a program whose sandbox directory passes
``--workspace-limit-bytes``, naming the limit.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from kcoral_server.processes import sandbox
from kcoral_server.processes.launch import MIN_TMPFS_BYTES, tmpfs_bytes_for
from kcoral_server.settings.config import ServerConfig
from kcoral_server.storage import workspace_watch
from kcoral_server.storage.workspace_watch import WorkspaceWatch, disk_usage
from sandbox_helpers import execute, run_source
from server_process import start_server

BWRAP_PROBLEM = sandbox.probe()
needs_bwrap = pytest.mark.skipif(
    BWRAP_PROBLEM is not None, reason=f"bubblewrap cannot run here: {BWRAP_PROBLEM}"
)
MIB = 1024 * 1024
# a small share keeps the tmpfs small: filling one past its size costs little memory
MEMORY_LIMIT = 1024 * MIB

SCRATCH_SIZES = """
import json, os

def main():
    found = {}
    for directory in ("/tmp", "/var/tmp", "/dev/shm"):
        stat = os.statvfs(directory)
        found[directory] = {
            "mount": os.path.ismount(directory),
            "bytes": stat.f_blocks * stat.f_frsize,
        }
    return json.dumps(found)
"""

# Writes ``size`` bytes into ``directory`` in 1 MiB steps; says where the writes stopped.
FILL = """
import errno, os

def main(directory, size):
    written = 0
    try:
        with open(os.path.join(directory, "fill"), "wb") as f:
            while written < size:
                f.write(b"x" * (1 << 20))
                f.flush()
                written += 1 << 20
    except OSError as exc:
        return f"stopped at {written}: {errno.errorcode.get(exc.errno, exc.errno)}"
    return f"wrote {written}"
"""

# Fills the workspace and keeps it full: the front-end's watch must end it.
FILL_WORKSPACE = """
import os, time

def main(size):
    with open("big", "wb") as f:
        for _ in range(size >> 20):
            f.write(b"x" * (1 << 20))
            f.flush()
            os.fsync(f.fileno())
    time.sleep(300)
    return "the workspace bound did not hold"
"""


def _returned(answer: tuple) -> object:
    status, body, _parts = answer
    assert status == 200 and body["status"] == "COMPLETED", body
    node = body["results"]["value"]
    if node["type"] != "string":
        return node["value"]
    try:
        return json.loads(node["value"])  # the programs that return JSON text
    except ValueError:
        return node["value"]


# ---------------------------------------------------------------- units


def test_the_scratch_tmpfs_size_is_a_quarter_of_the_memory_share() -> None:
    explicit = ServerConfig(worker_memory_limit_bytes=MEMORY_LIMIT)
    assert tmpfs_bytes_for(explicit, 1) == MEMORY_LIMIT // 4
    tiny = ServerConfig(worker_memory_limit_bytes=MIB)
    assert tmpfs_bytes_for(tiny, 1) == MIN_TMPFS_BYTES
    # no memory limit asked for: still the size of the default share's quarter
    assert tmpfs_bytes_for(ServerConfig(worker_memory_limit_bytes=0), 1) >= MIN_TMPFS_BYTES


def test_disk_usage_counts_allocated_bytes_and_stops_early(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "one").write_bytes(b"x" * MIB)
    (tmp_path / "two").write_bytes(b"x" * MIB)
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(1024 * MIB)  # apparent size only: no disk
    (tmp_path / "link").symlink_to("/usr")  # never followed
    used = disk_usage(tmp_path)
    assert 2 * MIB <= used < 3 * MIB
    assert disk_usage(tmp_path / "missing") == 0


def test_a_program_that_ends_before_the_first_interval_costs_no_walk_of_its_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    walks: list[Path] = []
    monkeypatch.setattr(workspace_watch, "disk_usage", lambda root, limit: walks.append(root) or 0)

    async def short_program() -> None:
        watch = WorkspaceWatch(tmp_path, MIB, None, lambda: None)
        watch.start()
        await asyncio.sleep(0)  # the watch task starts, then the program ends
        await watch.stop()

    asyncio.run(short_program())
    assert walks == []


def test_the_workspace_limit_is_one_flag_with_a_default() -> None:
    from kcoral_server.settings.command_line import parse_server_args

    assert ServerConfig().workspace_limit_bytes == 4 * 1024**3
    settings = parse_server_args(["--workspace-limit-bytes", "1000"], {})
    assert settings.config.workspace_limit_bytes == 1000


# ---------------------------------------------------------------- servers


@needs_bwrap
def test_tmp_var_tmp_and_dev_shm_are_sized_tmpfs_that_a_program_cannot_fill_past_their_size(
    tmp_path: Path,
) -> None:
    args = ["--sandbox", "bubblewrap", "--worker-memory-limit-bytes", str(MEMORY_LIMIT)]
    server = start_server(tmp_path / "server", args)
    try:
        sizes = _returned(execute(server.url, run_source(SCRATCH_SIZES)))
        expected = MEMORY_LIMIT // 4
        for directory in ("/tmp", "/var/tmp", "/dev/shm"):
            assert sizes[directory] == {"mount": True, "bytes": expected}, sizes
        # the attack: more than the size into each; the write stops at the size (ENOSPC)
        for directory in ("/tmp", "/dev/shm"):
            answer = _returned(
                execute(server.url, run_source(FILL, args=[directory, expected + 32 * MIB]))
            )
            assert str(answer).startswith("stopped at") and "ENOSPC" in str(answer), answer
        assert _returned(execute(server.url, run_source("def main():\n    return 5\n"))) == 5
    finally:
        server.stop()


@needs_bwrap
def test_a_program_that_writes_past_the_workspace_limit_ends_naming_the_limit(
    tmp_path: Path,
) -> None:
    limit = 16 * MIB
    args = ["--sandbox", "bubblewrap", "--workspace-limit-bytes", str(limit)]
    server = start_server(tmp_path / "server", args)
    try:
        status, body, _ = execute(
            server.url, run_source(FILL_WORKSPACE, args=[64 * MIB]), timeout=300
        )
        assert status == 200 and body["status"] == "FAILED", body
        assert body["error"]["kind"] == "runtime", body
        message = body["error"]["message"]
        assert "disk limit of 16.0 MiB" in message and "--workspace-limit-bytes" in message
        events = server.events()
        hits = [e for e in events if e["event"] == "worker_limit_exceeded"]
        assert hits and "--workspace-limit-bytes" in hits[0]["message"], hits
        retired = [e for e in events if e["event"] == "worker_retired"]
        assert any(e["reason"] == "disk_limit" for e in retired), retired
        # the seat gets a fresh directory: its next program is not ended by the last one's
        assert _returned(execute(server.url, run_source("def main():\n    return 5\n"))) == 5
    finally:
        server.stop()


@needs_bwrap
def test_a_session_program_past_the_workspace_limit_ends_the_session_not_the_server(
    tmp_path: Path,
) -> None:
    from raw_http import execute_body, request

    limit = 16 * MIB
    args = ["--sandbox", "bubblewrap", "--workspace-limit-bytes", str(limit)]
    server = start_server(tmp_path / "server", args)
    try:
        created = request(server.url, "POST", "/v1/sessions", b"{}")
        assert created.status == 201, created.body
        sid = created.body["session_id"]
        content_type, body = execute_body(run_source(FILL_WORKSPACE, args=[64 * MIB]))
        answer = request(
            server.url,
            "POST",
            f"/v1/sessions/{sid}/execute",
            body,
            {"Content-Type": content_type},
            timeout=300,
        )
        assert answer.status == 200 and answer.body["status"] == "FAILED", answer.body
        assert "disk limit of 16.0 MiB" in answer.body["error"]["message"]
        assert _returned(execute(server.url, run_source("def main():\n    return 5\n"))) == 5
    finally:
        server.stop()
