"""A second stop signal landing while a server, a router or a node's supervisor exits says
nothing and changes nothing.

Seen in a node's log at the end of a CI run: ``Exception ignored when trying to write to
the signal wakeup fd: ... OSError: [Errno 9] Bad file descriptor`` after
``supervisor_stopped``. asyncio's loop closes its self-pipe before it removes its signal
handlers, and a SIGTERM landed between. Each process here runs with its loop patched to
send itself that SIGTERM at that moment (``with_a_stop_signal_as_the_loop_closes``), so the
race is met every time; the old code printed the line in each case.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from child_setup import with_a_stop_signal_as_the_loop_closes
from router_helpers import node_command, ready_nodes, start_router

WAKEUP_LINE = "signal wakeup fd"


def started(command: list[str], log: Path, cwd: Path | None = None) -> subprocess.Popen[bytes]:
    with open(log, "wb") as output:
        return subprocess.Popen(
            with_a_stop_signal_as_the_loop_closes(command),
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=cwd,
        )


def wait_for_file(path: Path, process: subprocess.Popen[bytes], log: Path) -> None:
    """Until ``path`` holds text, failing at once with ``log`` if ``process`` has exited
    (not waiting's ``wait_for_file``: the file is written after it appears, and a process
    that died at start-up would otherwise be waited out for the whole minute)."""
    deadline = time.monotonic() + 60
    while not (path.exists() and path.read_text().strip()):
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)


def stopped_quietly(process: subprocess.Popen[bytes], log: Path) -> str:
    """The process's output once SIGTERM has stopped it with status 0."""
    process.send_signal(signal.SIGTERM)
    try:
        status = process.wait(60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log.read_text()
    assert status == 0, output
    return output


#: what each process is started with besides ``--port 0 --ready-file``, and its last line
STARTS = {
    "server": (
        ["--device", "cpu", "--log-dir", "logs", "--disk-cache-dir", "cache"],
        "server_stopped",
    ),
    "router": ([], "router_stopped"),
}


@pytest.mark.parametrize("process", list(STARTS))
def test_a_process_stopped_as_a_second_sigterm_lands_says_nothing_of_a_wakeup_fd(
    tmp_path: Path, process: str
) -> None:
    arguments, last_line = STARTS[process]
    ready, log = tmp_path / "ready", tmp_path / f"{process}.log"
    command = [sys.executable, "-m", "kcoral", process, "--port", "0", "--ready-file", str(ready)]
    started_process = started([*command, *arguments], log, cwd=tmp_path)
    wait_for_file(ready, started_process, log)
    output = stopped_quietly(started_process, log)
    assert last_line in output, output
    assert WAKEUP_LINE not in output, output


def test_a_node_stopped_as_a_second_sigterm_lands_says_nothing_of_a_wakeup_fd(
    tmp_path: Path,
) -> None:
    router = start_router(tmp_path, "--status-check-interval-seconds", "0.2")
    try:
        log = tmp_path / "node.log"
        node = started(node_command(tmp_path, router.url, "n1"), log)
        try:
            ready_nodes(router, 1)
        finally:
            output = stopped_quietly(node, log)
        assert "supervisor_stopped" in output, output
        assert WAKEUP_LINE not in output, output
    finally:
        router.stop()
