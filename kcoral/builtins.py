"""Helpers for uploaded code on the server: ``benchmark``, ``compare`` and ``compile_tirx``.

SERVER.md §15 and EXTENSIONS.md §8 and §12. Uploaded Python does
``from kcoral.builtins import benchmark, compare, compile_tirx``. Importing this module loads
no GPU library: torch, CUPTI, NVML and TVM are imported inside the helpers, when called.
Failures raise ``kcoral.errors.ExecutionError`` so the instruction fails with the kind the
spec names; messages are cut to 600 characters, keeping the start and the end.

The configuration lives in ``kcoral.bench.config``, the clocks in ``kcoral.bench.clocks``;
the names uploaded code and older callers use are handed on from here.
"""

from __future__ import annotations

import importlib
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from kcoral.bench.clocks import (
    CpuClock,
    CudaEventClock,
    select_clock,
    warm_up,
    with_cuda_event_fallback,
)
from kcoral.bench.config import (
    TRUNCATION_MARK,
    BenchmarkConfig,
    calls_for_budget,
    describe,
    helper_error,
    numbered,
    parse_config,
    truncate_message,
    why_not_timeable,
)
from kcoral.protocol.errors import ExecutionError

__all__ = [
    "TRUNCATION_MARK",
    "BenchmarkConfig",
    "benchmark",
    "calls_for_budget",
    "compare",
    "compile_tirx",
    "parse_config",
    "truncate_message",
]

TIRX_CACHE_CAPACITY = 32
#: ``benchmark`` measures in this many rounds, reading the GPU's state between them.
BENCHMARK_ROUNDS = 10


# ---------------------------------------------------------------------- benchmark


