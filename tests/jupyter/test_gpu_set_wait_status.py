"""What a ``%%kcoral --gpus 2`` cell says while it waits for its GPUs: "waiting for 2 GPUs",
on a fake-GPU server where another program holds one of the two. Before, it said "waiting
for GPU" while the other GPU stood free, and a user wondered what it waited for."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from holding_program import holding
from IPython.utils.capture import capture_output
from kcoral_jupyter.runner import RunRecord, describe_phase
from kcoral_shell import kcoral_shell
from waiting import wait_for

import kcoral

TWO_FAKE_GPUS = ["--device", "fake-gpu", "--fake-gpu-count", "2", "--workers-per-gpu", "1"]


def test_the_status_line_says_how_many_gpus_a_run_waits_for() -> None:
    two = RunRecord(server="http://s", gpu_count=2)
    assert describe_phase({"phase": "lease_wait"}, two) == "waiting for 2 GPUs"
    assert describe_phase({"phase": "lease_held"}, two) == "running on 2 GPUs"
    assert describe_phase({"phase": "lease_wait"}, RunRecord(server="http://s")) == (
        "waiting for GPU"
    )


def test_a_gpus_2_cell_says_it_waits_for_2_gpus_while_one_of_them_is_held(
    server_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = server_factory(*TWO_FAKE_GPUS)
    marker, go = tmp_path / "marker", tmp_path / "go"
    with kcoral.Client(server.url) as client:
        holder = client.submit(holding(marker, go))
        wait_for(marker.exists, "the other program holding GPU 0", 60.0)

        def free_the_gpu_once_the_cell_waits() -> None:
            def cell_waits() -> bool:
                cells = [j for j in client.jobs() if j["job_id"] != holder.id]
                return bool(cells) and any(
                    e.data.get("phase") == "lease_wait"
                    for e in client.job(cells[0]["job_id"]).events()
                    if e.kind == "phase" and not e.finished
                )

            try:
                wait_for(cell_waits, "the cell's job waiting for its GPUs", 60.0)
            finally:
                go.touch()

        freeing = threading.Thread(target=free_the_gpu_once_the_cell_waits)
        with kcoral_shell(server.url, monkeypatch, ()) as shell:
            freeing.start()
            with capture_output() as seen:
                shell.run_cell_magic("kcoral", "--gpus 2", "x = 1\n")
            freeing.join()
        assert holder.result(timeout=60)["r"] == 1
    shown = [output.data["text/plain"] for output in seen.outputs]
    # with how long it has waited and its job: "waiting for 2 GPUs · 3 s · job 3f9c1a2b"
    assert any(line.startswith("kcoral: waiting for 2 GPUs · ") for line in shown), shown
    assert not any(line.startswith("kcoral: waiting for GPU") for line in shown), shown
