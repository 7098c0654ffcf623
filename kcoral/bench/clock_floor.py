"""What the clock measures for an empty call (EXTENSIONS §12.4), so a call too short to
time says so instead of reading as its own cost.

On a CPU worker each sample is two ``perf_counter_ns`` reads around a Python call made just
after the cache flush: an empty call measures about a microsecond there, and a function
that takes 0.3 µs warm showed as ``0.000786 ms`` with 280 % noise and nothing to say that
most of it was the measurement. GPU clocks are left alone: CUPTI times only what the call
launched, and an empty CUDA-event pair is a cost a kernel shares anyway. Only ``benchmark``
warns: its calls run back to back as the empty ones do, where a comparison's interleaved
rounds make an empty call cost 3-6 µs against 0.3-1.4 µs in a loop, too far for one rule.
"""

from __future__ import annotations

from statistics import median
from typing import Any

from kcoral.bench.clocks import CpuClock
from kcoral.bench.units import in_unit

#: Empty calls timed for the floor: enough for a stable median, a few µs in all.
FLOOR_CALLS = 25
#: A median under this many empty calls' worth is mostly the measurement's own cost.
FLOOR_FACTOR = 10


def _nothing() -> None:
    return None


def empty_call_ms(clock: Any) -> float | None:
    """The median time ``clock`` measures for an empty call, or ``None`` (GPU clocks)."""
    if not isinstance(clock, CpuClock):
        return None
    return median(clock.measure(_nothing).milliseconds for _ in range(FLOOR_CALLS))


def floor_warning(name: str, median_ms: object, floor_ms: float | None) -> str | None:
    """The warning for a median under ``FLOOR_FACTOR`` empty calls, else ``None``."""
    if floor_ms is None or not isinstance(median_ms, (int, float)):
        return None
    if median_ms >= FLOOR_FACTOR * floor_ms:
        return None
    return (
        f"{name}: its median, {in_unit(median_ms, 'µs')}, is under {FLOOR_FACTOR}× an empty "
        f"call's ({in_unit(floor_ms, 'µs')}): mostly the measurement; time a loop of calls"
    )
