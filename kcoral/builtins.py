"""Helpers for uploaded code on the server: ``benchmark`` and ``compile_tirx``.

SERVER.md §15 and EXTENSIONS.md §8. Uploaded Python does
``from kcoral.builtins import benchmark, compile_tirx``. Importing this module loads no
GPU library: torch, CUPTI and TVM are imported inside the helpers, when called.
Failures raise ``kcoral.errors.ExecutionError`` so the instruction fails with the kind the
spec names; messages are cut to 600 characters, keeping the start and the end.
"""

from __future__ import annotations

import ctypes
import importlib
import math
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kcoral.errors import ExecutionError

__all__ = [
    "BenchmarkConfig",
    "benchmark",
    "compare",
    "compile_tirx",
    "parse_config",
    "truncate_message",
]

MESSAGE_LIMIT = 600
MISSING_CUPTI = "cupti-python is not installed (pip install 'kcoral[gpu]')"
TRUNCATION_MARK = "…[truncated]…"
ESTIMATE_CALLS = 5
ZERO_ESTIMATE_COUNT = 1000
TIRX_CACHE_CAPACITY = 32
#: Samples a result carries by default, and at most (about 40 bytes of JSON each, so the
#: largest is a few MB, far below the server's default --max-response-bytes of 256 MiB).
DEFAULT_MAX_SAMPLES = 1000
MAX_SAMPLES_LIMIT = 100_000
#: The adaptive mode's default measuring budget.
DEFAULT_ADAPTIVE_MAX_MS = 2000.0
#: ``benchmark`` measures in this many rounds, reading the GPU's state between them.
BENCHMARK_ROUNDS = 10
LABEL_LIMIT = 200


