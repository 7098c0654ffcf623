"""Start a real ``kcoral server`` subprocess on loopback and describe where its files are.

Imported by ``tests/conftest.py`` (fixtures) and by tests that start servers themselves. The
module name is unique across the test tree so that plain ``import`` finds it from any folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from child_setup import under_open_file_limit

START_TIMEOUT_SECONDS = 60.0


@dataclass
class RunningServer:
    """A started server process and where its files are."""

    url: str
    process: subprocess.Popen
    directory: Path
    stderr_path: Path
    log_dir: Path
    disk_cache_dir: Path
    args: list[str] = field(default_factory=list)

    @property
    def host(self) -> str:
        return self.url.split("://", 1)[1].rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def events(self) -> list[dict]:
        """Every record of the run's ``events.jsonl`` so far."""
        records = []
        for path in sorted(self.log_dir.glob("runs/*/events.jsonl")):
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    records.append(json.loads(line))
        return records

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(10)


def client_token_file(directory: Path, lines: str) -> Path:
    """A client-token file as an operator writes one (``NAME TOKEN`` lines, mode 0600)."""
    path = directory / "client-tokens"
    path.write_text(lines)
    path.chmod(0o600)
    return path


def start_server(
    directory: Path,
    args: Sequence[str] = (),
    *,
    env: dict[str, str] | None = None,
    defaults: bool = True,
    open_files: tuple[int, int | None] | None = None,
) -> RunningServer:
    """Start ``python -m kcoral server`` and wait for its ready file (``open_files`` (soft,
    hard) lowers its descriptor limit; ``None`` for hard keeps the hard limit)."""
    directory.mkdir(parents=True, exist_ok=True)
    ready = directory / "ready"
    ready.unlink(missing_ok=True)
    log_dir = directory / "logs"
    disk = directory / "disk-cache"
    command = [sys.executable, "-m", "kcoral", "server", "--port", "0", "--ready-file", str(ready)]
    if defaults:
        given = set(args)
        base = {
            "--sandbox": "none",
            "--device": "cpu",
            "--max-requests-per-worker": "0",
            "--disk-cache-dir": str(disk),
            "--log-dir": str(log_dir),
        }
        for option, value in base.items():
            if option not in given:
                command += [option, value]
    command += list(args)
    if open_files is not None:
        command = under_open_file_limit(command, *open_files)
    stderr_path = directory / "server.stderr"
    full_env = dict(os.environ)
    full_env.pop("KCORAL_AUTH_TOKEN", None)
    full_env.update(env or {})
    with open(stderr_path, "wb") as stderr:
        process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=full_env,
            cwd=directory,
        )
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise RuntimeError(
                "server did not start:\n" + stderr_path.read_text(errors="replace")[-4000:]
            )
        time.sleep(0.05)
    url = ready.read_text(encoding="utf-8").strip()
    return RunningServer(url, process, directory, stderr_path, log_dir, disk, list(command))


@contextlib.contextmanager
def running_server(
    directory: Path, args: Sequence[str] = (), *, env: dict[str, str] | None = None
) -> Iterator[RunningServer]:
    """``start_server`` for a ``with`` block (session and module fixtures); stops on exit."""
    server = start_server(directory, args, env=env)
    try:
        yield server
    finally:
        server.stop()


#: What runs under a server by design: its workers and what launches them.
WORKER_PROCESS_MARKS = ("kcoral_server.worker", "kcoral_server.processes.launcher", "bwrap")


def stray_processes(server: RunningServer) -> list[str]:
    """``"pid command line"`` of each process under ``server`` that is neither a worker nor
    what launches one (the fork server, bwrap)."""
    import psutil  # a test dependency; the servers these helpers start never need it

    try:
        children = psutil.Process(server.process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    strays = []
    for child in children:
        try:
            line = " ".join(child.cmdline())
        except psutil.NoSuchProcess:
            continue
        if not any(mark in line for mark in WORKER_PROCESS_MARKS):
            strays.append(f"{child.pid} {line}")
    return strays


def strays_once_settled(server: RunningServer, within: float = 15.0) -> list[str]:
    """``stray_processes``, waiting at most ``within`` seconds for the exiting ones.

    A one-shot worker sends its exit report before the kernel has torn it down, and the
    answer goes out on that report (SERVER §8): the worker that ran the last program may
    still be exiting when the answer arrives, and an exiting process has no command line.
    Only such processes are waited for; a stray with a command line is returned at once,
    and one that stays without a command line (never reaped) is returned after ``within``."""
    deadline = time.monotonic() + within
    while (strays := stray_processes(server)) and time.monotonic() < deadline:
        if any(line.partition(" ")[2] for line in strays):
            break
        time.sleep(0.1)
    return strays
