"""``kcoral.builtins.compare``: several implementations of one operation, timed against the
first inside one lease (EXTENSIONS §12.2–§12.3).

Order of work: validate, clone the arguments per candidate (so one cannot feed another),
check each candidate's result against the reference (a candidate that differs is not
timed), warm every survivor up, then measure in rounds of one call per candidate in a
freshly shuffled order (seeded, the seed reported), the L2 flushed before each call, so
drift, boost clocks and heat hit every candidate alike. Speedups come from a seeded
bootstrap over the samples.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kcoral.bench.clocks import (
    CpuClock,
    CudaEventClock,
    select_clock,
    warm_up,
    with_cuda_event_fallback,
)
from kcoral.bench.config import (
    MAX_CALLS,
    BenchmarkConfig,
    calls_for_budget,
    describe,
    helper_error,
    numbered,
    parse_config,
    truncate_message,
    why_not_timeable,
)
from kcoral.bench.correctness import Check, check, clone, result_of
from kcoral.bench.deadline import DeadlineWatch
from kcoral.bench.report import machine_report, state_probe
from kcoral.bench.rounds import CandidateFailed, StopRule, measure_rounds
from kcoral.bench.stats import (
    NO_DIFFERENCE,
    median_precision,
    ratio_of_medians,
    summary,
    too_few_samples,
)
from kcoral.protocol.errors import ExecutionError

#: ``compare``'s own configuration keys, beside ``benchmark``'s.
COMPARE_KEYS = frozenset({"reference", "rtol", "atol", "outputs", "seed"})
MAX_CANDIDATES = 32
NAME_LIMIT = 200
#: Fewer rounds than this give a bootstrap interval that means little; budgets never go below.
MIN_ROUNDS = 10
DEFAULT_RTOL = 1e-5
DEFAULT_ATOL = 1e-8
_VERDICTS = {"greater": "faster", "smaller": "slower", NO_DIFFERENCE: NO_DIFFERENCE}


def _fail(message: str) -> ExecutionError:
    return helper_error("runtime", f"compare: {message}")


def _candidates(candidates: object) -> list[tuple[str, Callable[..., Any]]]:
    if not isinstance(candidates, Mapping):
        raise _fail(f"candidates must map names to callables, not {type(candidates).__name__}")
    if not 1 <= len(candidates) <= MAX_CANDIDATES:
        raise _fail(f"give from 1 to {MAX_CANDIDATES} candidates, not {len(candidates)}")
    found = []
    for name, fn in candidates.items():
        if not isinstance(name, str) or not name or len(name) > NAME_LIMIT:
            raise _fail(f"a candidate name must be a string of 1 to {NAME_LIMIT} characters")
        if not callable(fn):
            raise _fail(f"candidate {name!r}: {type(fn).__name__} object is not callable")
        untimeable = why_not_timeable(fn)
        if untimeable is not None:
            raise _fail(f"candidate {name!r}: {untimeable}")
        found.append((name, fn))
    return found


def _tolerance(options: Mapping[str, Any], key: str, default: float) -> float:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(f"config {key!r} must be a number, not {value!r}")
    if not math.isfinite(value) or value < 0:
        raise _fail(f"config {key!r} must be finite and >= 0, not {value!r}")
    return float(value)


def _outputs(options: Mapping[str, Any], arg_count: int) -> list[int] | None:
    value = options.get("outputs")
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not value:
        raise _fail("config 'outputs' must be a non-empty list of argument positions")
    positions = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item < arg_count:
            valid_positions = f"0..{arg_count - 1}" if arg_count else "no arguments were given"
            raise _fail(
                f"config 'outputs': {item!r} is not an argument position ({valid_positions})"
            )
        if item in positions:
            raise _fail(f"config 'outputs' names position {item} twice")
        positions.append(item)
    return positions


def _seed(options: Mapping[str, Any]) -> int:
    value = options.get("seed")
    if value is None:
        return int.from_bytes(os.urandom(4), "big")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise _fail(f"config 'seed' must be an integer from 0 to 2**63 - 1, not {value!r}")
    return value


def run_comparison(candidates: object, args: Sequence[Any]) -> dict[str, Any]:
    """The body of ``kcoral.builtins.compare``."""
    config = None
    if args and isinstance(args[-1], dict):
        config, args = args[-1], tuple(args[:-1])
    try:
        settings = parse_config(config, COMPARE_KEYS)
    except ExecutionError as exc:  # benchmark's keys, said as compare's own
        raise _fail(exc.message.replace("benchmark config", "config", 1)) from None
    options = config or {}
    named = _candidates(candidates)
    rtol = _tolerance(options, "rtol", DEFAULT_RTOL)
    atol = _tolerance(options, "atol", DEFAULT_ATOL)
    outputs = _outputs(options, len(args))
    seed = _seed(options)
    try:
        clock = select_clock(settings.flush_l2)
    except ExecutionError:
        raise
    except Exception as exc:
        raise _fail(describe(exc)) from exc
    clocks: list[CpuClock | CudaEventClock] = [clock]
    try:
        return _Comparison(named, args, options, settings, rtol, atol, outputs, seed).run(clocks)
    except ExecutionError:
        raise
    except Exception as exc:  # CUDA errors surface at synchronize or event timing
        raise _fail(describe(exc)) from exc
    finally:
        for used in clocks:
            used.close()


#: what a candidate (or a callable reference) may raise and be ``failed`` for: a
#: ``sys.exit()`` in one candidate is its own failure, not the whole comparison's (an
#: interrupt, ``KeyboardInterrupt``, still stops everything)
CANDIDATE_ERRORS = (Exception, SystemExit)


class _Comparison:
    def __init__(
        self,
        named: list[tuple[str, Callable[..., Any]]],
        args: Sequence[Any],
        options: Mapping[str, Any],
        settings: BenchmarkConfig,
        rtol: float,
        atol: float,
        outputs: list[int] | None,
        seed: int,
    ) -> None:
        self.names = [name for name, _ in named]
        self.functions = [fn for _, fn in named]
        self.args = tuple(args)
        self.has_reference = "reference" in options
        self.reference = options.get("reference")
        self.settings = settings
        self.rtol, self.atol, self.outputs, self.seed = rtol, atol, outputs, seed
        self.entries: list[dict[str, Any]] = [{"status": "ok"} for _ in named]
        self.warnings: list[str] = []  # results unlike the baseline's, budgets capped
        # one argument set per candidate, cloned, so no candidate reads another's writes
        self.argsets = [clone(self.args) for _ in named]

    # -------------------------------------------------------------- correctness

    def _expected(self) -> Any:
        if not callable(self.reference):
            return self.reference
        try:
            return result_of(self.reference, clone(self.args), self.outputs)
        except CANDIDATE_ERRORS as exc:
            raise _fail(f"the reference raised {describe(exc)}") from exc

    def check_all(self) -> None:
        expected = self._expected() if self.has_reference else None
        for index, fn in enumerate(self.functions):
            entry = self.entries[index]
            try:
                # a fresh clone: the check must not leave state behind in the timed arguments
                actual = result_of(fn, clone(self.args), self.outputs)
            except CANDIDATE_ERRORS as exc:
                entry.update(status="failed", error=truncate_message(describe(exc), 300))
                continue
            if not self.has_reference:
                if index == 0:
                    expected = actual
                else:
                    self._unlike_the_baseline(index, actual, expected)
                continue
            verdict: Check = check(actual, expected, self.rtol, self.atol)
            entry["max_abs_error"] = verdict.max_abs_error
            if not verdict.matches:
                entry.update(status="mismatch", error=verdict.message)
        baseline = self.entries[0]
        if baseline["status"] != "ok":
            what = "does not match the reference" if baseline["status"] == "mismatch" else "failed"
            raise _fail(
                f"the baseline {self.names[0]!r} {what} ({baseline.get('error')}), so nothing "
                "can be compared with it"
            )

    def _unlike_the_baseline(self, index: int, actual: Any, baseline: Any) -> None:
        """Without a ``reference`` nothing is checked, but a result unlike the baseline's is
        said: a candidate that computes something else read as plainly faster."""
        same_type = type(actual) is type(baseline)
        if same_type and getattr(type(actual), "__eq__", None) is object.__eq__:
            return  # equal only to itself: two calls' objects always differ, saying nothing
        try:
            verdict = check(actual, baseline, self.rtol, self.atol)
        except Exception:
            return  # results that cannot be compared are not checked, as before
        if verdict.matches or str(verdict.message).startswith("cannot compare"):
            return  # no difference shown: e.g. a dataclass of tensors, whose == raises
        what = truncate_message(
            str(verdict.message).replace("the reference", "the baseline's"), 200
        )
        self.warnings.append(
            f"{self.names[index]!r}: {what}; with no 'reference' nothing was checked, so its "
            "speedup may time different work"
        )

    # -------------------------------------------------------------- timing

    def _call(self, index: int) -> Callable[[], None]:
        fn, argset = self.functions[index], self.argsets[index]

        made = 1  # check_all called each candidate once

        def call() -> None:
            nonlocal made
            made += 1
            try:
                fn(*argset)
            except CANDIDATE_ERRORS as exc:
                raise CandidateFailed(exc, made) from exc

        return call

    def run(self, clocks: list[CpuClock | CudaEventClock]) -> dict[str, Any]:
        self.check_all()
        timed = [i for i, entry in enumerate(self.entries) if entry["status"] == "ok"]
        calls = {i: self._call(i) for i in timed}
        repeats = {}
        over_budget: list[str] = []  # candidates whose repeat_ms count was capped
        watch = DeadlineWatch()  # the warm-ups and the rounds stop before the deadline
        for index in list(timed):
            capped: list[str] = []
            try:
                warmup, repeat = warm_up(clocks[-1], calls[index], self.settings, watch, capped)
            except CandidateFailed as exc:
                self._failed(index, exc)
                timed.remove(index)
                continue
            self.entries[index]["warmup"] = warmup
            repeats[index] = repeat
            for text in capped:
                if text.startswith("repeat_ms"):
                    over_budget.append(self.names[index])
                else:
                    self.warnings.append(f"{self.names[index]!r}: {text}")
        if self.settings.repeat is not None:
            rounds = self.settings.repeat
        else:
            # the budget covers a whole round: one call of every candidate. A budget of 0
            # leaves no per-call estimate (0 / count): it asks for the fewest rounds, not
            # for calls_for_budget's 1000 of an estimate of 0
            per_round = sum(self.settings.repeat_ms / repeats[i] for i in timed)
            rounds = MIN_ROUNDS
            if per_round > 0:
                rounds = max(MIN_ROUNDS, calls_for_budget(self.settings.repeat_ms, per_round))
            if over_budget:
                # a candidate's repeat count beyond the cap is MAX_CALLS, so the rounds are
                # at most MAX_CALLS / candidates: the calls in all, not per candidate
                self.warnings.append(
                    f"repeat_ms {self.settings.repeat_ms:g} asks for over {MAX_CALLS} calls of "
                    f"{', '.join(repr(name) for name in over_budget)}; capped at {MAX_CALLS} "
                    "calls in all (max_calls)"
                )

        def measure(clock: CpuClock | CudaEventClock) -> tuple[Any, Any]:
            import numpy as np

            rng = np.random.default_rng(self.seed)  # a redo on CUDA events replays the order

            def next_round(alive: list[int]) -> list[int]:
                return [alive[i] for i in rng.permutation(len(alive))]

            adaptive = self.settings.target_precision is not None
            asked = None if adaptive else rounds * len(timed)
            rule = StopRule(rounds, self.settings.target_precision, self.settings.max_ms, asked)
            probe = state_probe(clock)
            try:
                order = [calls[i] for i in timed]
                outcome = measure_rounds(
                    clock, order, next_round, rule, probe, self.settings.discard_throttled, watch
                )
            finally:
                if probe is not None:
                    probe.close()
            return probe, outcome

        probe, outcome = with_cuda_event_fallback(clocks, measure)
        for position, failed in outcome.failures.items():
            self._failed(timed[position], failed)
        return self._result(clocks[-1], probe, outcome, timed)

    def _failed(self, index: int, failed: CandidateFailed) -> None:
        cause = failed.cause
        failure = numbered(failed.call, describe(cause), "the correctness check and warm-up")
        error = truncate_message(failure, 300)
        self.entries[index].update(status="failed", error=error)

    def _result(self, clock: Any, probe: Any, outcome: Any, timed: list[int]) -> dict[str, Any]:
        samples = {index: outcome.samples[position] for position, index in enumerate(timed)}
        baseline = samples.get(0) if self.entries[0]["status"] == "ok" else None
        candidates: dict[str, Any] = {}
        few: list[str] = []
        if not baseline:
            # a baseline that failed in its warm-up or a round leaves the others' statistics
            # standing: raising here threw away every candidate's measurement
            self.warnings.insert(
                0,
                f"no speedups: the baseline {self.names[0]!r} failed while timed; the other "
                "candidates' statistics stand",
            )
        for index, name in enumerate(self.names):
            entry = self.entries[index]
            if entry["status"] == "ok" and samples.get(index):
                times = samples[index]
                signatures = outcome.signatures[timed.index(index)]
                entry["activities_stable"] = len(signatures) <= 1 or None in signatures
                entry.update(summary(times, self.settings.max_samples))
                precision = median_precision(times)
                entry["precision"] = precision if math.isfinite(precision) else None
                if index > 0:
                    entry["speedup"] = None  # stays so when the baseline failed
                if index > 0 and baseline:
                    speedup = ratio_of_medians(baseline, times, self.seed + index)
                    speedup["verdict"] = _VERDICTS[speedup["verdict"]]
                    entry["speedup"] = speedup
                    why = too_few_samples(baseline, times)
                    if why is not None:
                        few.append(f"{name!r} against the baseline: {why}")
            candidates[name] = entry
        report = machine_report(probe, outcome, self.settings)
        report["warnings"] += [f"speedup of {line}" for line in few] + self.warnings
        return {
            "kind": "kcoral.comparison",
            "baseline": self.names[0],
            "order": list(self.names),
            "candidates": candidates,
            "seed": self.seed,
            "clock": clock.name,
            "clock_fallback": getattr(clock, "fallback", None),
            "flush_l2": self.settings.flush_l2,
            "reference_checked": self.has_reference,
            "rtol": self.rtol,
            "atol": self.atol,
            "outputs": self.outputs,
            **report,
        }
