"""An interrupt of a session's program that still waits for its GPUs' lease (another
identity's program holds one of them) ends that wait at once: the program fails with a
``KeyboardInterrupt`` that says it waited, its session and state stay, and the other
program keeps its GPU (EXTENSIONS §11, Interrupts). Found in a real kernel: the grace
(5 s) counted from the interrupt, while the ``SIGINT`` waited for the lease, so the cell
hung until the other program ended and then read 'session ended: job ... did not stop
within 5 s of an interrupt and its worker was killed', its state lost though the program
never ran. Real server, fake GPUs, two identities; the holder's own wait:
``test_a_lease_wait_ended_by_an_interrupt.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
from holding_program import holding
from job_helpers import module_program, wait_until_it_waits_for_the_gpu
from server_process import client_token_file
from waiting import wait_for_file

import kcoral

pytestmark = pytest.mark.timeout(300)

REMEMBER = (
    "import kcoral.session as s\ndef remember(v):\n    before = s.namespace.get('v')\n"
    "    s.namespace['v'] = v\n    return before\n"
)
WAITED = (
    "KeyboardInterrupt: interrupted while it waited for its GPUs (another program held "
    "them); the instruction did not run"
)


def test_an_interrupt_while_the_sessions_program_waits_for_its_gpus_keeps_the_session(
    server_factory, tmp_path: Path
) -> None:
    tokens = client_token_file(tmp_path, "alice alice-token-0123456789\nbob bob-token-0123456789\n")
    server = server_factory(
        *("--device", "fake-gpu", "--fake-gpu-count", "2", "--workers-per-gpu", "1"),
        *("--max-sessions", "2", "--auth-token-file", str(tokens)),
    )
    held, go = tmp_path / "held", tmp_path / "go"
    with (
        kcoral.Client(server.url, token="alice-token-0123456789") as alice,
        kcoral.Client(server.url, token="bob-token-0123456789") as bob,
        alice.session(gpu_count=2) as session,
    ):
        session.execute(module_program(REMEMBER, "remember", 1))
        bobs = bob.submit(holding(held, go))
        wait_for_file(held, 60.0)  # bob's program holds one of the session's GPUs
        job = session.submit(module_program(REMEMBER, "remember", 2))
        wait_until_it_waits_for_the_gpu(job, "the session's")
        session.interrupt()
        # answered while bob's program still holds its GPU: the wait was cut short
        result = job.result(timeout=60)
        assert result.status == "FAILED" and result.error is not None
        assert result.error["message"] == WAITED
        assert bobs.status()["status"] == "RUNNING"
        assert session.info()["state"] == "IDLE", session.info()["end_message"]
        go.touch()
        assert bobs.result(timeout=60).status == "COMPLETED"
        # the interrupted program never ran: the state is the first program's
        assert session.execute(module_program(REMEMBER, "remember", 3)).results["r"] == 1
