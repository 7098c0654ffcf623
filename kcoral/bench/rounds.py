"""Measurement in rounds, shared by ``benchmark`` and ``compare`` (EXTENSIONS §12).

A round is a short list of isolated calls (for ``benchmark``: a slice of its calls; for
``compare``: one call per candidate, in a freshly shuffled order). The machine's state is
read between rounds, so a round taken while the GPU throttled can be dropped whole, and the
adaptive mode decides after each round whether the medians are known well enough.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kcoral.bench.config import MAX_CALLS, describe
from kcoral.bench.cpu_share import CpuShare
from kcoral.bench.deadline import DeadlineWatch
from kcoral.bench.stats import median_precision

#: Samples every candidate needs before the adaptive mode may stop.
ADAPTIVE_MIN_SAMPLES = 10


class CandidateFailed(Exception):
    """A candidate raised while being timed (the round knows which one it was calling) in
    its ``call``-th call, warm-up included."""

    def __init__(self, cause: BaseException, call: int = 1) -> None:
        super().__init__(describe(cause))
        self.cause = cause
        self.call = call


@dataclass(frozen=True)
class StopRule:
    """When measuring ends: after ``rounds`` rounds, or, adaptive (``target_precision`` set),
    when every candidate's median is known to that precision, or ``max_ms`` of measuring
    has passed, or ``MAX_CALLS`` calls were made; or, either way, when the program's deadline
    is near (``deadline.DeadlineWatch``). ``calls`` is what a fixed count asks for in all
    (``None`` when adaptive), which a cut result reports against what it took."""

    rounds: int
    target_precision: float | None = None
    max_ms: float | None = None
    calls: int | None = None


@dataclass
class RoundsOutcome:
    samples: list[list[float]]
    signatures: list[set[Any]]
    failures: dict[int, CandidateFailed] = field(default_factory=dict)
    rounds: int = 0
    throttled_rounds: int = 0
    discarded_rounds: int = 0
    stopped_by: str = "repeat"
    calls: int = 0
    next_precision_check: int = 1
    #: CPUs other processes kept busy on average while the rounds ran (``None``: unknown)
    others_busy_cpus: float | None = None
    #: ``"deadline"`` when the program's deadline stopped the measurement before its rule
    cut_short: str | None = None
    calls_asked: int | None = None
    #: the program's whole deadline in seconds, where the worker knew it
    deadline_seconds: float | None = None


def measure_rounds(
    clock: Any,
    calls: Sequence[Callable[[], None]],
    next_round: Callable[[list[int]], list[int]],
    rule: StopRule,
    probe: Any,
    discard_throttled: bool,
    watch: DeadlineWatch | None = None,
) -> RoundsOutcome:
    """Run rounds until ``rule`` says stop. ``next_round(alive)`` gives the candidate indexes of
    the next round (a candidate may appear several times). A candidate that raises leaves
    the measurement (its samples are dropped); the others go on.

    With a fixed number of rounds the clock finishes all measurements at once at the end
    (CUPTI flushes its records once, and judges "no activity at all" over every call);
    the adaptive mode needs each round's times, so it finishes round by round.
    ``CuptiUnavailable`` from the clock propagates: the caller redoes everything on CUDA
    events.

    A call that would end too near the program's deadline is not made (``watch``, shared
    with the warm-up), once every candidate has one: the samples taken are returned, marked
    ``cut_short``, where the deadline's 504 would have returned none of them."""
    watch = watch or DeadlineWatch()
    outcome = RoundsOutcome(
        samples=[[] for _ in calls],
        signatures=[set() for _ in calls],
        calls_asked=rule.calls,
        deadline_seconds=watch.deadline_seconds,
    )
    measured: set[int] = set()  # candidates with a call timed: only these may be cut
    deferred = rule.target_precision is None
    alive = list(range(len(calls)))
    log: list[tuple[list[tuple[int, Any]], bool]] = []
    before = probe.sample() if probe is not None else None
    share = CpuShare.start()
    started = time.perf_counter()
    while alive:
        pairs = []
        # a round never passes the cap: it is cut to the calls that remain
        planned = next_round(alive)
        indexes = planned[: MAX_CALLS - outcome.calls]
        for index in indexes:
            if index in outcome.failures:
                continue
            if watch.near() and measured.issuperset(alive):
                break
            began = time.perf_counter()
            try:
                pairs.append((index, clock.measure(calls[index])))
            except CandidateFailed as exc:
                outcome.failures[index] = exc
            else:
                measured.add(index)
            watch.timed(began)
        if not deferred:
            finished = clock.finish([m for _, m in pairs])
            pairs = [(i, m) for (i, _), m in zip(pairs, finished, strict=True)]
        alive = [i for i in alive if i not in outcome.failures]
        after = probe.sample() if probe is not None else None
        throttled = bool((before and before.throttled) or (after and after.throttled))
        before = after
        log.append((pairs, throttled))
        outcome.rounds += 1
        outcome.calls += len(pairs)
        outcome.throttled_rounds += throttled
        if not deferred and not (throttled and discard_throttled):
            for index, measurement in pairs:
                outcome.samples[index].append(measurement.milliseconds)
        stop: str | None
        if watch.cut and measured.issuperset(alive):
            stop = outcome.cut_short = "deadline"
        elif len(indexes) < len(planned):
            stop = "max_calls"
        else:
            stop = _stop_reason(outcome, alive, rule, (time.perf_counter() - started) * 1000)
        if stop is not None:
            outcome.stopped_by = stop
            break
    outcome.others_busy_cpus = share.others_busy_cpus()
    if deferred:
        flat = [m for pairs, _ in log for _, m in pairs]
        finished = iter(clock.finish(flat))
        log = [([(i, next(finished)) for i, _ in pairs], throttled) for pairs, throttled in log]
    kept = [pairs for pairs, throttled in log if not (throttled and discard_throttled)]
    if not kept:
        kept = [pairs for pairs, _ in log]  # every round throttled: keep them (a warning says so)
    outcome.discarded_rounds = len(log) - len(kept)
    outcome.samples = [[] for _ in calls]
    for pairs in kept:
        for index, measurement in pairs:
            if index not in outcome.failures:
                outcome.samples[index].append(measurement.milliseconds)
                outcome.signatures[index].add(measurement.activities)
    return outcome


def _stop_reason(
    outcome: RoundsOutcome, alive: list[int], rule: StopRule, elapsed_ms: float
) -> str | None:
    if rule.target_precision is None and outcome.rounds >= rule.rounds:
        return "repeat"
    if outcome.calls >= MAX_CALLS:
        return "max_calls"
    if rule.target_precision is None:
        return None
    if outcome.rounds >= outcome.next_precision_check:
        # the precision sorts every sample: checked after 10 % more rounds, not after each
        # one (fast kernels run tens of thousands of rounds)
        outcome.next_precision_check = max(outcome.rounds + 1, int(outcome.rounds * 1.1))
        if all(
            len(outcome.samples[i]) >= ADAPTIVE_MIN_SAMPLES
            and median_precision(outcome.samples[i]) <= rule.target_precision
            for i in alive
        ):
            return "target_precision"
    if rule.max_ms is not None and elapsed_ms >= rule.max_ms:
        return "max_ms"
    return None