def benchmark(fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
    """Time ``fn(*args)``; a trailing ``dict`` argument is the configuration (SERVER §15).

    Returns ``latency_ms_median``, ``latency_ms_mean``, ``latency_ms_min``,
    ``latency_ms_max``, ``activities_stable``, ``flush_l2``, ``warmup``, ``repeat``,
    ``clock`` (``cupti``, ``cuda_events`` or ``cpu``) and ``clock_fallback`` (why a GPU
    worker timed with CUDA events instead of CUPTI, else ``None``), and the keys of
    EXTENSIONS §12: every sample, percentiles, noise, the adaptive mode's verdict and the
    machine's state (``"kind": "kcoral.benchmark"``).
    """
    config = None
    if args and isinstance(args[-1], dict):
        config, args = args[-1], args[:-1]
    settings = parse_config(config)
    if not callable(fn):
        raise helper_error("runtime", f"benchmark: {type(fn).__name__} object is not callable")
    untimeable = why_not_timeable(fn)
    if untimeable is not None:
        raise helper_error("runtime", f"benchmark: {untimeable}")

    made = 0  # calls so far, warm-up included: which one failed tells a flaky call apart

    def call() -> None:
        nonlocal made
        made += 1
        try:
            fn(*args)
        except ExecutionError:
            raise
        except Exception as exc:
            raise helper_error("runtime", f"benchmark: {numbered(made, describe(exc))}") from exc

    try:
        clock = select_clock(settings.flush_l2)
    except ExecutionError:
        raise
    except Exception as exc:  # e.g. allocating the flush buffer failed
        raise helper_error("runtime", f"benchmark: {describe(exc)}") from exc
    clocks = [clock]
    try:
        return _run_benchmark(clocks, call, settings)
    except ExecutionError:
        raise
    except Exception as exc:  # CUDA errors surface at synchronize or event timing
        raise helper_error("runtime", f"benchmark: {describe(exc)}") from exc
    finally:
        for used in clocks:
            used.close()


def _round_plan(repeat: int, adaptive: bool) -> tuple[int, Callable[[list[int]], list[int]]]:
    """(rounds, next_round) for ``benchmark``: ``repeat`` calls in at most
    ``BENCHMARK_ROUNDS`` rounds; adaptive, rounds of that size until the rule stops."""
    rounds = min(BENCHMARK_ROUNDS, repeat)
    sizes = [repeat // rounds + (1 if i < repeat % rounds else 0) for i in range(rounds)]
    done = [0]

    def next_round(alive: list[int]) -> list[int]:
        size = sizes[done[0] % rounds] if not adaptive else max(1, repeat // rounds)
        done[0] += 1
        return [0] * size

    return rounds, next_round


def _run_benchmark(
    clocks: list[CpuClock | CudaEventClock], call: Callable[[], None], settings: BenchmarkConfig
) -> dict[str, Any]:
    from kcoral.bench.clock_floor import empty_call_ms, floor_warning
    from kcoral.bench.deadline import DeadlineWatch
    from kcoral.bench.flush_cost import flush_warning, spent_on_flushes
    from kcoral.bench.report import machine_report, state_probe
    from kcoral.bench.rounds import StopRule, measure_rounds
    from kcoral.bench.stats import median_precision, summary

    watch = DeadlineWatch()  # the warm-up and the rounds stop before the program's deadline
    capped: list[str] = []  # budgets capped or spent on flushes, said in the warnings
    warmup, repeat = warm_up(clocks[-1], call, settings, watch, capped)
    adaptive = settings.target_precision is not None
    if settings.repeat is None and not adaptive:
        estimate_ms, flush_ms = clocks[-1].estimated_ms, clocks[-1].flush_ms()
        if spent_on_flushes(repeat, estimate_ms, flush_ms):
            assert estimate_ms is not None and flush_ms is not None
            calls = "1 measured call" if repeat == 1 else f"{repeat} measured calls"
            gave = f"repeat_ms {settings.repeat_ms:g} gave {calls}"
            capped.append(flush_warning(gave, estimate_ms, flush_ms))

    def measure(clock: CpuClock | CudaEventClock) -> tuple[Any, Any]:
        rounds, next_round = _round_plan(repeat, adaptive)
        asked = None if adaptive else repeat
        rule = StopRule(rounds, settings.target_precision, settings.max_ms, asked)
        probe = state_probe(clock)
        try:
            return probe, measure_rounds(
                clock, [call], next_round, rule, probe, settings.discard_throttled, watch
            )
        finally:
            if probe is not None:
                probe.close()

    probe, outcome = with_cuda_event_fallback(clocks, measure)
    clock = clocks[-1]
    times = outcome.samples[0]
    signatures = outcome.signatures[0]
    stable = len(signatures) <= 1 or None in signatures
    result = {
        "kind": "kcoral.benchmark",
        "activities_stable": bool(stable),
        "flush_l2": settings.flush_l2,
        "warmup": warmup,
        "repeat": outcome.calls,
        "clock": clock.name,
        "clock_fallback": getattr(clock, "fallback", None),
        **summary(times, settings.max_samples),
        **machine_report(probe, outcome, settings),
    }
    result["warnings"] += capped
    precision = median_precision(times)
    result["precision"] = precision if math.isfinite(precision) else None
    too_short = floor_warning("the call", result["latency_ms_median"], empty_call_ms(clock))
    if too_short is not None:
        result["warnings"].append(too_short)
    return result


def compare(candidates: Mapping[str, Callable[..., Any]], *args: Any) -> dict[str, Any]:
    """Time several implementations of one operation against the first (EXTENSIONS §12.2):
    interleaved, shuffled rounds, a correctness check first, a bootstrap speedup interval.

    A trailing ``dict`` argument is the configuration: the keys of ``benchmark`` and
    ``reference``, ``rtol``, ``atol``, ``outputs`` and ``seed``."""
    from kcoral.bench.compare import run_comparison

    return run_comparison(candidates, args)


# ---------------------------------------------------------------------- compile_tirx

_tirx_cache: OrderedDict[Any, Any] = OrderedDict()


def _import_tvm() -> Any:
    for name in ("tvm_tirx", "tvm"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise helper_error(
        "unavailable", "compile_tirx needs TVM with TIRx (apache-tvm-tirx), which is not installed"
    )


def _function_types(tvm: Any) -> tuple[type, ...]:
    found = []
    for path in ("tirx.Function", "tir.PrimFunc", "tirx.PrimFunc"):
        owner: Any = tvm
        for part in path.split("."):
            owner = getattr(owner, part, None)
            if owner is None:
                break
        if isinstance(owner, type):
            found.append(owner)
    return tuple(found)


def _is_parse_diagnostic(exc: BaseException) -> bool:
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"DiagnosticError", "ParserError", "TIRxParseError"})


def compile_tirx(kernel: Any, bindings: Any = None) -> Any:
    """Compile a TIRx kernel for CUDA and return the executable (SERVER §15).

    ``kernel`` is a prim_func (``bindings`` must then be empty) or a ``@T.jit`` handle,
    specialized with ``bindings``, a ``dict`` of its ``T.constexpr`` values. Executables
    are cached per worker by structural hash (at most 32).
    """
    tvm = _import_tvm()
    if bindings is not None and not isinstance(bindings, dict):
        raise helper_error(
            "compile", f"compile_tirx: bindings must be a dict, not {type(bindings).__name__}"
        )
    bindings = dict(bindings or {})
    function_types = _function_types(tvm)
    try:
        if function_types and isinstance(kernel, function_types):
            if bindings:
                raise helper_error("compile", "compile_tirx: bindings were given for a prim_func")
            function = kernel
        elif callable(getattr(kernel, "specialize", None)):
            function = kernel.specialize(**bindings)
        else:
            raise helper_error(
                "compile",
                "compile_tirx expects a @T.prim_func or a @T.jit kernel, "
                f"not {type(kernel).__name__}",
            )
    except ExecutionError:
        raise
    except Exception as exc:
        kind = "parse" if _is_parse_diagnostic(exc) else "compile"
        raise helper_error(kind, f"compile_tirx: {describe(exc)}") from exc

    key = _structural_key(tvm, function)
    cached = _tirx_cache.get(key) if key is not None else None
    if cached is not None and _structurally_equal(tvm, cached[0], function):
        _tirx_cache.move_to_end(key)
        return cached[1]
    compile_function = getattr(getattr(tvm, "tirx", None), "compile", None) or getattr(
        tvm, "compile", None
    )
    if compile_function is None:
        raise helper_error("unavailable", "compile_tirx: this TVM has no compile entry point")
    try:
        executable = compile_function(function, target="cuda")
    except Exception as exc:
        kind = "parse" if _is_parse_diagnostic(exc) else "compile"
        raise helper_error(kind, f"compile_tirx: {describe(exc)}") from exc
    if key is not None:
        _tirx_cache[key] = (function, executable)
        while len(_tirx_cache) > TIRX_CACHE_CAPACITY:
            _tirx_cache.popitem(last=False)
    return executable


def _structural_key(tvm: Any, function: Any) -> Any:
    structural_hash = getattr(getattr(tvm, "ir", None), "structural_hash", None)
    if structural_hash is None:
        return None
    try:
        return (type(function).__name__, int(structural_hash(function)))
    except Exception:
        return None  # an unhashable function is compiled every time, never wrongly shared


def _structurally_equal(tvm: Any, cached: Any, function: Any) -> bool:
    """A hash hit is only a hint: equal hashes of different kernels must not share code."""
    structural_equal = getattr(getattr(tvm, "ir", None), "structural_equal", None)
    if structural_equal is None:
        return cached is function
    try:
        return bool(structural_equal(cached, function))
    except Exception:
        return False
