"""A stop signal that reaches ``kcoral server`` while it starts (SERVER §12): the start-up
ends, the server never listens and stops as after a drain, without a traceback. Before, a
Ctrl-C there raised ``KeyboardInterrupt`` through ``asyncio.run`` (a 30-line traceback) and
SIGTERM ended the process at once, leaving its workers to die with it.

A stop signal while the fork servers preload torch, right after the start, frees the port
once the drain is done and ends the preload: the server waited for the whole import (30 s
with 16 fake-GPU seats), its port bound meanwhile, and for an import that never ended it
never stopped."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kcoral_server.processes import sandbox
from kcoral_server.processes.procfs import children

from kcoral import cli

START_SECONDS = 60.0
#: a hang guard for the stop, not a timing check: the stop waits for no import
STOP_SECONDS = 60.0
BWRAP_PROBLEM = sandbox.probe()
#: a ``torch`` whose import never ends: a preload as long as the test allows
ENDLESS_TORCH = """
import time
while True:
    time.sleep(0.01)
"""


def start_plain_server(
    directory: Path, *flags: str, port: int = 0
) -> tuple[subprocess.Popen, Path, Path]:
    """``kcoral server`` with its default flags (the sandbox, its own device choice) and
    ``flags`` on ``port`` (0: a free one); returns the process, its stderr file and its
    ready file."""
    directory.mkdir(parents=True, exist_ok=True)
    ready, stderr_path = directory / "ready", directory / "server.stderr"
    command = [sys.executable, "-m", "kcoral", "server", "--port", str(port), *flags]
    command += ["--ready-file", str(ready), "--log-dir", str(directory / "logs")]
    env = {k: v for k, v in os.environ.items() if k != "KCORAL_AUTH_TOKEN"}
    with open(stderr_path, "wb") as stderr:
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=stderr, cwd=directory, env=env
        )
    return process, stderr_path, ready


def wait_for_start_up(
    process: subprocess.Popen, stderr_path: Path, event: str = "server_started"
) -> None:
    """Until the server logs ``event``; by default ``server_started``: its signal handlers
    are in place, and its pool (worker processes with torch mapped) has not started yet."""
    deadline = time.monotonic() + START_SECONDS
    while event not in stderr_path.read_text(errors="replace"):
        assert process.poll() is None, stderr_path.read_text(errors="replace")
        assert time.monotonic() < deadline, f"no {event}"
        time.sleep(0.01)


def descendants(pid: int) -> set[int]:
    found, stack = set(), [pid]
    while stack:
        for child in children(stack.pop()):
            found.add(child)
            stack.append(child)
    return found


def running(pid: int) -> bool:
    """Whether ``pid`` still runs (an exited process waiting to be reaped does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_during_start_up_stops_the_server_without_a_traceback_or_listening(
    tmp_path: Path, signum: int
) -> None:
    process, stderr_path, ready = start_plain_server(tmp_path)
    try:
        wait_for_start_up(process, stderr_path)
        process.send_signal(signum)
        process.send_signal(signum)  # a repeated signal changes nothing (SERVER §12)
        code = process.wait(START_SECONDS)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    said = stderr_path.read_text(errors="replace")
    assert code == 0, said
    assert "Traceback" not in said and "KeyboardInterrupt" not in said, said
    name = signal.Signals(signum).name
    assert said.count(f"kcoral server: {name}: stopping once start-up ends") == 1, said
    assert "listening on" not in said and not ready.exists()
    assert "shutdown_complete" in said and "server_stopped" in said


@pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=f"no bubblewrap here: {BWRAP_PROBLEM}")
def test_a_stop_during_the_workers_preload_frees_the_port_and_ends_without_waiting_for_it(
    tmp_path: Path,
) -> None:
    shadow = tmp_path / "shadow"  # first on the sandbox's PYTHONPATH: the launchers' torch
    (shadow / "torch").mkdir(parents=True)
    (shadow / "torch" / "__init__.py").write_text(ENDLESS_TORCH)
    with socket.socket() as taken:  # a port of our own, to see when it is free again
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
    flags = ["--worker-preload", "torch", "--sandbox-readonly-path", str(shadow)]
    process, stderr_path, _ready = start_plain_server(tmp_path / "server", *flags, port=port)
    try:
        wait_for_start_up(process, stderr_path, "worker_preload_started")
        wait_for_start_up(process, stderr_path, "listening on")  # it comes a moment later
        family = descendants(process.pid)
        assert family  # its sandboxes, fork servers and workers
        process.send_signal(signal.SIGTERM)
        code = process.wait(STOP_SECONDS)  # old code: for ever (its spares' forks waited)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    said = stderr_path.read_text(errors="replace")
    assert code == 0, said
    assert port_is_free(port)
    assert "shutdown_complete" in said and "Traceback" not in said, said
    # bubblewrap's processes end with their parent (PR_SET_PDEATHSIG): a moment later
    deadline = time.monotonic() + STOP_SECONDS
    while [pid for pid in family if running(pid)]:
        assert time.monotonic() < deadline, [pid for pid in family if running(pid)]
        time.sleep(0.01)


def test_ctrl_c_before_a_sub_command_handles_it_is_one_line_and_status_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import kcoral_server.main
    import kcoral_server.router.main

    def interrupted(argv: object) -> int:
        raise KeyboardInterrupt  # as Ctrl-C does while Python imports the sub-command

    monkeypatch.setattr(kcoral_server.main, "main", interrupted)
    monkeypatch.setattr(kcoral_server.router.main, "main", interrupted)
    assert cli.main(["server"]) == 130
    assert cli.main(["router"]) == 130
    assert cli.server_main([]) == 130
    assert capsys.readouterr().err == "kcoral: interrupted\n" * 3
