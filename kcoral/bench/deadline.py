"""The program's execution deadline, as the benchmark helpers see it (EXTENSIONS §12.1).

A program past its deadline gets a 504 and no results (SERVER §8): a benchmark cut there
lost every sample it took. The worker tells this module when its program must be done
(``set_program_deadline``, from the seconds the front-end sends with the program, moved
later by the time the worker then waits for its GPU lease, which pauses the deadline), and
a measurement stops sampling once its next call would end too near it. Outside a worker
(a script calling ``benchmark`` itself) no deadline is known and nothing stops early.
"""

from __future__ import annotations

import time

__all__ = ["DeadlineWatch", "postpone_program_deadline", "set_program_deadline"]

#: Time a cut measurement keeps for what follows it: finishing its clock, encoding the
#: result, the program's own later instructions and the worker's teardown.
MARGIN_SECONDS = 0.5
#: ... plus this share of the whole deadline, at most ``MARGIN_CAP_SECONDS`` in all.
MARGIN_SHARE = 0.1
MARGIN_CAP_SECONDS = 5.0

_deadline_at: float | None = None  # ``time.monotonic()`` by which the program must be done
_deadline_seconds: float | None = None  # the whole deadline, as the program started


def set_program_deadline(seconds: float | None) -> None:
    """The running program must be done within ``seconds`` from now; ``None``: no program
    is running, or its deadline is unknown."""
    global _deadline_at, _deadline_seconds
    _deadline_seconds = seconds
    _deadline_at = None if seconds is None else time.monotonic() + seconds


def postpone_program_deadline(seconds: float) -> None:
    """The deadline moved ``seconds`` later: the worker waited that long for its GPU lease,
    which the front-end's deadline does not count."""
    global _deadline_at
    if _deadline_at is not None and seconds > 0:
        _deadline_at += seconds


class DeadlineWatch:
    """Whether a measurement's next call would end too near the program's deadline. The
    call's cost is the longest call timed so far (``timed``)."""

    def __init__(self) -> None:
        self.deadline_seconds = _deadline_seconds
        self.longest_call = 0.0
        self.cut = False  # the deadline stopped the measurement early

    @property
    def margin(self) -> float:
        whole = self.deadline_seconds or 0.0
        return min(MARGIN_CAP_SECONDS, MARGIN_SECONDS + MARGIN_SHARE * whole)

    def timed(self, started: float) -> None:
        """A call that began at ``time.perf_counter()`` ``started`` has just returned."""
        self.longest_call = max(self.longest_call, time.perf_counter() - started)

    def near(self) -> bool:
        """True (and remembered in ``cut``) when another call would end within the margin."""
        if _deadline_at is None:
            return False
        if _deadline_at - time.monotonic() < self.longest_call + self.margin:
            self.cut = True
        return self.cut
