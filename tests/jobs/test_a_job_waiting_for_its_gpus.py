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
from waiting import wait_for_file

import kcoral

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
