"""Identities take turns for a seat (SERVER §4): one token holder's queued burst no longer
holds another's request behind all of it. Team soak: on a shared server bob's one trivial
job waited 22.8 s behind 24 of alice's 2-second jobs."""

from __future__ import annotations

from pathlib import Path

from job_helpers import module_program
from server_process import client_token_file
from waiting import wait_for

import kcoral

WAIT_FOR_FILE = """
import os, time
def wait(go):
    while not os.path.exists(go):
        time.sleep(0.01)
    return 1
"""
ALICE, BOB = "alice-turns-token-0123456789", "bob-turns-token-0123456789"


def test_a_request_of_another_identity_is_served_before_the_rest_of_a_burst(
    server_factory, tmp_path: Path
) -> None:
    tokens = client_token_file(tmp_path, f"alice {ALICE}\nbob {BOB}\n")
    server = server_factory("--num-workers", "1", "--auth-token-file", str(tokens))
    go = tmp_path / "go"
    with (
        kcoral.Client(server.url, token=ALICE) as alice,
        kcoral.Client(server.url, token=BOB) as bob,
    ):
        running = alice.submit(module_program(WAIT_FOR_FILE, "wait", str(go)))
        wait_for(lambda: running.status()["status"] == "RUNNING", "alice's first job running", 60.0)
        burst = [alice.submit(module_program(WAIT_FOR_FILE, "wait", str(go))) for _ in range(3)]
        wait_for(lambda: burst[-1].status()["queue_position"] == 2, "alice's burst queued", 60.0)
        bobs = bob.submit(module_program(WAIT_FOR_FILE, "wait", str(go)))
        # alice's next, then bob's, then the rest of alice's: bob's turn comes second
        wait_for(lambda: bobs.status()["queue_position"] == 1, "bob's job queued", 60.0)
        assert [job.status()["queue_position"] for job in burst] == [0, 2, 3]
        go.touch()
        for job in [running, *burst, bobs]:
            assert job.result(timeout=120)["r"] == 1
        started = {job.id: job.status()["started_at"] for job in [*burst, bobs]}
        # its first `queued` phase already says where it waits (not the 3 requests waiting)
        first = next(e for e in bobs.events() if e.data.get("phase") == "queued")
        assert first.data["position"] == 1
    assert started[burst[0].id] <= started[bobs.id] <= started[burst[1].id] <= started[burst[2].id]
