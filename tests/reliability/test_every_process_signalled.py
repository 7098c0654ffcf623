"""SIGTERM to every process of a server at once, as a plain ``scancel`` of a node job (or a
``kill`` of all its processes) sends it (SERVER §8): the running program is answered with
why its worker died, and nothing is quarantined.

Before, the fork server died of the same SIGTERM before reporting on its workers'
descendants: the program read ``HTTP 500: worker cleanup was not confirmed; affected devices
unavailable`` (a CPU server has no devices), and the log said ``devices_quarantined`` twice.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from kcoral_server.execution.exit_cause import OUTSIDE_SIGTERM, exit_cause
from kcoral_server.processes import procfs
from server_process import start_server

import kcoral

# It says it sleeps by creating ``started``: the kill must land inside the instruction, and a
# fixed pause after the request was routed raced the worker's start on a loaded machine.
SLEEPS = (
    "import time\ndef nap(started):\n    open(started, 'w').close()\n    time.sleep(60)\n"
    "    return 'woke'\n"
)


def nap_program(started: Path) -> kcoral.Program:
    program = kcoral.Program()
    module = program.upload(kind="module", source=SLEEPS)
    value = program.run(fn=program.get_function(module=module, name="nap"), args=[str(started)])
    program.return_(key="value", value=value)
    return program


def whole_tree(root: int) -> list[int]:
    found, frontier = [root], [root]
    while frontier:
        children = procfs.descendants(frontier.pop())
        frontier += [pid for pid in children if pid not in found]
        found += [pid for pid in children if pid not in found]
    return found


def test_a_sigterm_the_server_did_not_send_is_named_as_such() -> None:
    assert exit_cause(-signal.SIGTERM, ended_alone=True) == OUTSIDE_SIGTERM
    assert exit_cause(-signal.SIGTERM) is None  # the server's own kill sends it too
    assert exit_cause(-signal.SIGKILL, ended_alone=True) is None


@pytest.mark.slow
def test_a_program_whose_server_is_signalled_whole_is_told_why_and_nothing_is_quarantined(
    tmp_path: Path,
) -> None:
    server = start_server(tmp_path)
    started = tmp_path / "napping"
    answers: list[object] = []

    def run() -> None:
        with kcoral.Client(server.url) as client:
            try:
                answers.append(client.execute(nap_program(started)))
            except kcoral.KCoralError as exc:
                answers.append(exc)

    caller = threading.Thread(target=run)
    caller.start()
    try:
        deadline = time.monotonic() + 60
        while not started.exists():  # the program sleeps in its worker
            assert time.monotonic() < deadline, server.stderr()
            time.sleep(0.05)
        for pid in whole_tree(server.process.pid):  # the attack: every process at once
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        caller.join(60)
    finally:
        server.stop()
    [answer] = answers
    assert isinstance(answer, kcoral.ProgramResult), answer
    assert answer.status == "FAILED" and answer.error["kind"] == "runtime", answer.error
    assert answer.error["message"] == (
        f"worker exited while executing the instruction: {OUTSIDE_SIGTERM}"
    )
    assert not any(e.get("event") == "devices_quarantined" for e in server.events())
