"""What a notebook says of a tensor in numbers: min, max and mean of its finite values, and
how many are NaN or infinite (``display.tensor_html`` shows them), without a whole float64
copy of a large one."""

from __future__ import annotations

from typing import Any

import numpy as np

#: Arrays up to this many elements get their statistics from one float64 copy; larger ones
#: are read in float64 pieces of this size, so showing a tensor never needs a whole copy.
STATS_CHUNK_ELEMENTS = 1 << 18

#: The counts of values left out of min/max/mean: the key ``tensor_stats`` gives each, and
#: how ``stats_facts`` names it.
NON_FINITE = {"nan": "NaN", "posinf": "+inf", "neginf": "-inf"}


def tensor_stats(array: np.ndarray) -> dict[str, Any]:
    """shape, dtype and (for non-empty numeric arrays) min/max/mean of the finite values,
    with ``nan``/``posinf``/``neginf`` counts where there are any (min/max/mean alone made
    ``[1, nan, 3, inf]`` read 'min 1 · max 3 · mean 2', the NaN and inf unsaid).

    A large array is converted to float64 a piece at a time (``np.nditer`` buffering), so the
    extra memory is a few pieces, not eight bytes per element; a small one exactly as
    before (one copy, NumPy's summation), so its numbers are unchanged."""
    stats: dict[str, Any] = {"shape": tuple(array.shape), "dtype": str(array.dtype)}
    if not array.size:
        return stats
    if array.dtype.kind in "biu":
        # exact: through float64 an int32 of 987654321 read 'max 9.87654e+08' and int64's
        # largest one more than itself; min and max of integers need no copy at all
        found = _finite_summary(array)
        assert found is not None  # every integer is finite
        stats.update(min=int(array.min()), max=int(array.max()), mean=found[2] / found[3])
        return stats
    try:
        if array.size <= STATS_CHUNK_ELEMENTS:
            values = np.asarray(array, dtype=np.float64)
            finite = values[np.isfinite(values)]
            if finite.size:
                stats.update(
                    min=float(finite.min()), max=float(finite.max()), mean=float(finite.mean())
                )
            if finite.size < values.size:
                stats.update(_non_finite_counts(values))
            return stats
        found = _finite_summary(array)
    except (TypeError, ValueError):
        return stats
    if found is not None:
        low, high, total, count = found
        stats.update(min=low, max=high, mean=total / count)
    if found is None or found[3] < array.size:
        stats.update(_non_finite_counts_in_pieces(array))
    return stats


def stats_facts(stats: dict[str, Any]) -> list[str]:
    """``tensor_stats`` as the words a notebook shows: ``shape (4,)``, ``dtype float32``,
    ``1 NaN``, ``min 1``, ``max 3``, ``mean 2 of the finite values`` (integers exact)."""
    facts = [f"shape {stats['shape']}", f"dtype {stats['dtype']}"]
    facts += [f"{stats[key]} {label}" for key, label in NON_FINITE.items() if key in stats]
    numbers = [
        f"{key} {stats[key]}" if isinstance(stats[key], int) else f"{key} {stats[key]:.6g}"
        for key in ("min", "max", "mean")
        if key in stats
    ]
    left_out = any(key in stats for key in NON_FINITE)
    if numbers and left_out:
        numbers[-1] += " of the finite values"
    elif left_out:
        numbers = ["no finite values"]
    return facts + numbers


def _non_finite_counts(values: np.ndarray) -> dict[str, int]:
    """The ``NON_FINITE`` counts of float64 ``values`` that are not zero."""
    counts = {
        "nan": int(np.isnan(values).sum()),
        "posinf": int(np.isposinf(values).sum()),
        "neginf": int(np.isneginf(values).sum()),
    }
    return {key: count for key, count in counts.items() if count}


def _non_finite_counts_in_pieces(array: np.ndarray) -> dict[str, int]:
    """``_non_finite_counts`` of a large array, read in float64 pieces."""
    totals = dict.fromkeys(NON_FINITE, 0)
    for piece in _float64_pieces(array):
        for key, count in _non_finite_counts(piece).items():
            totals[key] += count
    return {key: count for key, count in totals.items() if count}


def _float64_pieces(array: np.ndarray) -> Any:
    """``array`` as float64 pieces of ``STATS_CHUNK_ELEMENTS`` (one buffer reused)."""
    return np.nditer(
        array,
        flags=["external_loop", "buffered", "refs_ok"],
        op_dtypes=[np.dtype(np.float64)],
        casting="unsafe",
        buffersize=STATS_CHUNK_ELEMENTS,
        order="K",
    )


def _finite_summary(array: np.ndarray) -> tuple[float, float, float, int] | None:
    """(min, max, sum, count) of the finite values of ``array`` as float64, read in pieces of
    ``STATS_CHUNK_ELEMENTS`` (None when none is finite)."""
    low, high, total, count = np.inf, -np.inf, 0.0, 0
    for piece in _float64_pieces(array):
        assert isinstance(piece, np.ndarray)  # one operand: its buffer, not a tuple
        finite = piece if array.dtype.kind in "biu" else piece[np.isfinite(piece)]
        if finite.size:
            low = min(low, float(finite.min()))
            high = max(high, float(finite.max()))
            total += float(finite.sum())
            count += int(finite.size)
    return (low, high, total, count) if count else None
