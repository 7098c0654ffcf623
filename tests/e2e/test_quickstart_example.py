"""``python examples/quickstart.py``, as the README runs it: its result, and no server log
lines around it unless ``--server-log`` asks for them (issue 29.8)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"

pytestmark = pytest.mark.timeout(400)


def run_example(tmp_path: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        capture_output=True,
        text=True,
        timeout=380,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_the_quickstart_example_prints_its_result_and_not_the_servers_log(tmp_path) -> None:
    output = run_example(tmp_path)
    assert "status: COMPLETED" in output and "scaling (2, 3) by 2.5" in output
    assert " INFO " not in output and "server_started" not in output
    assert "Shutdown requested" not in output and "listening on" not in output
    assert len(output.splitlines()) <= 10, output
    # It teaches the safe defaults: before, it started the server with --sandbox none and
    # no token, on a port every local process and web page can reach.
    command = output.splitlines()[0]
    assert command.startswith("$ KCORAL_AUTH_TOKEN=<a fresh token> kcoral server "), command
    assert "--sandbox" not in command


def test_the_server_log_switch_shows_the_servers_log_lines(tmp_path) -> None:
    output = run_example(tmp_path, "--server-log")
    assert "server_started" in output and "Shutdown requested" in output
    assert "status: COMPLETED" in output
    # The second run ("again:", what a program costs once torch is imported) goes to a
    # worker forked after the first: its seat's next worker, which waits for the fork
    # server's torch preload. Before, a second seat's first worker took it, forked before the
    # preload like the first, and imported torch itself: seconds, printed as the steady cost.
    # Its server has one seat for that: the first worker of a second seat is forked
    # before the preload too, and took the second run whenever the preload was still on.
    command = output.splitlines()[0].split()
    assert command[command.index("--num-workers") + 1] == "1", command
    routed = re.findall(r"request_routed .*?worker_id=(\S+) .*?generation=(\d+)", output)
    assert len(routed) == 2, output
    assert routed[1][1] != "1", routed  # generation 1: a worker forked at the start
