"""A ``gpu_count`` program whose wait for its GPU set ends without one (a cancel, a client
that left) still waited for GPUs (SERVER §11, §13): its ``request_finished`` says how long
(``lease_wait_ms``, with ``gpu_ids`` empty) and ``kcoral_lease_wait_seconds`` counts it
under ``gpu="none"``. Before, the log had no wait at all and the metric missed it, so the
GPU-wait quantiles missed exactly the waits users gave up on."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

from holding_program import holding
from job_helpers import wait_for_file, wait_until_it_waits_for_the_gpu

import kcoral

TWO_FAKE_GPUS = ["--device", "fake-gpu", "--fake-gpu-count", "2", "--workers-per-gpu", "1"]


def lease_wait_counts(url: str) -> dict[str, float]:
    """``gpu`` label -> ``kcoral_lease_wait_seconds_count`` of ``GET /metrics``."""
    with urllib.request.urlopen(url + "/metrics") as answer:
        text = answer.read().decode()
    pattern = r'^kcoral_lease_wait_seconds_count\{gpu="([^"]+)"\} (\S+)$'
    return {gpu: float(value) for gpu, value in re.findall(pattern, text, re.MULTILINE)}


def test_a_set_wait_ended_by_a_cancel_is_logged_and_counted_as_a_wait_for_no_gpu(
    server_factory, tmp_path: Path
) -> None:
    server = server_factory(*TWO_FAKE_GPUS)
    marker, go = tmp_path / "marker", tmp_path / "go"
    with kcoral.Client(server.url) as client:
        holder = client.submit(holding(marker, go))
        wait_for_file(marker)
        waiting = client.submit(holding(marker, go), gpu_count=2)
        wait_until_it_waits_for_the_gpu(waiting, "the set")
        before = lease_wait_counts(server.url)
        assert waiting.cancel()["status"] == "CANCELLED"
        after = lease_wait_counts(server.url)
        go.touch()
        assert holder.result(timeout=60)["r"] == 1
    assert after.get("none", 0) == before.get("none", 0) + 1
    # not counted against the GPU of the seat it borrowed, which it never leased
    assert {gpu: n for gpu, n in after.items() if gpu != "none"} == {
        gpu: n for gpu, n in before.items() if gpu != "none"
    }
    finished = [
        e
        for e in server.events()
        if e.get("event") == "request_finished" and e.get("request_id") == waiting.request_id
    ]
    assert finished[-1]["gpu_ids"] == [] and finished[-1]["lease_wait_ms"] > 0
    assert finished[-1]["lease_held_ms"] == 0
