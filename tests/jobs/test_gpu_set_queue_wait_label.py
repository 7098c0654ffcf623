"""A ``gpu_count`` program's wait for a seat is counted in ``kcoral_queue_wait_seconds``
under the GPU of the seat it waited for and borrowed, as EXTENSIONS §13 says ("the
assigned seat's GPU"), not under the first GPU of the set it leased afterwards: on a
2-GPU server whose GPU 0 seat was busy, the seat wait of a set request that borrowed GPU 1's
seat was counted under ``gpu="0"``."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

from holding_program import holding
from job_helpers import wait_for_file

import kcoral

TWO_FAKE_GPUS = ["--device", "fake-gpu", "--fake-gpu-count", "2", "--workers-per-gpu", "1"]


def queue_wait_counts(url: str) -> dict[str, float]:
    """``gpu`` label -> ``kcoral_queue_wait_seconds_count`` of ``GET /metrics``."""
    with urllib.request.urlopen(url + "/metrics") as answer:
        text = answer.read().decode()
    pattern = r'^kcoral_queue_wait_seconds_count\{gpu="([^"]+)"\} (\S+)$'
    return {gpu: float(value) for gpu, value in re.findall(pattern, text, re.MULTILINE)}


def test_a_set_requests_seat_wait_is_counted_under_its_seats_gpu(
    server_factory, tmp_path: Path
) -> None:
    server = server_factory(*TWO_FAKE_GPUS)
    marker, go = tmp_path / "marker", tmp_path / "go"
    with kcoral.Client(server.url) as client:
        before = queue_wait_counts(server.url)
        holder = client.submit(holding(marker, go))
        wait_for_file(marker)
        held = holder.status()["gpu_ids"][0]
        waiting = client.submit(holding(tmp_path / "set-marker", go), gpu_count=2)
        go.touch()
        assert holder.result(timeout=60)["r"] == 1
        assert waiting.result(timeout=60).gpu_ids == (0, 1)
        borrowed = waiting.status()["worker_id"]
    after = queue_wait_counts(server.url)
    other = 1 - held
    assert borrowed == f"gpu{other}/w0"  # the one seat free when it came
    grown = {gpu: count - before.get(gpu, 0) for gpu, count in after.items()}
    # one wait each: the holder's on its seat's GPU, the set request's on the other's
    assert {gpu: n for gpu, n in grown.items() if n} == {str(held): 1, str(other): 1}
