"""A program that stops its seat's fork server, or the worker forked ahead beside it
(SERVER §14; 2026-12, sandbox sweep).

The attacker is a token holder's program on the default sandboxed server. It runs as the
same user as its seat's launcher, in the same sandbox, so ``SIGSTOP`` reaches it; the
stopped launcher then reported no worker's end, the pool quarantined, and every
identity's programs were refused ('server saturated: it admits no program since a
worker's end could not be confirmed') until the operator restarted the server. Its sandbox
is ended instead, and the seat serves on. A worker forked ahead that the program stopped
never answered its start: the seat's next program, of any identity, waited out the start-up
timeout (60 s) for it; it is woken when let go.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from alice_and_bob import SAY_WHO, completed_value, one_seat_server
from identity_support import TOKEN_A, TOKEN_B
from kcoral_server.processes import sandbox

BWRAP_PROBLEM = sandbox.probe()

STOP_MY_LAUNCHER = """
import os, signal

def main():
    launcher = os.getppid()
    command = open(f"/proc/{launcher}/cmdline", "rb").read().replace(b"\\0", b" ").decode()
    os.kill(launcher, signal.SIGSTOP)
    return command
"""

STOP_THE_WORKERS_BESIDE_ME = """
import os, signal, time

def siblings():
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                fields = open(f"/proc/{name}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getppid():
                found.append(int(name))
    return found

def main():
    for _ in range(20):  # the seat may fork its next worker while this one runs
        if found := siblings():
            break
        time.sleep(0.1)
    for pid in found:
        os.kill(pid, signal.SIGSTOP)
    return found
"""


@pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=f"bubblewrap cannot run: {BWRAP_PROBLEM}")
def test_a_program_that_stops_its_fork_server_leaves_the_server_serving_every_identity(
    tmp_path: Path,
) -> None:
    server = one_seat_server(tmp_path)
    try:
        stopped = completed_value(server.url, TOKEN_A, STOP_MY_LAUNCHER, [])
        assert "kcoral_server.processes.launcher" in stopped
        for who, token in (("bob", TOKEN_B), ("bob", TOKEN_B), ("alice", TOKEN_A)):
            assert completed_value(server.url, token, SAY_WHO, [who]) == who
        kinds = {event["event"] for event in server.events()}
        assert "devices_quarantined" not in kinds, server.stderr()[-3000:]
    finally:
        server.stop()


@pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=f"bubblewrap cannot run: {BWRAP_PROBLEM}")
def test_a_worker_forked_ahead_that_a_program_stopped_keeps_no_one_waiting_for_its_start(
    tmp_path: Path,
) -> None:
    server = one_seat_server(tmp_path)
    try:
        stopped = []
        for _ in range(3):
            assert completed_value(server.url, TOKEN_A, SAY_WHO, ["alice"]) == "alice"
            stopped += completed_value(server.url, TOKEN_A, STOP_THE_WORKERS_BESIDE_ME, [])
            for who, token in (("alice", TOKEN_A), ("bob", TOKEN_B)):
                assert completed_value(server.url, token, SAY_WHO, [who]) == who
        assert stopped, "no program ever saw a worker forked ahead beside it"
        failed = [event for event in server.events() if event["event"] == "worker_failed"]
        assert failed == [], failed
    finally:
        server.stop()
