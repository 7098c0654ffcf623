"""How many CPUs other processes kept busy while a measurement ran (EXTENSIONS §12.4).

The load average cannot say this: it counts the measuring process itself, so a benchmark
of a few seconds on a 2-CPU machine raised its own "other work shares this machine"
warning. Here the machine's busy CPU time over the measurement (``/proc/stat``) minus this
process's own (every thread, ``os.times``) is divided by the wall time: the CPUs that
other work used on average, the measurement's neighbours only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from time import monotonic

#: Shorter than this, a few 10 ms clock ticks of rounding make the share meaningless.
MIN_SPAN_SECONDS = 0.2

#: /proc/stat's ``cpu`` fields that count busy time (user nice system irq softirq steal;
#: guest time is already inside user).
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


def _machine_busy_seconds() -> float | None:
    """The busy CPU seconds of every CPU since boot, or ``None`` off Linux."""
    try:
        with open("/proc/stat") as handle:
            first = handle.readline().split()
        ticks = [int(value) for value in first[1:]]
        return sum(ticks[i] for i in _BUSY_FIELDS if i < len(ticks)) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _own_seconds() -> float:
    own = os.times()
    return own.user + own.system


@dataclass(frozen=True)
class CpuShare:
    """The readings at a measurement's start; ``others_busy_cpus()`` at its end."""

    machine_busy: float | None
    own: float
    started: float

    @classmethod
    def start(cls) -> CpuShare:
        started = monotonic()  # read first at both ends, so the spans match
        return cls(_machine_busy_seconds(), _own_seconds(), started)

    def others_busy_cpus(self) -> float | None:
        """Other processes' average busy CPUs since ``start``, rounded to 0.01; ``None``
        where ``/proc/stat`` cannot be read or the span is too short to tell."""
        span = monotonic() - self.started
        busy = _machine_busy_seconds()
        if self.machine_busy is None or busy is None or span < MIN_SPAN_SECONDS:
            return None
        others = (busy - self.machine_busy) - (_own_seconds() - self.own)
        return round(max(0.0, others / span), 2)


def busy_threshold(cpu_count: int) -> float:
    """Others' busy CPUs from which they visibly compete with the measurement: half of the
    CPUs the measuring thread leaves, and half a CPU on a machine of one or two."""
    return max(0.5, (cpu_count - 1) / 2)
