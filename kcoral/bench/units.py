"""Times in the unit they fill (EXTENSIONS §12.5): ``591 ns``, not ``0.000591 ms``; shared by
the result's table and plot and the helpers' warnings."""

from __future__ import annotations

#: (name, milliseconds in one), largest first
TIME_UNITS = (("s", 1000.0), ("ms", 1.0), ("µs", 1e-3), ("ns", 1e-6))


def time_unit(largest_ms: float) -> tuple[str, float]:
    """(name, milliseconds in one) of the unit that times up to ``largest_ms`` read in: the
    largest one they fill, so a call of 0.000591 ms reads ``591 ns``, not three digits of
    zeros (a value that 3 digits round up to the next unit, 999.96 µs, reads in that one)."""
    for name, size in TIME_UNITS:
        if largest_ms >= size * 0.9995:
            return name, size
    return TIME_UNITS[-1]


def duration(milliseconds: float) -> str:
    """A time in 3 digits in the unit it fills: ``20.6 µs``, ``4.07 ms``."""
    return in_unit(milliseconds, time_unit(abs(milliseconds))[0])


def in_unit(milliseconds: float, unit: str) -> str:
    """A time in 3 digits in ``unit`` (a name in ``TIME_UNITS``), where two times read side
    by side share one: ``0.786 µs``."""
    return f"{milliseconds / dict(TIME_UNITS)[unit]:.3g} {unit}"
