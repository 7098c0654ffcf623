"""How long this server's recent programs held their seats and GPU leases (PROTOCOL §13,
ROUTER §6): what a node's supervisor reports to the router, which estimates the wait of a
queued request from it (the router never reads answers itself).

``RecentLeases`` listens to the event log's ``request_finished`` records (SERVER §13), as
``/metrics`` does, and keeps the last ``capacity`` programs that ran on a seat.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: programs kept, and how old the oldest may be (a quiet node has no recent programs)
CAPACITY = 64
WINDOW_SECONDS = 600.0


@dataclass(frozen=True)
class FinishedProgram:
    at: float  # time.monotonic() when it finished
    seat_held_ms: float  # its run on the seat, lease wait included
    lease_held_ms: float  # 0 on a CPU seat, which holds no lease


class RecentLeases:
    """The last programs that ran on a seat, within ``window`` seconds."""

    def __init__(
        self,
        capacity: int = CAPACITY,
        window: float = WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window = window
        self._clock = clock
        self._programs: deque[FinishedProgram] = deque(maxlen=capacity)

    def record(self, event: str, fields: dict[str, Any]) -> None:
        """An event log listener: keep each program that ran on a seat (``worker_id``) and
        has run times; refusals, cache misses and GPU-set runs (no seat) are left out."""
        if event != "request_finished" or "worker_id" not in fields:
            return
        elapsed, held = fields.get("elapsed_ms"), fields.get("lease_held_ms")
        if not isinstance(elapsed, (int, float)) or isinstance(elapsed, bool):
            return
        lease = held if isinstance(held, (int, float)) and not isinstance(held, bool) else 0.0
        self._programs.append(FinishedProgram(self._clock(), max(0.0, elapsed), max(0.0, lease)))

    def summary(self) -> dict[str, Any]:
        """``lease_stats`` of ``/internal/worker-status`` without ``queued``: ``count`` and
        the mean and median milliseconds, ``None`` without recent programs."""
        now = self._clock()
        while self._programs and now - self._programs[0].at > self.window:
            self._programs.popleft()
        seats = [p.seat_held_ms for p in self._programs]
        leases = [p.lease_held_ms for p in self._programs]
        if not seats:
            return {
                "count": 0,
                "seat_held_mean_ms": None,
                "seat_held_p50_ms": None,
                "lease_held_mean_ms": None,
                "lease_held_p50_ms": None,
            }
        return {
            "count": len(seats),
            "seat_held_mean_ms": round(statistics.fmean(seats), 3),
            "seat_held_p50_ms": round(statistics.median(seats), 3),
            "lease_held_mean_ms": round(statistics.fmean(leases), 3),
            "lease_held_p50_ms": round(statistics.median(leases), 3),
        }
