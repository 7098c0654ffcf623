"""A job that has its worker but waits for its GPUs says so (EXTENSIONS §5): its status
stays ``RUNNING``, the published state that published clients know, and ``waiting_for``
is ``"gpus"`` until it holds them, on fake GPUs in real worker processes. Its record read
``RUNNING`` alone, as if it ran, while another's program held the GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
from holding_program import holding
from job_helpers import wait_until_it_waits_for_the_gpu
from kcoral_jupyter.magics.jobs import job_row
from server_process import client_token_file
from waiting import wait_for_file

import kcoral

ALICE, BOB, CAROL = (f"{name}-fresh-worker-token-0123456789" for name in ("alice", "bob", "carol"))
ONE_FAKE_GPU = ["--device", "fake-gpu", "--fake-gpu-count", "1", "--workers-per-gpu", "3"]


def listed(client: kcoral.Client, job: kcoral.Job) -> dict:
    (record,) = [j for j in client.jobs() if j["job_id"] == job.id]
    return record


@pytest.mark.parametrize("kcoral_server", [ONE_FAKE_GPU], indirect=True)
def test_a_job_waiting_for_its_gpus_says_so_and_stays_running(
    kcoral_server, tmp_path: Path
) -> None:
    held, go = tmp_path / "held", tmp_path / "go"
    with kcoral.Client(kcoral_server.url) as client:
        holder = client.submit(holding(held, go))
        wait_for_file(held, 60.0)
        single = client.submit(holding(tmp_path / "one", go))
        wait_until_it_waits_for_the_gpu(single, "the single lease's")
        gpu_set = client.submit(holding(tmp_path / "set", go), gpu_count=1)
        wait_until_it_waits_for_the_gpu(gpu_set, "the GPU set's")

        assert holder.status()["waiting_for"] is None
        for job in (single, gpu_set):
            state = job.status()
            assert (state["status"], state["waiting_for"]) == ("RUNNING", "gpus")
            assert listed(client, job)["waiting_for"] == "gpus"
            # the status column of %kcoral jobs
            assert job_row(listed(client, job))[1] == "RUNNING (waiting for GPU)"

        go.touch()
        for job in (holder, single, gpu_set):
            assert job.result(timeout=60).results["r"] == 1
            state = job.status()
            assert (state["status"], state["waiting_for"]) == ("COMPLETED", None)
            assert job_row(state)[1] == "COMPLETED"


def test_a_job_whose_seat_changes_worker_while_another_holds_the_gpu_says_it_waits(
    server_factory, tmp_path: Path
) -> None:
    """Carol's program finds only workers that served alice: its seat's old worker is
    killed under the GPU's lease and a fresh one starts in carol's turn (SERVER §5), while
    bob holds the GPU. Those waits are her program's: her job read ``RUNNING`` alone, as if
    it ran (and a test waiting for her ``lease_wait`` timed out when a seat's worker had to
    change)."""
    tokens = client_token_file(tmp_path, f"alice {ALICE}\nbob {BOB}\ncarol {CAROL}\n")
    two_workers = ["--device", "fake-gpu", "--fake-gpu-count", "1", "--workers-per-gpu", "2"]
    server = server_factory(*two_workers, "--auth-token-file", str(tokens))
    go = tmp_path / "go"
    with (
        kcoral.Client(server.url, token=ALICE) as alice,
        kcoral.Client(server.url, token=BOB) as bob,
        kcoral.Client(server.url, token=CAROL) as carol,
    ):
        # both workers serve alice once: one holds, the other waits for the GPU
        first = alice.submit(holding(tmp_path / "a1", tmp_path / "a-go"))
        wait_for_file(tmp_path / "a1", 60.0)
        second = alice.submit(holding(tmp_path / "a2", tmp_path / "a-go"))
        wait_until_it_waits_for_the_gpu(second, "alice's second")
        (tmp_path / "a-go").touch()
        assert [job.result(timeout=60).results["r"] for job in (first, second)] == [1, 1]
        holder = bob.submit(holding(tmp_path / "bob-holds", go))
        wait_for_file(tmp_path / "bob-holds", 60.0)
        waiting = carol.submit(holding(tmp_path / "carol-holds", go))
        wait_until_it_waits_for_the_gpu(waiting, "carol's, whose seat changes worker,")
        assert waiting.status()["waiting_for"] == "gpus"
        go.touch()
        assert [job.result(timeout=60).results["r"] for job in (holder, waiting)] == [1, 1]
        assert waiting.status()["waiting_for"] is None
