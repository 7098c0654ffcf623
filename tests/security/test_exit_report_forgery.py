"""A program that forges its worker's exit report (``worker_exiting``, SERVER §8).

Who can reach what: the frame comes from the worker's process, where the program's atexit
handlers run before the worker sends it. A program can therefore send one early, with the
code it likes, and then keep its worker busy or exit with another code. All it misreports
is its own teardown, which it controls anyway. It must never run beside its seat's next
program: a CPU seat hands over at a believed report (SERVER §6), so the forger is killed
then, with SIGKILL and no grace, before that program starts; and the server keeps serving.
"""

from __future__ import annotations

import sys
from pathlib import Path

import psutil

import kcoral

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from e2e_support import finished_events, module_program

FORGER = """
import atexit, os, signal, socket, sys, time

def forge():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL ends it
    from kcoral_server.processes import ipc
    fd = int(sys.argv[sys.argv.index("--fd") + 1])  # the worker's own channel
    channel = ipc.BlockingChannel(socket.socket(fileno=os.dup(fd)))
    channel.send(ipc.WorkerExiting(code=0))
    time.sleep(60.0)  # still running after the forged report
    os._exit(3)

atexit.register(forge)

def f():
    return os.getpid()
"""


def test_a_forged_exit_report_misreports_only_its_own_teardown(server_factory) -> None:
    server = server_factory("--max-requests-per-worker", "1")
    with kcoral.Client(server.url) as client:
        forged = client.execute(module_program(FORGER, "f"))
        # believed: the program lied about its own exit code, as it could about its result
        assert forged.status == "COMPLETED", forged
        after = client.execute(module_program("import os\ndef f():\n    return os.getpid()\n", "f"))
        assert after.status == "COMPLETED", after
        assert after["out"] != forged["out"]  # a fresh worker, not the forger's
        # the forger (its host pid) was killed before the next program ran: gone, reaped
        # or still in the kernel's teardown (no command line), never running its sleep
        routed = [e for e in server.events() if e["event"] == "request_routed"]
        assert not running_python(routed[-2]["pid"])
    events = finished_events(server)
    assert [e["finish_reason"] for e in events][-2:] == ["completed", "completed"]
    retired = [e for e in server.events() if e["event"] == "worker_retired"]
    assert retired  # the forger's worker was retired and replaced, not handed the next program


def running_python(pid: int) -> bool:
    """Whether ``pid`` still runs a program: alive with its command line (an exiting process
    has released its memory and shows none)."""
    try:
        process = psutil.Process(pid)
        return process.status() != psutil.STATUS_ZOMBIE and bool(process.cmdline())
    except psutil.Error:
        return False
