"""A GPU benchmark's warm-up stops before its program's deadline (EXTENSIONS §12.1).

A GPU call returns once its kernels are launched, before they run. The warm-up timed each
call that way, so its deadline watch saw launches of microseconds and let a large explicit
``warmup`` queue work far past the deadline: the program got the 504 and lost every
sample. Each warm-up call now waits for its work, as a measured call does. Here a stand-in
GPU's "kernels" run on a virtual clock that only a synchronize moves, and that clock is
the one the deadline watch reads, so the counts are exact."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from kcoral.bench import clocks, deadline
from kcoral.bench.clocks import CudaEventClock, warm_up
from kcoral.bench.config import BenchmarkConfig
from kcoral.bench.deadline import DeadlineWatch, set_program_deadline

KERNEL_SECONDS = 0.2  # each call's GPU work
DEADLINE_SECONDS = 2.0  # margin: 0.5 + 10 % = 0.7 s


class AsyncGpu:
    """Launches queue their work; ``synchronize`` runs it, moving the one clock."""

    def __init__(self) -> None:
        self.now = 100.0
        self.queued = 0.0

    def launch(self) -> None:
        self.queued += KERNEL_SECONDS

    def synchronize(self) -> None:
        self.now += self.queued
        self.queued = 0.0

    def time(self) -> float:
        return self.now


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[AsyncGpu]:
    gpu = AsyncGpu()
    fake_time = SimpleNamespace(monotonic=gpu.time, perf_counter=gpu.time)
    monkeypatch.setattr(deadline, "time", fake_time)
    monkeypatch.setattr(clocks, "time", fake_time)
    set_program_deadline(DEADLINE_SECONDS)
    yield gpu
    set_program_deadline(None)


def test_a_large_explicit_warm_up_on_a_gpu_stops_before_the_deadline(gpu: AsyncGpu) -> None:
    torch = SimpleNamespace(cuda=SimpleNamespace(synchronize=gpu.synchronize))
    clock = CudaEventClock(torch, flush_l2=False)
    watch = DeadlineWatch()
    made, _repeat = warm_up(clock, gpu.launch, BenchmarkConfig(warmup=1000, repeat=10), watch)
    assert watch.cut
    # 2 s less the 0.7 s margin, less one more call of 0.2 s: six calls fit
    assert made == 6
    assert gpu.queued == 0.0  # nothing of the warm-up is left running into the rounds
