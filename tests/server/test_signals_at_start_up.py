"""A stop signal that reaches ``kcoral server`` while it starts (SERVER §12): the start-up
ends, the server never listens and stops as after a drain, without a traceback. Before, a
Ctrl-C there raised ``KeyboardInterrupt`` through ``asyncio.run`` (a 30-line traceback) and
SIGTERM ended the process at once, leaving its workers to die with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kcoral import cli

START_SECONDS = 60.0


def start_plain_server(directory: Path) -> tuple[subprocess.Popen, Path, Path]:
    """``kcoral server`` with its default flags (the sandbox, its own device choice) on a
    free loopback port; returns the process, its stderr file and its ready file."""
    directory.mkdir(parents=True, exist_ok=True)
    ready, stderr_path = directory / "ready", directory / "server.stderr"
    command = [sys.executable, "-m", "kcoral", "server", "--port", "0"]
    command += ["--ready-file", str(ready), "--log-dir", str(directory / "logs")]
    env = {k: v for k, v in os.environ.items() if k != "KCORAL_AUTH_TOKEN"}
    with open(stderr_path, "wb") as stderr:
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=stderr, cwd=directory, env=env
        )
    return process, stderr_path, ready


def wait_for_start_up(process: subprocess.Popen, stderr_path: Path) -> None:
    """Until the server logs ``server_started``: its signal handlers are in place, and its
    pool (worker processes with torch mapped) has not started yet."""
    deadline = time.monotonic() + START_SECONDS
    while "server_started" not in stderr_path.read_text(errors="replace"):
        assert process.poll() is None, stderr_path.read_text(errors="replace")
        assert time.monotonic() < deadline, "no server_started"
        time.sleep(0.01)


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
