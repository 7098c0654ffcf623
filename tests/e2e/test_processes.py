"""Deadlines, crashes and leftover processes (PROTOCOL §6.3, SERVER §8)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from e2e_support import finished_events, module_program
from waiting import wait_for

import kcoral

SPAWNER = (
    "import os, subprocess, time\n"
    "def spawn(record):\n"
    "    child = subprocess.Popen(['sleep', '600'])\n"
    "    shell = subprocess.Popen(['sh', '-c', 'sleep 600 & echo $!; wait'],\n"
    "                             stdout=subprocess.PIPE)\n"
    "    grandchild = int(shell.stdout.readline())\n"
    "    daemon = subprocess.Popen(['setsid', 'sh', '-c', 'sleep 600 & echo $!; wait'],\n"
    "                              stdout=subprocess.PIPE)\n"
    "    detached = int(daemon.stdout.readline())\n"
    "    pids = [child.pid, shell.pid, grandchild, daemon.pid, detached]\n"
    "    with open(record, 'w') as f:\n"
    "        f.write(os.getcwd() + '\\n' + ' '.join(map(str, pids)))\n"
    "    time.sleep(600)\n"
)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.slow
def test_a_timeout_kills_grandchildren_and_setsid_daemons_and_removes_the_workspace(
    client, e2e_server, tmp_path
):
    record = tmp_path / "record.txt"
    with pytest.raises(kcoral.KCoralError) as caught:
        client.execute(module_program(SPAWNER, "spawn", [str(record)]), timeout_seconds=3)
    assert (caught.value.status_code, caught.value.kind) == (504, "timeout")
    workspace, pids = record.read_text().split("\n")
    pids = [int(p) for p in pids.split()]
    assert os.path.basename(workspace).startswith("kcoral-program-")
    wait_for(lambda: not any(alive(p) for p in pids), "descendants killed", 30.0)
    wait_for(lambda: not os.path.exists(workspace), "workspace removed", 30.0)
    events = finished_events(e2e_server, caught.value.request_id)
    assert events[0]["finish_reason"] == "timeout" and events[0]["http_status"] == 504
    assert client.execute(module_program("def f():\n    return 3\n", "f"))["out"] == 3


def test_background_processes_left_behind_fail_a_completed_program_and_are_killed(client, tmp_path):
    source = (
        "import subprocess\n"
        "def leave():\n"
        "    p = subprocess.Popen(['setsid', 'sleep', '600'])\n"
        "    return p.pid\n"
    )
    result = client.execute(module_program(source, "leave"))
    assert result.status == "FAILED"
    assert result.error["kind"] == "runtime"
    assert result.error["message"] == (
        "program left background processes running; they were terminated"
    )
    assert result.error["traceback"] == ""
    pid = result["out"]
    wait_for(lambda: not alive(pid), "leftover killed", 30.0)


@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("os._exit(9)", ": it exited with status 9"),
        ("os.kill(os.getpid(), signal.SIGSEGV)", ": killed by SIGSEGV (a fault in native code)"),
        ("os.kill(os.getpid(), signal.SIGKILL)", ""),  # as the server's own kill: not said
    ],
    ids=["exit", "sigsegv", "sigkill"],
)
def test_a_worker_crash_during_an_instruction_keeps_earlier_returns_and_output(
    client, e2e_server, how, said
):
    source = (
        "import os, signal, sys\n"
        "def fine():\n"
        "    print('before', flush=True)\n"
        "    return 'kept'\n"
        f"def crash():\n    {how}\n"
    )
    program = kcoral.Program()
    module = program.upload(kind="module", source=source, id="m")
    fine = program.run(fn=program.get_function(module=module, name="fine"), id="fine")
    program.return_(key="fine", value=fine)
    program.run(fn=program.get_function(module=module, name="crash"), id="crash")
    result = client.execute(program)
    assert result.status == "FAILED"
    assert result.results == {"fine": "kept"}
    assert result.stdout == "before\n"
    assert result.error == {
        "kind": "runtime",
        "message": f"worker exited while executing the instruction{said}",
        "instruction_index": 5,
        "instruction_op": "run",
        "instruction_id": "crash",
        "traceback": "",
    }
    events = finished_events(e2e_server, result.request_id)
    assert events[0]["finish_reason"] == "crashed" and events[0]["level"] == "ERROR"
    # Recovery: the seat is respawned and keeps serving.
    for _ in range(3):
        assert client.execute(module_program("def f():\n    return 5\n", "f"))["out"] == 5
    wait_for(lambda: client.health()["load"]["request_capacity"] == 2, "respawn", 60.0)


def test_timing_fields_are_finite_and_ordered(client):
    started = time.monotonic()
    result = client.execute(module_program("import time\ndef f():\n    time.sleep(0.2)\n", "f"))
    wall_ms = (time.monotonic() - started) * 1000
    assert 0 <= result.queue_ms and 0 <= result.elapsed_ms <= wall_ms
    assert result.lease_wait_ms == result.lease_held_ms == 0
