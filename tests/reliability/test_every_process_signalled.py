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
from pathlib import Path

import pytest
from kcoral_server.execution.exit_cause import OUTSIDE_SIGTERM, SANDBOX_SIGTERM, exit_cause
from kcoral_server.processes import procfs, sandbox
from server_process import start_server

import kcoral

# It says it sleeps on its stdout (a job's event): the kill must land inside the
# instruction, and a fixed pause after the request was routed raced the worker's start on a
# loaded machine. (A file it creates would not be seen from outside bubblewrap.)
SLEEPS = "import time\ndef nap():\n    print('napping', flush=True)\n    time.sleep(60)\n"


def nap_program() -> kcoral.Program:
    program = kcoral.Program()
    module = program.upload(kind="module", source=SLEEPS)
    value = program.run(fn=program.get_function(module=module, name="nap"), args=[])
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
    # a sandboxed worker's exit code was lost with its launcher, bwrap, which the SIGTERM ended
    sandboxed = {"ended_alone": True, "launcher_returncode": -signal.SIGTERM}
    assert exit_cause(-signal.SIGKILL, **sandboxed) == SANDBOX_SIGTERM
    assert exit_cause(-signal.SIGKILL, launcher_returncode=-signal.SIGTERM) is None


BWRAP_PROBLEM = sandbox.probe()


NEEDS_BWRAP = pytest.mark.skipif(
    BWRAP_PROBLEM is not None, reason=f"bubblewrap cannot run here: {BWRAP_PROBLEM}"
)


def is_bwrap(pid: int) -> bool:
    """Whether ``pid`` is a ``bwrap`` process (outside the sandbox it makes)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "bwrap"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sandbox_name", "every_process", "causes"),
    [
        ("none", True, {OUTSIDE_SIGTERM}),
        # Every process: the worker's own SIGTERM and bwrap's death race, and either cause
        # is true (its exit report, or its exit lost with bwrap's namespace).
        pytest.param("bubblewrap", True, {OUTSIDE_SIGTERM, SANDBOX_SIGTERM}, marks=NEEDS_BWRAP),
        # The server and bwrap only: bwrap dies of it, its namespace SIGKILLs the worker.
        pytest.param("bubblewrap", False, {SANDBOX_SIGTERM}, marks=NEEDS_BWRAP),
    ],
)
def test_a_program_whose_server_is_signalled_whole_is_told_why_and_nothing_is_quarantined(
    tmp_path: Path, sandbox_name: str, every_process: bool, causes: set[str]
) -> None:
    server = start_server(tmp_path, ["--sandbox", sandbox_name])
    try:
        with kcoral.Client(server.url) as client:
            job = client.submit(nap_program())
            for event in job.events():  # the program sleeps in its worker
                if event.kind == "stdout" and "napping" in event.data["text"]:
                    break
            tree = whole_tree(server.process.pid)
            if not every_process:
                tree = [server.process.pid, *(p for p in tree if is_bwrap(p))]
            for pid in tree:  # the attack: every process at once
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            answer = job.result(timeout=60)
    finally:
        server.stop()
    assert answer.status == "FAILED" and answer.error["kind"] == "runtime", answer.error
    prefix = "worker exited while executing the instruction: "
    assert answer.error["message"] in {prefix + cause for cause in causes}, answer.error
    assert not any(e.get("event") == "devices_quarantined" for e in server.events())
