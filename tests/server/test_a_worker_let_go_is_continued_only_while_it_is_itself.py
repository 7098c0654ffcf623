"""A worker forked ahead is sent SIGCONT when let go (``ForkedProcess.release``), as the
program beside it may have stopped it (SERVER §14). Its launcher reaps it, not the server:
once it has exited its number may name another process, which that SIGCONT reached (a
neighbour's program stopped on purpose, a debugger's). The signal now goes only to the
process forked, by its number and start time, and never to a worker known ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
from kcoral_server.processes.launcher.front_end import ForkedProcess
from kcoral_server.processes.procfs import Identity, identity, state


@pytest.fixture
def stopped() -> Iterator[subprocess.Popen[bytes]]:
    """A process stopped by SIGSTOP, standing for the worker or for whoever has its number."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    os.kill(child.pid, signal.SIGSTOP)
    while state(child.pid) != "T":
        os.sched_yield()
    yield child
    child.kill()
    child.wait()


def let_go(pid: int, forked_as: Identity | None, returncode: int | None = None) -> None:
    """``release`` a held worker of number ``pid`` forked as ``forked_as``."""
    status_read, status_write = os.pipe()
    go_read, go_write = os.pipe()
    process = ForkedProcess(pid, status_read)
    process.forked_as = forked_as
    process.returncode = returncode
    process.hold(go_write)
    try:
        process.release()
        assert os.read(go_read, 1) == b"g"
    finally:
        for fd in (status_read, status_write, go_read):
            os.close(fd)


def test_a_worker_that_was_stopped_goes_on_when_let_go(stopped: subprocess.Popen[bytes]) -> None:
    let_go(stopped.pid, identity(stopped.pid))
    while state(stopped.pid) == "T":  # SIGCONT is delivered as it is sent; this is a check
        os.sched_yield()
    assert state(stopped.pid) in ("S", "R")


def test_a_number_that_names_another_process_now_is_never_continued(
    stopped: subprocess.Popen[bytes],
) -> None:
    now = identity(stopped.pid)
    assert now is not None
    let_go(stopped.pid, (now[0], now[1] - 1))  # the worker that had this number before
    assert state(stopped.pid) == "T"


def test_a_worker_known_ended_is_never_signalled(stopped: subprocess.Popen[bytes]) -> None:
    let_go(stopped.pid, identity(stopped.pid), returncode=0)
    assert state(stopped.pid) == "T"
