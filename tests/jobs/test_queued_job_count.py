"""``--max-queued-jobs`` bounds how many jobs are queued or running at once (EXTENSIONS §5).

A job is answered 202 before it runs, and each one waiting holds its request (and, for a
body over 64 KiB, descriptors): a token holder submitting small jobs faster than they ran
could queue them without bound, until the server ran out of descriptors for everyone.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from job_helpers import module_program
from server_process import client_token_file
from waiting import wait_for

import kcoral
from kcoral.errors import KCoralError

WAIT_FOR_FILE = """
import os, time
def wait(go):
    while not os.path.exists(go):
        time.sleep(0.01)
    return 1
"""
TRIVIAL = "def one():\n    return 1\n"


def _refusal(client: kcoral.Client, program: kcoral.Program) -> KCoralError:
    with pytest.raises(KCoralError) as refused:
        client.submit(program)
    return refused.value


def test_a_job_past_the_bound_gets_503_busy_while_earlier_ones_complete(
    server_factory, tmp_path: Path
) -> None:
    tokens = client_token_file(tmp_path, "alice alice-token-0123456789\nbob bob-token-0123456789\n")
    server = server_factory(
        "--num-workers", "1", "--max-queued-jobs", "2", "--auth-token-file", str(tokens)
    )
    go = tmp_path / "go"
    with (
        kcoral.Client(server.url, token="alice-token-0123456789") as alice,
        kcoral.Client(server.url, token="bob-token-0123456789") as bob,
    ):
        running = alice.submit(module_program(WAIT_FOR_FILE, "wait", str(go)))
        wait_for(lambda: running.status()["status"] == "RUNNING", "alice's job running", 60.0)
        # Two identities: alice holds her share (half of 2), bob may still queue one.
        share = _refusal(alice, module_program(TRIVIAL, "one"))
        assert (share.status_code, share.kind) == (503, "busy")
        assert "the most one identity may (half of --max-queued-jobs 2)" in share.message
        queued = bob.submit(module_program(TRIVIAL, "one"))
        full = _refusal(bob, module_program(TRIVIAL, "one"))
        assert (full.status_code, full.kind) == (503, "busy")
        assert full.message.startswith("server saturated: 2 jobs are queued or running")
        assert "--max-queued-jobs allows (2)" in full.message
        # The refusals took nothing: the earlier jobs complete, then the slots are free.
        go.touch()
        assert running.result(timeout=120)["r"] == 1
        assert queued.result(timeout=120)["r"] == 1
        again = [
            alice.submit(module_program(TRIVIAL, "one")),
            bob.submit(module_program(TRIVIAL, "one")),
        ]
        assert [job.result(timeout=120)["r"] for job in again] == [1, 1]
        assert alice.execute(module_program(TRIVIAL, "one"))["r"] == 1
