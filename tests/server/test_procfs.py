"""Process trees read from /proc (``kcoral_server.processes.procfs``), as the front-end, the fork
server and the worker read them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from kcoral_server.processes import procfs

# a child that starts a grandchild, prints its pid and sleeps
TREE = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(60)\n"
)


def test_descendants_lists_children_and_grandchildren_parents_first() -> None:
    parent = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        grandchild = int(parent.stdout.readline())
        found = procfs.descendants()
        assert found.index(parent.pid) < found.index(grandchild)
        assert procfs.descendants(parent.pid) == [grandchild]
        assert procfs.children(parent.pid) == [grandchild]
        assert procfs.is_alive(grandchild) and procfs.state(grandchild) in ("S", "R")
    finally:
        procfs.signal_all(procfs.descendants(parent.pid), signal.SIGKILL, group=None)
        parent.kill()
        parent.wait()


def test_a_zombie_is_not_alive_and_a_reaped_process_has_no_state() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    for _ in range(500):
        if procfs.state(child.pid) == "Z":
            break
        time.sleep(0.01)
    assert procfs.state(child.pid) == "Z" and not procfs.is_alive(child.pid)
    assert child.pid not in procfs.live_descendants()
    child.wait()
    assert procfs.state(child.pid) is None and not procfs.is_alive(child.pid)


def test_kill_process_signals_a_live_child() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    procfs.kill_process(child.pid, signal.SIGKILL)
    assert child.wait(10) == -signal.SIGKILL


def test_this_process_is_found_by_its_own_namespace_pid() -> None:
    assert procfs.namespace_pid(os.getpid()) == str(os.getpid())
    assert procfs.namespace_pid(-1) is None


def test_a_child_reports_its_parent_and_keeps_its_session_until_it_calls_setsid() -> None:
    kept = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    own = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        assert procfs.parent(kept.pid) == os.getpid()
        assert procfs.sid(kept.pid) == os.getsid(0)
        assert procfs.sid(own.pid) == own.pid
    finally:
        for child in (kept, own):
            child.kill()
            child.wait()
    assert procfs.parent(kept.pid) is None and procfs.sid(own.pid) is None


def test_a_process_is_exiting_once_killed_and_a_running_one_with_threads_is_not() -> None:
    threads = "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()\n"
    child = subprocess.Popen(
        [sys.executable, "-c", threads + "print(1, flush=True)\ntime.sleep(60)"],
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None and child.stdout.readline()
        assert len(os.listdir(f"/proc/{child.pid}/task")) == 2
        assert not procfs.exiting(child.pid)
        child.kill()
        deadline = time.monotonic() + 10
        while not procfs.exiting(child.pid) and time.monotonic() < deadline:
            time.sleep(0.001)
        assert procfs.exiting(child.pid)  # killed: a zombie (or still tearing down) until reaped
    finally:
        child.kill()
        child.wait()
    assert procfs.exiting(child.pid)  # reaped: gone
