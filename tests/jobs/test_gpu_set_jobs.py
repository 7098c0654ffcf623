"""Jobs of ``gpu_count`` programs (EXTENSIONS §5, PROTOCOL §6.5) on fake GPUs in real
worker processes: what a job's record says about the GPUs it ran on."""

from __future__ import annotations

from pathlib import Path

import pytest
from job_helpers import module_program
from waiting import wait_for_file

import kcoral

TWO_FAKE_GPUS = ["--device", "fake-gpu", "--fake-gpu-count", "2", "--workers-per-gpu", "1"]

HOLD = """
import os, time
def f(marker, go):
    # whole or absent: the test reads it as soon as it exists (it read '' once in CI)
    with open(marker + ".part", "w") as out:
        out.write(os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    os.replace(marker + ".part", marker)
    while not os.path.exists(go):
        time.sleep(0.01)
    return os.environ.get("CUDA_VISIBLE_DEVICES")
"""


@pytest.mark.parametrize("kcoral_server", [TWO_FAKE_GPUS], indirect=True)
def test_a_gpu_set_jobs_record_names_the_set_it_leased_not_its_borrowed_seats_gpu(
    kcoral_server, tmp_path: Path
) -> None:
    marker, go = tmp_path / "marker", tmp_path / "go"
    with kcoral.Client(kcoral_server.url) as client:
        job = client.submit(module_program(HOLD, "f", str(marker), str(go)), gpu_count=2)
        assert wait_for_file(marker, 60.0) == "0,1"
        # while it runs, on its set
        assert job.status()["gpu_ids"] == [0, 1]
        go.touch()
        result = job.result(timeout=60)
        assert result.gpu_ids == (0, 1) and result.results["r"] == "0,1"
        assert job.status()["gpu_ids"] == [0, 1]
        assert [j["gpu_ids"] for j in client.jobs() if j["job_id"] == job.id] == [[0, 1]]
        # the assigned phase came before the set was leased: it names no GPU
        phases = [e.data for e in job.events() if e.kind == "phase"]
        assert [p["gpu_ids"] for p in phases if p["phase"] == "assigned"] == [[]]


@pytest.mark.parametrize("kcoral_server", [TWO_FAKE_GPUS], indirect=True)
def test_a_cancelled_gpu_set_jobs_record_names_the_set_it_held(
    kcoral_server, tmp_path: Path
) -> None:
    marker, go = tmp_path / "marker", tmp_path / "never"
    with kcoral.Client(kcoral_server.url) as client:
        job = client.submit(module_program(HOLD, "f", str(marker), str(go)), gpu_count=2)
        wait_for_file(marker, 60.0)
        state = job.cancel()
        assert state["status"] == "CANCELLED" and state["gpu_ids"] == [0, 1]
