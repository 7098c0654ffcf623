"""Why a worker died, in the answer (issue 28 point 7; SERVER §8).

A worker killed at a limit used to answer only ``worker exited while executing the
instruction`` (the limit was in the server's log, which the program's author cannot read);
a program past its deadline only ``execution timed out``. Real servers provoke each with a
small limit and read the client's answer: it names the limit, its size and the flag.
"""

from __future__ import annotations

import pytest
from http_helpers import execute, module_program
from kcoral_server.execution.exit_cause import deadline_message, size_text
from kcoral_server.processes import cgroups
from kcoral_server.processes.limits import WorkerLimits

MEMORY_LIMIT = 256 * 1024 * 1024
PROCESS_LIMIT = 32

SOURCE = """
import os, time

def allocate():
    chunks = []
    while True:
        chunks.append(bytearray(16 << 20))

def fill_pids_then_abort():
    # as a native library does when it cannot start its threads: it aborts the process
    while True:
        try:
            if os.fork() == 0:
                time.sleep(600)
                os._exit(0)
        except OSError:
            os.abort()

def sleep(seconds):
    time.sleep(seconds)
    return "woke"
"""


def _enforced(wanted: WorkerLimits, field: str) -> str | None:
    cgroup = cgroups.create_cgroup(wanted)
    try:
        return None if getattr(cgroup, field) else f"no writable cgroup enforces {field} here"
    finally:
        cgroup.remove()


MEMORY_CGROUP = _enforced(WorkerLimits(memory_bytes=MEMORY_LIMIT), "memory_bytes")
PIDS_CGROUP = _enforced(WorkerLimits(processes=PROCESS_LIMIT), "processes")


def test_sizes_read_as_people_write_them() -> None:
    assert size_text(4 << 30) == "4.0 GiB"
    assert size_text(MEMORY_LIMIT) == "256.0 MiB"
    assert size_text(1536) == "1.5 KiB"
    assert size_text(100) == "100 bytes"


@pytest.mark.skipif(MEMORY_CGROUP is not None, reason=str(MEMORY_CGROUP))
@pytest.mark.parametrize(
    "kcoral_server", [["--worker-memory-limit-bytes", str(MEMORY_LIMIT)]], indirect=True
)
def test_a_worker_killed_at_its_memory_limit_says_so_in_the_answer(kcoral_server) -> None:
    answer = execute(kcoral_server.url, module_program(SOURCE, [("allocate", [])]))
    assert answer.status == 200, answer.body
    error = answer.body["error"]
    assert answer.body["status"] == "FAILED" and error["kind"] == "runtime", answer.body
    assert error["message"] == (
        "worker exited while executing the instruction: killed at its memory limit "
        "(256.0 MiB, --worker-memory-limit-bytes)"
    )
    assert error["instruction_op"] == "run"
    again = execute(kcoral_server.url, module_program(SOURCE, [("sleep", [0])]))
    assert again.body["status"] == "COMPLETED", again.body  # the server keeps serving


@pytest.mark.skipif(PIDS_CGROUP is not None, reason=str(PIDS_CGROUP))
@pytest.mark.parametrize(
    "kcoral_server", [["--worker-process-limit", str(PROCESS_LIMIT)]], indirect=True
)
def test_a_worker_that_died_at_its_process_limit_says_so_in_the_answer(kcoral_server) -> None:
    answer = execute(kcoral_server.url, module_program(SOURCE, [("fill_pids_then_abort", [])]))
    assert answer.status == 200, answer.body
    error = answer.body["error"]
    assert answer.body["status"] == "FAILED" and error["kind"] == "runtime", answer.body
    assert error["message"] == (
        "worker exited while executing the instruction: it reached its process limit "
        f"({PROCESS_LIMIT} processes and threads, --worker-process-limit)"
    )
    again = execute(kcoral_server.url, module_program(SOURCE, [("sleep", [0])]))
    assert again.body["status"] == "COMPLETED", again.body


@pytest.mark.parametrize(
    "kcoral_server",
    [["--worker-termination-grace-seconds", "1", "--max-timeout-seconds", "2"]],
    indirect=True,
)
def test_a_program_past_its_deadline_is_told_the_deadline_and_the_setting_that_set_it(
    kcoral_server,
) -> None:
    asked = execute(kcoral_server.url, module_program(SOURCE, [("sleep", [60])], timeout_seconds=1))
    assert asked.status == 504 and asked.body["error"]["kind"] == "timeout", asked.body
    assert asked.body["error"]["message"] == (
        "execution timed out after its deadline of 1 s "
        "(the program's timeout_seconds; --max-timeout-seconds allows 2 s)"
    )
    capped = execute(
        kcoral_server.url, module_program(SOURCE, [("sleep", [60])], timeout_seconds=30)
    )
    assert capped.status == 504, capped.body
    assert capped.body["error"]["message"] == (
        "execution timed out after its deadline of 2 s "
        "(--max-timeout-seconds; the program asked for 30 s)"
    )


def test_a_program_without_its_own_deadline_is_pointed_at_the_default() -> None:
    class Config:
        max_timeout_seconds = 3600

    assert deadline_message(300, None, Config()) == (
        "execution timed out after its deadline of 300 s (--default-timeout-seconds; a "
        "program sets its own with timeout_seconds, up to --max-timeout-seconds (3600 s))"
    )
