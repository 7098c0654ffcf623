"""``perf_kcoral.back_to_back_beside_reused``: back to back runs in blocks that alternate
with trivial round trips on the reused-worker server, so the ratio's two p50s come from the
same phases of the machine (unit test with stand-in clients: no timing is asserted)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import perf_kcoral as kc  # noqa: E402


@dataclass
class _Answer:
    queue_ms: float
    completed: bool = True
    status: str = "COMPLETED"
    error: None = None

    def __getitem__(self, key: str) -> int:
        assert key == "answer"
        return 42


class _StandInClient:
    """Answers every trivial program at once and writes its name into a shared log."""

    def __init__(self, name: str, log: list[str], queue_ms: float = 0.0) -> None:
        self.name, self.log, self.queue_ms = name, log, queue_ms

    def execute(self, _program: object) -> _Answer:
        self.log.append(self.name)
        return _Answer(queue_ms=self.queue_ms)


def _runs(log: list[str]) -> list[tuple[str, int]]:
    """The log as (client, how many programs in a row)."""
    runs: list[tuple[str, int]] = []
    for name in log:
        if runs and runs[-1][0] == name:
            runs[-1] = (name, runs[-1][1] + 1)
        else:
            runs.append((name, 1))
    return runs


def test_back_to_back_alternates_blocks_with_the_reused_server_each_settled_first():
    log: list[str] = []
    fresh, reused = _StandInClient("fresh", log, 0.5), _StandInClient("reused", log)
    result = kc.back_to_back_beside_reused(fresh, reused, 10, blocks=3, settle=2, quiet=0, warm=0)  # type: ignore[arg-type]
    # 10 timed programs per server in blocks of 4, 3, 3, each after 2 untimed ones
    assert _runs(log) == [("reused", 6), ("fresh", 6), ("reused", 5), ("fresh", 5),
                          ("reused", 5), ("fresh", 5)]  # fmt: skip
    assert result["queue_ms_median"] == 0.5
    assert result["p50_seconds"] >= 0 and result["reused_p50_seconds"] >= 0
    assert result["per_second"] > 0


def test_fewer_programs_than_blocks_still_time_every_program_once():
    log: list[str] = []
    fresh, reused = _StandInClient("fresh", log), _StandInClient("reused", log)
    kc.back_to_back_beside_reused(fresh, reused, 2, blocks=3, settle=0, quiet=0, warm=0)  # type: ignore[arg-type]
    assert _runs(log) == [("reused", 1), ("fresh", 1), ("reused", 1), ("fresh", 1)]


class _Clock:
    """A clock that moves ``step`` seconds each time it is read: no real time is measured."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_each_block_is_warmed_for_its_seconds_before_anything_is_timed():
    log: list[str] = []
    fresh, reused = _StandInClient("fresh", log), _StandInClient("reused", log)
    # each untimed program moves the clock 0.1 s (it is read once after each): 0.35 s takes 4
    kc.back_to_back_beside_reused(  # type: ignore[arg-type]
        fresh, reused, 2, blocks=1, settle=1, quiet=0, warm=0.35, clock=_Clock(0.1)
    )
    assert _runs(log) == [("reused", 4 + 2), ("fresh", 4 + 2)]


def test_the_warm_up_runs_at_least_its_programs_however_short_its_seconds():
    calls: list[int] = []
    ran = kc.untimed_until_warm(lambda: calls.append(1), 3, 0.0, _Clock(1.0))
    assert ran == 3 and len(calls) == 3


def test_the_warm_up_runs_on_until_its_seconds_have_passed():
    calls: list[int] = []
    ran = kc.untimed_until_warm(lambda: calls.append(1), 1, 0.55, _Clock(0.1))
    # the clock starts at 0.1 and reads 0.2, 0.3, ... after each call: 0.6 s after the sixth
    assert ran == len(calls) == 6
