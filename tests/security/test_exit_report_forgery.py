"""A program that forges its worker's exit report (``worker_exiting``, SERVER §8).

Who can reach what: the frame comes from the worker's process, where the program's atexit
handlers run before the worker sends it. A program can therefore send one early, with the
code it likes, and then keep its worker busy or exit with another code. All it misreports
is its own teardown, which it controls anyway. The seat must still wait for the real exit
before its next program, and the server must keep serving.
"""

from __future__ import annotations

import sys
from pathlib import Path

import kcoral

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from e2e_support import finished_events, module_program

FORGER = """
import atexit, os, socket, sys, time

def forge():
    from kcoral_server.processes import ipc
    fd = int(sys.argv[sys.argv.index("--fd") + 1])  # the worker's own channel
    channel = ipc.BlockingChannel(socket.socket(fileno=os.dup(fd)))
    channel.send(ipc.WorkerExiting(code=0))
    time.sleep(1.0)  # still running after the forged report
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
    events = finished_events(server)
    assert [e["finish_reason"] for e in events][-2:] == ["completed", "completed"]
    retired = [e for e in server.events() if e["event"] == "worker_retired"]
    assert retired  # the forger's worker was retired and replaced, not handed the next program
