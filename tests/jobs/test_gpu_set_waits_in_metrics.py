"""What the metrics and the log say of a ``gpu_count`` program's waits (SERVER §13,
EXTENSIONS §13), on a 2-fake-GPU server whose GPU 0 another program holds.

A wait for a set that ends without one (a cancel, a client that left) still waited for
GPUs: ``request_finished`` says how long (``lease_wait_ms``, with ``gpu_ids`` empty) and
``kcoral_lease_wait_seconds`` counts it under ``gpu="none"``. Before, the log had no wait
and the metric missed it (or counted it against the borrowed seat's GPU), so the GPU-wait
quantiles missed exactly the waits users gave up on.

The wait for a seat is counted in ``kcoral_queue_wait_seconds`` under the GPU of the seat
it waited for and borrowed ("the assigned seat's GPU"), not under the first GPU of the set
it leased afterwards, as it was."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from holding_program import holding
from job_helpers import counts_by_gpu, wait_until_it_waits_for_the_gpu
from waiting import wait_for_file

import kcoral

TWO_FAKE_GPUS = ["--device", "fake-gpu", "--fake-gpu-count", "2", "--workers-per-gpu", "1"]


@dataclass
class HeldGpu:
    """A server, a client of it, and a job that holds one GPU until ``go`` exists."""

    url: str
    events: Callable[[], list[dict]]  # the server's event log so far
    client: kcoral.Client
    holder: kcoral.Job
    go: Path
    gpu: int  # the one it holds


@pytest.fixture
def held(server_factory, tmp_path: Path) -> Iterator[HeldGpu]:
    server = server_factory(*TWO_FAKE_GPUS)
    marker, go = tmp_path / "marker", tmp_path / "go"
    with kcoral.Client(server.url) as client:
        holder = client.submit(holding(marker, go))
        wait_for_file(marker, 60.0)
        yield HeldGpu(server.url, server.events, client, holder, go, holder.status()["gpu_ids"][0])
        go.touch()


def test_a_set_wait_ended_by_a_cancel_is_logged_and_counted_as_a_wait_for_no_gpu(
    held: HeldGpu, tmp_path: Path
) -> None:
    waiting = held.client.submit(holding(tmp_path / "set", held.go), gpu_count=2)
    wait_until_it_waits_for_the_gpu(waiting, "the set")
    before = counts_by_gpu(held.url, "kcoral_lease_wait_seconds")
    assert waiting.cancel()["status"] == "CANCELLED"
    after = counts_by_gpu(held.url, "kcoral_lease_wait_seconds")
    assert after.get("none", 0) == before.get("none", 0) + 1
    # not counted against the GPU of the seat it borrowed, which it never leased
    assert {gpu: n for gpu, n in after.items() if gpu != "none"} == {
        gpu: n for gpu, n in before.items() if gpu != "none"
    }
    finished = [
        e
        for e in held.events()
        if e.get("event") == "request_finished" and e.get("request_id") == waiting.request_id
    ]
    assert finished[-1]["gpu_ids"] == [] and finished[-1]["lease_wait_ms"] > 0
    assert finished[-1]["lease_held_ms"] == 0


def test_a_set_requests_seat_wait_is_counted_under_its_seats_gpu(
    held: HeldGpu, tmp_path: Path
) -> None:
    before = counts_by_gpu(held.url, "kcoral_queue_wait_seconds")
    waiting = held.client.submit(holding(tmp_path / "set", held.go), gpu_count=2)
    held.go.touch()
    assert held.holder.result(timeout=60)["r"] == 1
    assert waiting.result(timeout=60).gpu_ids == (0, 1)
    other = 1 - held.gpu
    assert waiting.status()["worker_id"] == f"gpu{other}/w0"  # the one seat free then
    after = counts_by_gpu(held.url, "kcoral_queue_wait_seconds")
    grown = {gpu: count - before.get(gpu, 0) for gpu, count in after.items()}
    # one wait each: the holder's on its seat's GPU, the set request's on the other's
    assert {gpu: n for gpu, n in grown.items() if n} == {str(held.gpu): 1, str(other): 1}
