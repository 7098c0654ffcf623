"""A one-shot forked worker announces its exit code once nothing of it can change its
program's answer (``WorkerExiting``, SERVER §8, issue 31), and the front-end believes it
only then: after the program's exit handlers ran, with no process of the program left.

Real forked workers (a launcher without preloads, as the server's but lighter) and the
front-end's ``announced_exit`` against stand-ins for the rest."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kcoral_server.execution.exit_report import announced_exit
from kcoral_server.processes import ipc
from kcoral_server.processes.channel import WorkerGone
from kcoral_server.processes.launcher.front_end import Launcher
from worker_harness import launch, module


@pytest.fixture(scope="module")
def launcher() -> Iterator[Launcher]:
    launcher = Launcher()
    yield launcher
    launcher.close()


def _one_shot(tmp_path: Path, launcher: Launcher):
    worker = launch(tmp_path, transient=True, launcher=launcher)
    assert worker.ready is not None, worker.failed
    return worker


def test_a_one_shot_worker_says_its_exit_code_after_its_programs_exit_handlers_ran(
    tmp_path: Path, launcher: Launcher
):
    marker = tmp_path / "atexit-ran"
    source = (
        "import atexit, pathlib, time\n"
        f"def mark():\n    time.sleep(0.2)\n    pathlib.Path({str(marker)!r}).write_text('ran')\n"
        "atexit.register(mark)\n"
    )
    worker = _one_shot(tmp_path, launcher)
    result = worker.run([module("m", source)])
    assert result.finished.status == "COMPLETED", result.error
    message, _fds = worker.receive()
    assert message == ipc.WorkerExiting(code=0)
    assert marker.read_text() == "ran"  # before the frame: the answer may not wait longer
    with pytest.raises(EOFError):
        worker.receive()
    assert worker.proc.wait(30) == 0


def test_a_worker_whose_exit_handler_ends_it_never_announces_and_its_real_code_counts(
    tmp_path: Path, launcher: Launcher
):
    worker = _one_shot(tmp_path, launcher)
    result = worker.run([module("m", "import atexit, os\natexit.register(os._exit, 3)\n")])
    assert result.finished.status == "COMPLETED", result.error
    with pytest.raises(EOFError):  # no WorkerExiting: the front-end waits for the exit
        worker.receive()
    assert worker.proc.wait(30) == 3


def test_processes_an_exit_handler_starts_are_killed_before_the_announcement(
    tmp_path: Path, launcher: Launcher
):
    pid_file = tmp_path / "child.pid"
    source = (
        "import atexit, pathlib, subprocess\n"
        "def spawn():\n"
        "    child = subprocess.Popen(['sleep', '600'])\n"
        f"    pathlib.Path({str(pid_file)!r}).write_text(str(child.pid))\n"
        "atexit.register(spawn)\n"
    )
    worker = _one_shot(tmp_path, launcher)
    assert worker.run([module("m", source)]).finished.status == "COMPLETED"
    message, _fds = worker.receive()
    assert message == ipc.WorkerExiting(code=0)
    child = int(pid_file.read_text())
    assert not Path(f"/proc/{child}").exists()  # killed and reaped by the worker
    assert worker.proc.wait(30) == 0


# ---------------------------------------------------------------- the front-end's side


class Channel:
    def __init__(self, answer: Any) -> None:
        self.answer = answer

    async def receive(self, timeout: float | None) -> tuple[Any, list[int]]:
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer, []


class Strays:
    def __init__(self, alive: list[int]) -> None:
        self.alive = alive

    def find(self) -> list[int]:
        return self.alive


class Handle:
    def __init__(self, answer: Any, alive: list[int] | None = None) -> None:
        self.channel = Channel(answer)
        self.strays = Strays(alive or [])


def _announced(handle: Handle) -> int | None:
    return asyncio.run(announced_exit(handle, 5.0))  # type: ignore[arg-type]


def test_the_front_end_takes_the_announced_code_only_when_nothing_else_still_runs() -> None:
    assert _announced(Handle(ipc.WorkerExiting(code=0))) == 0
    assert _announced(Handle(ipc.WorkerExiting(code=7))) == 7
    # a process of the program is alive: killed and confirmed before the answer
    assert _announced(Handle(ipc.WorkerExiting(code=0), alive=[4242])) is None


def test_without_an_announcement_the_front_end_awaits_the_exit_itself() -> None:
    assert _announced(Handle(WorkerGone("channel closed"))) is None  # a spawned worker
    assert _announced(Handle(TimeoutError())) is None  # past the deadline
    assert _announced(Handle(ipc.WorkerReady(pid=1))) is None  # anything else


# What the worker's last frame goes out with: ``report_exit`` in a process of its own (it
# turns that process non-dumpable), with a channel that notes the flag when it sends.
REPORT_EXIT = """
import ctypes, json
from kcoral_server.worker.main import report_exit

PR_GET_DUMPABLE = 3
libc = ctypes.CDLL(None, use_errno=True)
sent = []

class NotingChannel:
    def send(self, message):
        sent.append([message.tag, libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)])

before = libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)
report_exit(NotingChannel(), 0)
print(json.dumps({"before": before, "sent": sent}))
"""


def test_a_one_shot_worker_is_no_longer_dumpable_when_it_says_its_exit_code() -> None:
    """From its last frame on, the next program of its sandbox may run beside what is left
    of it: like the worker forked ahead, it cannot then be ptraced or have its ``/proc``
    memory, environment or descriptors read by that program (SERVER §6)."""
    done = subprocess.run(
        [sys.executable, "-c", REPORT_EXIT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["before"] == 1
    assert seen["sent"] == [["worker_exiting", 0]]
