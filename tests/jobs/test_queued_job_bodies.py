"""A queued job's body counts against ``--max-inflight-request-bytes`` until its request ends
(EXTENSIONS §6), as an ``/execute`` request's does while it waits for its answer.

The 202 used to release the charge while the job, still queued, held its whole body: a
token holder could queue bodies without bound (300 jobs of 1 MiB held 600 MiB of a server
whose bound was 512 MiB, and two descriptors each).
"""

from __future__ import annotations

import os
from pathlib import Path

from job_helpers import module_program
from waiting import wait_for

import kcoral
from kcoral.errors import KCoralError

WAIT_FOR_FILE = """
import os, time
def wait(go):
    while not os.path.exists(go):
        time.sleep(0.01)
"""

BLOB_BYTES = 1 << 20
SUBMISSIONS = 20  # 20 MiB of bodies against a bound of 8 MiB


def _one_mib_job() -> kcoral.Program:
    program = kcoral.Program()
    value = program.upload(kind="bytes", value=os.urandom(BLOB_BYTES))
    program.return_(key="n", value=value)
    return program


def test_queued_jobs_hold_no_more_body_bytes_than_the_in_flight_bound(
    server_factory, tmp_path: Path
) -> None:
    # --max-request-bytes 4M: the in-flight bound is twice that, 8 MiB
    server = server_factory("--num-workers", "1", "--max-request-bytes", "4M")
    go = tmp_path / "go"
    with kcoral.Client(server.url) as client:
        blocker = client.submit(module_program(WAIT_FOR_FILE, "wait", str(go), returns=False))
        wait_for(lambda: blocker.status()["status"] == "RUNNING", "the blocker running", 60.0)
        queued, refusals = [], []
        for _ in range(SUBMISSIONS):
            try:
                queued.append(client.submit(_one_mib_job()))
            except KCoralError as exc:
                refusals.append(exc)
        assert refusals, "every job was queued: their bodies were held beyond the bound"
        assert len(queued) <= 8
        assert {(exc.status_code, exc.kind) for exc in refusals} == {(503, "busy")}
        assert "--max-inflight-request-bytes" in refusals[0].message
        go.touch()
        for job in [blocker, *queued]:
            job.wait(timeout=120)
            assert job.status()["status"] == "COMPLETED"
        # their charges were released when they ended: a full queue's worth fits again
        again = [client.submit(_one_mib_job()) for _ in range(len(queued))]
        for job in again:
            assert len(job.result(timeout=120)["n"]) == BLOB_BYTES
