"""How many CPUs other processes kept busy while a measurement ran (EXTENSIONS §12.4).

The load average cannot say this: it counts the measuring process itself, so a benchmark
of a few seconds on a 2-CPU machine raised its own "other work shares this machine"
warning. Here the busy time of the CPUs this process may run on over the measurement
(``/proc/stat``, per CPU of its affinity) minus this process's own (every thread,
``os.times``) is divided by the wall time: the CPUs that other work used on average, the
measurement's neighbours only.
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


def usable_cpus() -> frozenset[int] | None:
    """The CPUs this process may run on (its affinity: a cpuset, ``taskset``), or ``None``
    where the system does not say."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _machine_busy_seconds(cpus: frozenset[int] | None) -> float | None:
    """The busy seconds since boot of ``cpus`` (``None``: of every CPU), or ``None`` off
    Linux. Only the CPUs the measurement may use: work pinned to others (a neighbour
    worker's cpuset on a large node) does not compete with it."""
    try:
        with open("/proc/stat") as handle:
            lines = [line.split() for line in handle if line.startswith("cpu")]
        if cpus is None:
            rows = [lines[0]] if lines and lines[0][0] == "cpu" else []
        else:
            rows = [row for row in lines if row[0][3:].isdigit() and int(row[0][3:]) in cpus]
        if not rows:
            return None
        ticks = sum(int(row[1 + i]) for row in rows for i in _BUSY_FIELDS if 1 + i < len(row))
        return ticks / os.sysconf("SC_CLK_TCK")
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
    cpus: frozenset[int] | None = None  # the CPUs counted (usable_cpus)

    @classmethod
    def start(cls) -> CpuShare:
        started = monotonic()  # read first at both ends, so the spans match
        cpus = usable_cpus()
        return cls(_machine_busy_seconds(cpus), _own_seconds(), started, cpus)

    def others_busy_cpus(self) -> float | None:
        """Other processes' average busy CPUs since ``start``, rounded to 0.01; ``None``
        where ``/proc/stat`` cannot be read or the span is too short to tell."""
        span = monotonic() - self.started
        busy = _machine_busy_seconds(self.cpus)
        if self.machine_busy is None or busy is None or span < MIN_SPAN_SECONDS:
            return None
        others = (busy - self.machine_busy) - (_own_seconds() - self.own)
        return round(max(0.0, others / span), 2)


def busy_threshold(cpu_count: int) -> float:
    """Others' busy CPUs from which they visibly compete with the measurement: half of the
    CPUs the measuring thread leaves, and half a CPU on a machine of one or two."""
    return max(0.5, (cpu_count - 1) / 2)