def truncate_message(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` if it fits in ``limit`` characters, else its start and end around a mark."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - len(TRUNCATION_MARK))
    head = (keep + 1) // 2
    tail = keep - head
    return text[:head] + TRUNCATION_MARK + (text[len(text) - tail :] if tail else "")


def _error(kind: str, message: str) -> ExecutionError:
    return ExecutionError(kind, truncate_message(message))


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# ---------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class BenchmarkConfig:
    """The trailing configuration ``dict`` of ``benchmark`` (SERVER §15 table)."""

    warmup_ms: float = 25.0
    repeat_ms: float = 100.0
    warmup: int | None = None
    repeat: int | None = None
    flush_l2: bool = True
    # EXTENSIONS §12: samples kept, the adaptive mode, throttled rounds, a history label
    max_samples: int = DEFAULT_MAX_SAMPLES
    target_precision: float | None = None
    max_ms: float = DEFAULT_ADAPTIVE_MAX_MS
    discard_throttled: bool = False
    label: str | None = None


def _budget(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _error("runtime", f"benchmark config {key!r} must be a number, not {value!r}")
    if not math.isfinite(value) or value < 0:
        raise _error("runtime", f"benchmark config {key!r} must be finite and >= 0, not {value!r}")
    return float(value)


def _count(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _error("runtime", f"benchmark config {key!r} must be an integer, not {value!r}")
    if value < 1:
        raise _error("runtime", f"benchmark config {key!r} must be at least 1, not {value!r}")
    return value


def _flag(config: Mapping[str, Any], key: str, default: bool) -> bool:
    value = config.get(key, default)
    if not isinstance(value, bool):
        raise _error("runtime", f"benchmark config {key!r} must be a boolean, not {value!r}")
    return value


def _precision(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _error(
            "runtime", f"benchmark config 'target_precision' must be a number, not {value!r}"
        )
    if not (0 < value <= 1):
        raise _error(
            "runtime",
            f"benchmark config 'target_precision' must be in (0, 1], not {value!r}",
        )
    return float(value)


def _label(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > LABEL_LIMIT:
        raise _error(
            "runtime",
            f"benchmark config 'label' must be a non-empty string of at most {LABEL_LIMIT} "
            f"characters, not {truncate_message(repr(value), 80)}",
        )
    return value


#: The keys ``benchmark`` accepts; ``compare`` accepts these and its own.
BENCHMARK_KEYS = frozenset(
    {
        "warmup_ms",
        "repeat_ms",
        "warmup",
        "repeat",
        "flush_l2",
        "max_samples",
        "target_precision",
        "max_ms",
        "discard_throttled",
        "label",
    }
)


def parse_config(
    config: Mapping[str, Any] | None, extra_keys: frozenset[str] = frozenset()
) -> BenchmarkConfig:
    """Validate a configuration mapping; unknown keys and bad values fail with ``runtime``.

    ``extra_keys`` are accepted and left to the caller (``compare``'s own keys)."""
    if config is None:
        return BenchmarkConfig()
    known = BENCHMARK_KEYS | extra_keys
    unknown = sorted(str(key) for key in config if key not in known)
    if unknown:
        raise _error(
            "runtime",
            f"unknown benchmark config key(s) {unknown}; expected some of {sorted(known)}",
        )
    max_samples = config.get("max_samples", DEFAULT_MAX_SAMPLES)
    if _count("max_samples", max_samples) > MAX_SAMPLES_LIMIT:
        raise _error(
            "runtime", f"benchmark config 'max_samples' must be at most {MAX_SAMPLES_LIMIT}"
        )
    return BenchmarkConfig(
        warmup_ms=_budget("warmup_ms", config.get("warmup_ms", 25.0)),
        repeat_ms=_budget("repeat_ms", config.get("repeat_ms", 100.0)),
        warmup=None if config.get("warmup") is None else _count("warmup", config["warmup"]),
        repeat=None if config.get("repeat") is None else _count("repeat", config["repeat"]),
        flush_l2=_flag(config, "flush_l2", True),
        max_samples=max_samples,
        target_precision=_precision(config.get("target_precision")),
        max_ms=_budget("max_ms", config.get("max_ms", DEFAULT_ADAPTIVE_MAX_MS)),
        discard_throttled=_flag(config, "discard_throttled", False),
        label=_label(config.get("label")),
    )


def calls_for_budget(budget_ms: float, estimate_ms: float) -> int:
    """max(1, ⌊budget / estimate⌋), and 1000 when the estimate is 0 (SERVER §15)."""
    if estimate_ms <= 0:
        return ZERO_ESTIMATE_COUNT
    return max(1, math.floor(budget_ms / estimate_ms))


# ---------------------------------------------------------------------- clocks


@dataclass
class Measurement:
    """One isolated call: its time and what it launched (``None`` when the clock can't tell)."""

    milliseconds: float
    activities: tuple[Any, ...] | None = None


class CpuClock:
    """``time.perf_counter_ns`` on a CPU worker; the "L2 flush" zeroes a buffer twice the
    size of the largest CPU cache, so cached data does not flatter the measurement."""

    name = "cpu"

    def __init__(self, flush_l2: bool) -> None:
        self._flush_buffer = (
            ctypes.create_string_buffer(2 * _largest_cpu_cache()) if flush_l2 else None
        )

    def flush(self) -> None:
        if self._flush_buffer is not None:
            ctypes.memset(self._flush_buffer, 0, len(self._flush_buffer))

    def estimate(self, call: Callable[[], None]) -> float:
        start = time.perf_counter_ns()
        for _ in range(ESTIMATE_CALLS):
            self.flush()
            call()
        return (time.perf_counter_ns() - start) / 1e6 / ESTIMATE_CALLS

    def measure(self, call: Callable[[], None]) -> Measurement:
        self.flush()
        start = time.perf_counter_ns()
        call()
        return Measurement((time.perf_counter_ns() - start) / 1e6)

    def finish(self, measurements: list[Measurement]) -> list[Measurement]:
        return measurements

    def close(self) -> None:
        self._flush_buffer = None


def _largest_cpu_cache() -> int:
    sizes: list[int] = []
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in os.listdir(root):
            try:
                with open(os.path.join(root, entry, "size")) as handle:
                    text = handle.read().strip().upper()
            except OSError:
                continue
            factor = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
            digits = text.rstrip("KMG")
            if digits.isdigit():
                sizes.append(int(digits) * factor)
    except OSError:
        pass
    for name in ("SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
        try:
            value = os.sysconf(name)
        except (ValueError, OSError):
            continue
        if value and value > 0:
            sizes.append(value)
    return max(sizes, default=32 * 1024**2)


class CuptiUnavailable(Exception):
    """CUPTI could not be loaded or used; the benchmark falls back to CUDA events."""


class CudaEventClock:
    """CUDA events on the current stream around each isolated call (EXTENSIONS §8).

    ``fallback`` says why CUPTI was not used (``None`` when nobody asked for it)."""

    name = "cuda_events"

    def __init__(self, torch: Any, flush_l2: bool, fallback: str | None = None) -> None:
        self.torch = torch
        self.fallback = fallback
        self._flush_buffer = None
        if flush_l2:
            device = torch.cuda.current_device()
            l2_bytes = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0))
            size = 2 * max(l2_bytes, 1024**2)
            self._flush_buffer = torch.empty(size, dtype=torch.uint8, device="cuda")

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()

    def flush(self) -> None:
        if self._flush_buffer is not None:
            self._flush_buffer.zero_()

    def _events(self) -> tuple[Any, Any]:
        event = self.torch.cuda.Event
        return event(enable_timing=True), event(enable_timing=True)

    def estimate(self, call: Callable[[], None]) -> float:
        start, end = self._events()
        self.synchronize()
        start.record()
        for _ in range(ESTIMATE_CALLS):
            self.flush()
            call()
        end.record()
        self.synchronize()
        return float(start.elapsed_time(end)) / ESTIMATE_CALLS

    def measure(self, call: Callable[[], None]) -> Measurement:
        start, end = self._events()
        self.flush()
        self.synchronize()
        start.record()
        call()
        end.record()
        self.synchronize()
        return Measurement(float(start.elapsed_time(end)))

    def finish(self, measurements: list[Measurement]) -> list[Measurement]:
        return measurements

    def close(self) -> None:
        self._flush_buffer = None


# CUPTI activity kinds that are GPU work a call launched (kernels, copies, memsets).
_CUPTI_KINDS = ("CONCURRENT_KERNEL", "MEMCPY", "MEMCPY2", "MEMSET")


class CuptiClock(CudaEventClock):
    """GPU time from CUPTI activity records: first activity start to last activity end."""

    name = "cupti"

    def __init__(self, torch: Any, cupti: Any, flush_l2: bool) -> None:
        super().__init__(torch, flush_l2)
        self.cupti = cupti
        self._records: list[tuple[int, int, tuple[Any, ...]]] = []
        self._lock = threading.Lock()
        self._windows: list[tuple[int, int]] = []
        self._enabled: list[Any] = []
        try:
            cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
            for name in _CUPTI_KINDS:
                kind = getattr(cupti.ActivityKind, name, None)
                if kind is None:
                    continue
                cupti.activity_enable(kind)
                self._enabled.append(kind)
        except Exception as exc:  # a missing or mismatched libcupti fails here too
            self.close()
            raise CuptiUnavailable(f"CUPTI activity tracing failed: {_describe(exc)}") from exc

    @staticmethod
    def _buffer_requested() -> tuple[int, int]:
        return 8 * 1024 * 1024, 0

    def _buffer_completed(self, activities: list[Any]) -> None:
        rows = []
        for activity in activities:
            start = getattr(activity, "start", None)
            end = getattr(activity, "end", None)
            if start is None or end is None:
                continue
            rows.append((int(start), int(end), _activity_signature(activity)))
        with self._lock:
            self._records.extend(rows)

    def measure(self, call: Callable[[], None]) -> Measurement:
        self.flush()
        self.synchronize()
        try:
            begin = int(self.cupti.get_timestamp())
        except Exception as exc:
            raise CuptiUnavailable(f"CUPTI timestamps failed: {_describe(exc)}") from exc
        call()
        self.synchronize()
        end = int(self.cupti.get_timestamp())
        self._windows.append((begin, end))
        return Measurement(0.0)  # filled in by finish() once the records are flushed

    def finish(self, measurements: list[Measurement]) -> list[Measurement]:
        try:
            self.cupti.activity_flush_all(1)  # 1 = CUPTI_ACTIVITY_FLAG_FLUSH_FORCED
        except Exception as exc:
            raise CuptiUnavailable(f"CUPTI flush failed: {_describe(exc)}") from exc
        with self._lock:
            records = sorted(self._records)
        windows = self._windows[-len(measurements) :] if measurements else []
        if windows and not any(begin <= r[0] <= end for begin, end in windows for r in records):
            # nothing at all: CUPTI loaded but records nothing here (some sandboxes)
            raise CuptiUnavailable("CUPTI recorded no GPU activity for any measured call")
        result = []
        for begin, end in windows:
            inside = [r for r in records if begin <= r[0] <= end]
            if not inside:
                raise _error(
                    "unavailable", "benchmark: a measured call launched no GPU activity CUPTI saw"
                )
            span = max(r[1] for r in inside) - min(r[0] for r in inside)
            if span <= 0:
                raise _error("unavailable", "benchmark: a measured call had no positive GPU span")
            result.append(Measurement(span / 1e6, tuple(sorted(r[2] for r in inside))))
        return result

    def close(self) -> None:
        for kind in self._enabled:
            try:
                self.cupti.activity_disable(kind)
            except Exception:
                pass  # tracing stays off either way once CUPTI is finalized at teardown
        self._enabled = []
        super().close()


def _activity_signature(activity: Any) -> tuple[Any, ...]:
    """What identifies an activity across calls: its kind and name or size."""
    kind = int(getattr(activity, "kind", -1))
    name = getattr(activity, "name", None)
    if isinstance(name, bytes):
        name = name.decode("utf-8", "replace")
    return (kind, str(name) if name is not None else "", int(getattr(activity, "bytes", 0) or 0))


def _select_clock(flush_l2: bool) -> CpuClock | CudaEventClock:
    torch = sys.modules.get("torch")
    on_gpu = False
    if torch is not None:
        try:
            # a GPU worker initializes CUDA at start-up; a CPU worker never does
            on_gpu = bool(torch.cuda.is_initialized())
        except Exception:
            on_gpu = False
    if not on_gpu:
        return CpuClock(flush_l2)
    try:
        cupti = importlib.import_module("cupti.cupti")
    except ImportError as exc:
        if exc.name in ("cupti", "cupti.cupti"):
            return CudaEventClock(torch, flush_l2, MISSING_CUPTI)
        return CudaEventClock(torch, flush_l2, f"CUPTI failed to load: {_describe(exc)}")
    except Exception as exc:  # installed, but its native pieces do not load
        return CudaEventClock(torch, flush_l2, f"CUPTI failed to load: {_describe(exc)}")
    try:
        return CuptiClock(torch, cupti, flush_l2)
    except CuptiUnavailable as exc:
        return CudaEventClock(torch, flush_l2, str(exc))


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
        raise _error("runtime", f"benchmark: {type(fn).__name__} object is not callable")

    def call() -> None:
        try:
            fn(*args)
        except ExecutionError:
            raise
        except Exception as exc:
            raise _error("runtime", f"benchmark: {_describe(exc)}") from exc

    try:
        clock = _select_clock(settings.flush_l2)
    except ExecutionError:
        raise
    except Exception as exc:  # e.g. allocating the flush buffer failed
        raise _error("runtime", f"benchmark: {_describe(exc)}") from exc
    clocks = [clock]
    try:
        return _run_benchmark(clocks, call, settings)
    except ExecutionError:
        raise
    except Exception as exc:  # CUDA errors surface at synchronize or event timing
        raise _error("runtime", f"benchmark: {_describe(exc)}") from exc
    finally:
        for used in clocks:
            used.close()


def with_cuda_event_fallback(
    clocks: list[CpuClock | CudaEventClock], measure: Callable[[Any], Any]
) -> Any:
    """``measure(clock)``; when CUPTI fails on the way, the measurement is redone with CUDA
    events (the new clock is appended to ``clocks``, whose last one is used)."""
    clock = clocks[-1]
    try:
        return measure(clock)
    except CuptiUnavailable as exc:
        assert isinstance(clock, CudaEventClock)
        fallback = CudaEventClock(clock.torch, clock._flush_buffer is not None, str(exc))
        clocks.append(fallback)
        return measure(fallback)


def warm_up(
    clock: CpuClock | CudaEventClock, call: Callable[[], None], settings: BenchmarkConfig
) -> tuple[int, int]:
    """The untimed first call, the estimate when a budget needs one, and the warm-up calls;
    returns the (warmup, repeat) counts."""
    warmup, repeat = settings.warmup, settings.repeat
    if warmup is None or repeat is None:
        call()  # the untimed first call pays for lazy initialization and compilation
        if isinstance(clock, CudaEventClock):
            clock.synchronize()
        estimate = clock.estimate(call)
        if warmup is None:
            warmup = calls_for_budget(settings.warmup_ms, estimate)
        if repeat is None:
            repeat = calls_for_budget(settings.repeat_ms, estimate)
    for _ in range(warmup):
        clock.flush()
        call()
    return warmup, repeat


def state_probe(clock: CpuClock | CudaEventClock) -> Any:
    """An NVML probe of the worker's own GPU on a GPU clock, else ``None``."""
    if not isinstance(clock, CudaEventClock):
        return None
    from kcoral.bench_gpu_state import NvmlProbe

    return NvmlProbe.open()


def machine_report(
    clock: CpuClock | CudaEventClock, probe: Any, outcome: Any, settings: BenchmarkConfig
) -> dict[str, Any]:
    """``gpu_state`` or ``machine``, the ``warnings`` and the adaptive mode's verdict."""
    from kcoral.bench_gpu_state import cpu_machine_state, cpu_warnings

    report: dict[str, Any] = {
        "rounds": outcome.rounds,
        "stopped_by": outcome.stopped_by,
        "target_precision": settings.target_precision,
        "max_ms": settings.max_ms if settings.target_precision is not None else None,
        "discard_throttled": settings.discard_throttled,
        "discarded_rounds": outcome.discarded_rounds,
        "label": settings.label,
    }
    if probe is None:
        machine = cpu_machine_state()
        report["machine"] = machine
        report["gpu_state"] = None
        warnings = cpu_warnings(machine)
    else:
        report["machine"] = None
        report["gpu_state"] = probe.report(outcome.throttled_rounds, outcome.discarded_rounds)
        warnings = probe.warnings(outcome.throttled_rounds, outcome.rounds)
        if outcome.throttled_rounds and settings.discard_throttled:
            if outcome.discarded_rounds:
                warnings.append(f"{outcome.discarded_rounds} throttled rounds were dropped")
            else:
                warnings.append("every round was throttled, so none was dropped")
    if outcome.stopped_by in ("max_ms", "max_calls") and settings.target_precision is not None:
        warnings.append(
            f"the median did not reach the target precision {settings.target_precision:g} "
            f"before {outcome.stopped_by} ended the measurement"
        )
    report["warnings"] = warnings
    return report


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
    from kcoral.bench_rounds import StopRule, measure_rounds
    from kcoral.bench_stats import median_precision, summary

    warmup, repeat = warm_up(clocks[-1], call, settings)
    adaptive = settings.target_precision is not None

    def measure(clock: CpuClock | CudaEventClock) -> tuple[Any, Any]:
        rounds, next_round = _round_plan(repeat, adaptive)
        rule = StopRule(rounds, settings.target_precision, settings.max_ms)
        probe = state_probe(clock)
        try:
            return probe, measure_rounds(
                clock, [call], next_round, rule, probe, settings.discard_throttled
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
        **machine_report(clock, probe, outcome, settings),
    }
    precision = median_precision(times)
    result["precision"] = precision if math.isfinite(precision) else None
    return result


def compare(candidates: Mapping[str, Callable[..., Any]], *args: Any) -> dict[str, Any]:
    """Time several implementations of one operation against the first (EXTENSIONS §12.2):
    interleaved, shuffled rounds, a correctness check first, a bootstrap speedup interval.

    A trailing ``dict`` argument is the configuration: the keys of ``benchmark`` and
    ``reference``, ``rtol``, ``atol``, ``outputs`` and ``seed``."""
    from kcoral.bench_compare import run_comparison

    return run_comparison(candidates, args)


# ---------------------------------------------------------------------- compile_tirx

_tirx_cache: OrderedDict[Any, Any] = OrderedDict()


def _import_tvm() -> Any:
    for name in ("tvm_tirx", "tvm"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise _error(
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
        raise _error(
            "compile", f"compile_tirx: bindings must be a dict, not {type(bindings).__name__}"
        )
    bindings = dict(bindings or {})
    function_types = _function_types(tvm)
    try:
        if function_types and isinstance(kernel, function_types):
            if bindings:
                raise _error("compile", "compile_tirx: bindings were given for a prim_func")
            function = kernel
        elif callable(getattr(kernel, "specialize", None)):
            function = kernel.specialize(**bindings)
        else:
            raise _error(
                "compile",
                "compile_tirx expects a @T.prim_func or a @T.jit kernel, "
                f"not {type(kernel).__name__}",
            )
    except ExecutionError:
        raise
    except Exception as exc:
        kind = "parse" if _is_parse_diagnostic(exc) else "compile"
        raise _error(kind, f"compile_tirx: {_describe(exc)}") from exc

    key = _structural_key(tvm, function)
    cached = _tirx_cache.get(key) if key is not None else None
    if cached is not None and _structurally_equal(tvm, cached[0], function):
        _tirx_cache.move_to_end(key)
        return cached[1]
    compile_function = getattr(getattr(tvm, "tirx", None), "compile", None) or getattr(
        tvm, "compile", None
    )
    if compile_function is None:
        raise _error("unavailable", "compile_tirx: this TVM has no compile entry point")
    try:
        executable = compile_function(function, target="cuda")
    except Exception as exc:
        kind = "parse" if _is_parse_diagnostic(exc) else "compile"
        raise _error(kind, f"compile_tirx: {_describe(exc)}") from exc
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
