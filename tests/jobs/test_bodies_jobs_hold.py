"""What a team member reads when another's queued jobs hold ``--max-inflight-request-bytes``
(EXTENSIONS §6, PROTOCOL §7.1).

Queued and running jobs keep their bodies charged to the bound; the 503 said only
``requests being received hold --max-inflight-request-bytes``, which was untrue once every
byte was held by jobs that had long been received (team soak: two 256 MiB jobs of alice,
each running 40 s, refused bob's 10 MiB upload with it). It now says jobs hold them too, and
how much of the bound is held.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from job_helpers import module_program, wait_for

import kcoral
from kcoral.errors import KCoralError

WAIT_FOR_FILE = """
import os, time
def wait(go):
    while not os.path.exists(go):
        time.sleep(0.01)
"""

ALICE = "token-alice-0123456789"
BOB = "token-bob-0123456789"


def _one_mib_job() -> kcoral.Program:
    program = kcoral.Program()
    value = program.upload(kind="bytes", value=os.urandom(1 << 20))
    program.return_(key="n", value=value)
    return program


def test_a_body_refused_while_another_identitys_jobs_hold_the_bound_is_told_jobs_hold_it(
    server_factory, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice {ALICE}\nbob {BOB}\n")
    tokens.chmod(0o600)
    # --max-request-bytes 4M: the in-flight bound is twice that, 8 MiB
    server = server_factory(
        "--auth-token-file", str(tokens), "--num-workers", "1", "--max-request-bytes", "4M"
    )
    go = tmp_path / "go"
    with kcoral.Client(server.url, token=ALICE) as alice:
        blocker = alice.submit(module_program(WAIT_FOR_FILE, "wait", str(go), returns=False))
        wait_for(lambda: blocker.status()["status"] == "RUNNING", "the blocker running")
        queued = []
        with pytest.raises(KCoralError):  # alice fills the bound with queued jobs
            for _ in range(12):
                queued.append(alice.submit(_one_mib_job()))
        assert queued
        with kcoral.Client(server.url, token=BOB) as bob:
            with pytest.raises(KCoralError) as refused:
                bob.submit(_one_mib_job())
        assert (refused.value.status_code, refused.value.kind) == (503, "busy")
        assert re.fullmatch(
            r"server saturated: bodies of requests being received and of queued or running "
            r"jobs hold \d+\.\d MiB of --max-inflight-request-bytes \(8\.0 MiB\)",
            refused.value.message,
        ), refused.value.message
        go.touch()
        for job in [blocker, *queued]:
            assert job.result(timeout=120).status == "COMPLETED"
