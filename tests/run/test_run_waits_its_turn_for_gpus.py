"""``kcoral run --gpus 2`` whose job a worker took says once that it waits its turn for the
GPUs (EXTENSIONS §7), on a real 2-fake-GPU server where another program holds GPU 0. The
queue notices end when a worker takes the job, so it printed nothing for as long as that
program ran and looked hung."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from holding_program import holding
from notice_then_go import GIVE_UP_SECONDS, said_until_notice_then_go
from server_process import running_server

import kcoral

pytestmark = pytest.mark.timeout(180)

NOTICE = "kcoral run: waiting its turn for 2 GPUs; the tool starts when they are free"
TWO_FAKE_GPUS = ["--device", "fake-gpu", "--fake-gpu-count", "2", "--workers-per-gpu", "1"]


def test_a_gpus_2_run_waiting_for_a_held_gpu_says_so_once_and_then_runs(tmp_path: Path) -> None:
    marker, go = tmp_path / "marker", tmp_path / "go"
    with (
        running_server(tmp_path / "server", [*TWO_FAKE_GPUS, "--log-dir", ""]) as server,
        kcoral.Client(server.url) as client,
    ):
        held = client.submit(holding(marker, go))
        deadline = time.monotonic() + GIVE_UP_SECONDS  # a hang guard, not a timing check
        while not marker.exists():  # until it runs, holding its GPU
            assert time.monotonic() < deadline, "the holding program never ran"
            time.sleep(0.02)
        command = ["run", "python", "--url", server.url, "--gpus", "2", "--", "-c", "print('ran')"]
        run = subprocess.Popen(
            [sys.executable, "-m", "kcoral", *command],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        said, out = said_until_notice_then_go(run, NOTICE, go.touch)  # frees GPU 0
        assert held.result(timeout=60)["r"] == 1
    assert said.count(NOTICE) == 1, said
    assert run.returncode == 0, said
    assert out == "ran\n"
