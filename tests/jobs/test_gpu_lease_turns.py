"""Identities take turns for GPU leases too (SERVER §5), on a fake-GPU server in real worker
processes: alice's jobs seated on a GPU's other workers and waiting for its lease no longer
hold bob's job behind all of them (team soak on 4 fake GPUs: bob's 0.1 s job waited 13.5 s
behind nine of alice's ``--gpus 4`` jobs while its queue position said 1), and turns go by
the time each held the GPU, so alice's long hold lets bob's short jobs go before her next."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

from holding_program import call, holding
from job_helpers import wait_until_it_waits_for_the_gpu
from server_process import client_token_file
from waiting import wait_for, wait_for_file

import kcoral

ALICE, BOB = "alice-lease-turns-token-0123456789", "bob-lease-turns-token-0123456789"
#: five workers share the one GPU: alice's four jobs and bob's are all seated at once
ONE_SHARED_GPU = ["--device", "fake-gpu", "--fake-gpu-count", "1", "--workers-per-gpu", "5"]


def seats_ready(url: str) -> int:
    with urllib.request.urlopen(url + "/health") as answer:
        return json.load(answer)["load"]["request_capacity"]


def order_served_after_alices_hold(
    server_factory, tmp_path: Path, queued: list[str], *, held_on: float = 0.0
) -> list[str]:
    """On a server whose one GPU five workers share, alice's first job holds the GPU while a
    job of each of ``queued`` ("alice" or "bob") is seated, in that order, and waits for it;
    then, ``held_on`` seconds later, lets it go. The order their runs had the GPU in."""
    tokens = client_token_file(tmp_path, f"alice {ALICE}\nbob {BOB}\n")
    server = server_factory(*ONE_SHARED_GPU, "--auth-token-file", str(tokens))
    marker, go, order = tmp_path / "marker", tmp_path / "go", tmp_path / "order"
    # a worker that starts takes the GPU's lease for its start-up, which alice's first job
    # holds until the end: every seat must have its worker first
    wait_for(lambda: seats_ready(server.url) == 5, "all five workers ready", 60.0)
    with (
        kcoral.Client(server.url, token=ALICE) as alice,
        kcoral.Client(server.url, token=BOB) as bob,
    ):
        clients = {"alice": alice, "bob": bob}
        running = alice.submit(holding(marker, go))
        wait_for_file(marker, 60.0)
        jobs = [running]
        for number, who in enumerate(queued):  # each on a worker of its own
            job = clients[who].submit(call("log", str(order), who))
            wait_until_it_waits_for_the_gpu(job, f"{who}'s job {number}")
            jobs.append(job)
        time.sleep(held_on)
        go.touch()
        for job in jobs:
            assert job.result(timeout=120)["r"] == 1
    return order.read_text().split()


def test_another_identitys_job_takes_the_gpu_after_one_of_a_burst_queued_before_it(
    server_factory, tmp_path: Path
) -> None:
    served = order_served_after_alices_hold(
        server_factory, tmp_path, ["alice", "alice", "alice", "bob"]
    )
    assert sorted(served) == ["alice", "alice", "alice", "bob"]
    # before: ["alice", "alice", "alice", "bob"], bob's one job after alice's whole burst
    assert served.index("bob") < 2


def test_after_one_identitys_long_hold_anothers_short_jobs_all_go_before_its_next(
    server_factory, tmp_path: Path
) -> None:
    # alice's hold lasts from her first job's run until all four are seated; a second more
    # makes it hundreds of times as long as a grant of bob's (writing one line)
    served = order_served_after_alices_hold(
        server_factory, tmp_path, ["alice", "bob", "bob", "bob"], held_on=1.0
    )
    # before (turns by grants): ["alice", "bob", "bob", "bob"], alice's turn first
    assert served == ["bob", "bob", "bob", "alice"]
