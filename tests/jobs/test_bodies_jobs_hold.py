"""What a team member reads when another's queued jobs hold ``--max-inflight-request-bytes``
(EXTENSIONS §6, PROTOCOL §7.1).

Queued and running jobs keep their bodies charged to the bound; the 503 said only
``requests being received hold --max-inflight-request-bytes``, which was untrue once every
byte was held by jobs that had long been received (team soak: two 256 MiB jobs of alice,
each running 40 s, refused bob's 10 MiB upload with it). It now says jobs hold them too, and
how much of the bound is held. And with two or more identities one holds at most half of the
bound: alice's running jobs no longer refuse bob's upload, and her own next one is told her
share is full.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
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
"""

ALICE = "token-alice-0123456789"
BOB = "token-bob-0123456789"
CAROL = "token-carol-0123456789"
MIB = 1 << 20


def _one_mib_job() -> kcoral.Program:
    program = kcoral.Program()
    value = program.upload(kind="bytes", value=os.urandom(MIB))
    program.return_(key="n", value=value)
    return program


def _waiting_job(go: Path, size: int) -> kcoral.Program:
    """A job that holds a body of about ``size`` bytes until ``go`` exists."""
    program = module_program(WAIT_FOR_FILE, "wait", str(go), returns=False)
    program.upload(kind="bytes", value=os.urandom(size))
    return program


def _fill(client: kcoral.Client, make: Callable[[], kcoral.Program]) -> tuple[list, KCoralError]:
    """Submit jobs until one is refused: those queued, and the refusal."""
    queued = []
    for _ in range(12):
        try:
            queued.append(client.submit(make()))
        except KCoralError as exc:
            return queued, exc
    raise AssertionError("no submission was refused")


def _bounded_server(server_factory, tmp_path: Path, tokens: str):
    """A one-worker server for the identities of ``tokens`` whose in-flight bound is
    8 MiB (--max-request-bytes 4M: the bound is twice that)."""
    tokens_file = client_token_file(tmp_path, tokens)
    return server_factory(
        "--auth-token-file", str(tokens_file), "--num-workers", "1", "--max-request-bytes", "4M"
    )


def test_a_body_refused_while_other_identities_jobs_hold_the_bound_is_told_jobs_hold_it(
    server_factory, tmp_path: Path
) -> None:
    # the in-flight bound is 8 MiB; 4 MiB an identity
    server = _bounded_server(server_factory, tmp_path, f"alice {ALICE}\nbob {BOB}\ncarol {CAROL}\n")
    go = tmp_path / "go"
    with (
        kcoral.Client(server.url, token=ALICE) as alice,
        kcoral.Client(server.url, token=BOB) as bob,
        kcoral.Client(server.url, token=CAROL) as carol,
    ):
        blocker = alice.submit(module_program(WAIT_FOR_FILE, "wait", str(go), returns=False))
        wait_for(lambda: blocker.status()["status"] == "RUNNING", "the blocker running", 60.0)
        # alice and bob fill their shares with queued jobs, carol the rest of the bound
        queued, _ = _fill(alice, _one_mib_job)
        more, _ = _fill(bob, _one_mib_job)
        queued += more
        more, refused = _fill(carol, _one_mib_job)
        queued += more
        assert (refused.status_code, refused.kind) == (503, "busy")
        assert re.fullmatch(
            r"server saturated: bodies of requests being received and of queued or running "
            r"jobs hold \d+\.\d MiB of --max-inflight-request-bytes \(8\.0 MiB\)",
            refused.message,
        ), refused.message
        go.touch()
        for job in [blocker, *queued]:
            assert job.result(timeout=120).status == "COMPLETED"


def test_one_identitys_running_jobs_hold_at_most_half_the_bound_and_others_still_upload(
    server_factory, tmp_path: Path
) -> None:
    # the bound is 8 MiB; with two identities one holds at most 4 MiB of it
    server = _bounded_server(server_factory, tmp_path, f"alice {ALICE}\nbob {BOB}\n")
    go = tmp_path / "go"
    with (
        kcoral.Client(server.url, token=ALICE) as alice,
        kcoral.Client(server.url, token=BOB) as bob,
    ):
        running = alice.submit(_waiting_job(go, 3 * MIB))
        wait_for(lambda: running.status()["status"] == "RUNNING", "alice's job running", 60.0)
        # alice's second 3 MiB job would pass her share: refused, saying so
        with pytest.raises(KCoralError) as refused:
            alice.submit(_waiting_job(go, 3 * MIB))
        assert (refused.value.status_code, refused.value.kind) == (503, "busy")
        assert re.fullmatch(
            r"server saturated: bodies of your requests being received and of your queued or "
            r"running jobs hold 3\.\d MiB of your share of --max-inflight-request-bytes "
            r"\(4\.0 MiB, half of 8\.0 MiB while several identities share this server\); "
            r"send again once one of yours has ended",
            refused.value.message,
        ), refused.value.message
        # bob's as large upload still fits in the half alice cannot take (old code: 503)
        bobs = bob.submit(_waiting_job(go, 3 * MIB))
        go.touch()
        for job in [running, bobs]:
            assert job.result(timeout=120).status == "COMPLETED"
