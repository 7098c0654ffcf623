"""Where the front-end's per-request work runs: on the event loop or in the executor.

Handing work to a thread costs front-end CPU (a future, a wake-up of the loop, the thread's
own switch) that small work never earns back: below ``INLINE_BYTES`` parsing and hashing a
body, resolving its blobs, copying cached blobs into a memfd and reading a program's output
run on the loop; above it, in the executor so that the loop keeps serving other requests.
``benchmarks/perf.py`` measures the difference ("front-end CPU per trivial request"): on
the 2-core development machine (2026-12, two alternating runs) handing all of it off cost
1.60 / 1.20 ms per trivial request against 1.30 / 0.90 ms with this threshold.
"""

from __future__ import annotations

INLINE_BYTES = 64 * 1024


def on_loop(nbytes: int) -> bool:
    """Whether work over ``nbytes`` bytes is cheaper on the event loop than handed off."""
    return nbytes <= INLINE_BYTES
