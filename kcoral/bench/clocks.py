"""The clocks of the benchmark helpers (SERVER §15, EXTENSIONS §8): CUPTI activity spans,
CUDA events, or ``perf_counter_ns`` on a CPU worker; each flushes the L2 (or the CPU cache)
before a call, outside the measured span. Also the warm-up that turns budgets into counts.

No GPU library is imported here: torch is taken from ``sys.modules`` (a GPU worker imported
it at start-up) and CUPTI is imported when a GPU clock is chosen.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kcoral.bench.config import (
    BenchmarkConfig,
    budget_cap_warning,
    calls_for_budget,
    describe,
    helper_error,
)
from kcoral.bench.deadline import DeadlineWatch

MISSING_CUPTI = "cupti-python is not installed (pip install 'kcoral[gpu]')"
ESTIMATE_CALLS = 5


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
        self.estimated_ms: float | None = None  # the last estimate's per-call time
        self._flush_ms: float | None = None

    def flush(self) -> None:
        if self._flush_buffer is not None:
            ctypes.memset(self._flush_buffer, 0, len(self._flush_buffer))

    def estimate(self, call: Callable[[], None]) -> float:
        flushing = 0
        start = time.perf_counter_ns()
        for _ in range(ESTIMATE_CALLS):
            if self._flush_buffer is not None:
                # the flushes' share of the same span: a neighbour's preemption lands in
                # the flush and the estimate alike, where a flush timed apart could miss it
                # (without flushes no clock read is added to a tiny call's estimate)
                began = time.perf_counter_ns()
                self.flush()
                flushing += time.perf_counter_ns() - began
            call()
        self.estimated_ms = (time.perf_counter_ns() - start) / 1e6 / ESTIMATE_CALLS
        if self._flush_buffer is not None:
            self._flush_ms = flushing / 1e6 / ESTIMATE_CALLS
        return self.estimated_ms

    def flush_ms(self) -> float | None:
        """A flush's time within the last estimate, or ``None`` without flushes or estimate."""
        return self._flush_ms

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
        self.estimated_ms: float | None = None  # the last estimate's per-call time
        self._flush_ms: float | None = None
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
        self.estimated_ms = float(start.elapsed_time(end)) / ESTIMATE_CALLS
        return self.estimated_ms

    def flush_ms(self) -> float | None:
        """One flush timed alone, once (each is the same size), or ``None`` without flushes."""
        if self._flush_buffer is not None and self._flush_ms is None:
            start, end = self._events()
            self.synchronize()
            start.record()
            self.flush()
            end.record()
            self.synchronize()
            self._flush_ms = float(start.elapsed_time(end))
        return self._flush_ms

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
            raise CuptiUnavailable(f"CUPTI activity tracing failed: {describe(exc)}") from exc

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
            raise CuptiUnavailable(f"CUPTI timestamps failed: {describe(exc)}") from exc
        call()
        self.synchronize()
        end = int(self.cupti.get_timestamp())
        self._windows.append((begin, end))
        return Measurement(0.0)  # filled in by finish() once the records are flushed

    def finish(self, measurements: list[Measurement]) -> list[Measurement]:
        try:
            self.cupti.activity_flush_all(1)  # 1 = CUPTI_ACTIVITY_FLAG_FLUSH_FORCED
        except Exception as exc:
            raise CuptiUnavailable(f"CUPTI flush failed: {describe(exc)}") from exc
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
                raise helper_error(
                    "unavailable", "benchmark: a measured call launched no GPU activity CUPTI saw"
                )
            span = max(r[1] for r in inside) - min(r[0] for r in inside)
            if span <= 0:
                raise helper_error(
                    "unavailable", "benchmark: a measured call had no positive GPU span"
                )
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


def select_clock(flush_l2: bool) -> CpuClock | CudaEventClock:
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
        return CudaEventClock(torch, flush_l2, f"CUPTI failed to load: {describe(exc)}")
    except Exception as exc:  # installed, but its native pieces do not load
        return CudaEventClock(torch, flush_l2, f"CUPTI failed to load: {describe(exc)}")
    try:
        return CuptiClock(torch, cupti, flush_l2)
    except CuptiUnavailable as exc:
        return CudaEventClock(torch, flush_l2, str(exc))


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
    clock: CpuClock | CudaEventClock,
    call: Callable[[], None],
    settings: BenchmarkConfig,
    watch: DeadlineWatch | None = None,
    warnings: list[str] | None = None,
) -> tuple[int, int]:
    """The untimed first call, the estimate when a budget needs one, and the warm-up calls;
    returns the (warmup, repeat) counts, the warm-up's as made: ``watch`` ends it early when
    the program's deadline is near, to leave the time for the measured calls. A budget whose
    count was capped to ``MAX_CALLS`` adds its warning to ``warnings``."""
    warnings = [] if warnings is None else warnings
    watch = watch or DeadlineWatch()
    warmup, repeat = settings.warmup, settings.repeat
    if warmup is None or repeat is None:
        call()  # the untimed first call pays for lazy initialization and compilation
        if isinstance(clock, CudaEventClock):
            clock.synchronize()
        estimate = clock.estimate(call)
        capped = []
        if warmup is None:
            warmup = calls_for_budget(settings.warmup_ms, estimate)
            capped.append(budget_cap_warning("warmup_ms", settings.warmup_ms, estimate))
        if repeat is None:
            repeat = calls_for_budget(settings.repeat_ms, estimate)
            capped.append(budget_cap_warning("repeat_ms", settings.repeat_ms, estimate))
        warnings += [text for text in capped if text is not None]
    for made in range(warmup):
        if watch.near():
            return made, repeat
        began = time.perf_counter()
        clock.flush()
        call()
        if isinstance(clock, CudaEventClock):
            # a GPU call returns at its launch: without waiting for its work the watch saw
            # microseconds and a large warm-up queued work past the deadline (the 504); a
            # measured call waits for its work the same way
            clock.synchronize()
        watch.timed(began)
    return warmup, repeat
