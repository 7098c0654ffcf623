"""The warning for a budget spent mostly on cache flushes (SERVER §15, EXTENSIONS §12.1).

A budget bounds the run's time, flushes included: the estimate times each of its 5 calls
with its ``flush_l2`` flush, as Triton's ``do_bench`` does. On a CPU worker that flush
zeroes twice the largest cache (64 MiB behind a 32 MiB L3, 2-12 ms), so a 16 µs call got
4 calls of ``repeat_ms`` 50 and nothing said why. Leaving the flush out of the estimate
instead ran a default benchmark of a small call until the program's deadline (reverted in
bae032b), so the count stays and the warning says where the budget went.
"""

from __future__ import annotations

import math

from kcoral.bench.units import duration

#: A budget's count under this many measured calls is too few for the statistics to lean on.
FEW_CALLS = 10
#: The share of the per-call estimate above which the flush, not the call, used the budget.
FLUSH_SHARE = 0.5


def spent_on_flushes(calls: int, estimate_ms: float | None, flush_ms: float | None) -> bool:
    """Whether a budget's ``calls`` are few because the flush took most of the estimate."""
    if estimate_ms is None or flush_ms is None or estimate_ms <= 0:
        return False
    return calls < FEW_CALLS and flush_ms > FLUSH_SHARE * estimate_ms


def flush_warning(gave: str, estimate_ms: float, flush_ms: float) -> str:
    """``gave`` (``repeat_ms 50 gave 4 measured calls``), the flush's share of the per-call
    estimate in numbers, and the three ways to more calls."""
    # one flush timed alone can read a little over the estimate it is part of
    shown = min(flush_ms, estimate_ms)
    larger = math.ceil(FEW_CALLS * estimate_ms)
    return (
        f"{gave}: the cache flush before each call (flush_l2) took {duration(shown)} of "
        f"the {duration(estimate_ms)} estimated for a call and its flush; for more calls "
        f"give repeat_ms {larger} or more ({FEW_CALLS} calls), an explicit repeat, or "
        "flush_l2=False"
    )
