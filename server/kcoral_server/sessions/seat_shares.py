"""Fair session seats (EXTENSIONS §11): how many of a server's ``--max-sessions`` seats one
identity may hold, and the ``503`` that says why a new session is refused.

Without a cap one identity could take every seat and keep the others out until its idle
timeouts ran out (a client that vanished keeps its seats that long). With two or more
seats and two or more identities that can call the server, the default cap is half the
seats, rounded up, so at least one seat is always out of one identity's reach. A server
with one identity (one bare token, or no token at all: everyone is ``default``) has nobody
to be fair to, and its one identity may hold every seat. A node behind a router holds no
client tokens (the router authenticates), so it cannot count the router's identities: it
counts them as several, and ``--max-sessions-per-identity`` sets the cap there explicitly.
"""

from __future__ import annotations

import datetime
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

#: EXTENSIONS §11's fixed text; the counts are appended after it
NO_SEAT_PREFIX = "no session seat free (--max-sessions {seats})"


class HeldSeat(Protocol):
    """What the seat rules read of a live session (``kcoral_server.sessions.registry.Session``)."""

    owner: str

    def idle_deadline(self) -> float | None: ...


def per_identity_cap(seats: int, setting: int | None, identities: int | None) -> int | None:
    """The most seats one identity may hold; None for no cap.

    ``setting`` is ``--max-sessions-per-identity`` (None: the default, 0: no cap);
    ``identities`` how many identities can call this server (None: unknown here, several:
    a node behind a router)."""
    if setting is not None:
        return setting or None
    several = identities is None or identities >= 2
    return math.ceil(seats / 2) if seats >= 2 and several else None


@dataclass(frozen=True)
class SeatRules:
    """One server's seats and the per-identity cap on them."""

    seats: int
    cap: int | None

    def refusal(
        self, live: Iterable[HeldSeat], caller: str, now: float | None = None
    ) -> str | None:
        """Why ``caller`` gets no new seat now (the ``503`` message), or None when it may.

        The message keeps the fixed text, then says how many seats exist, how many are held
        and how many by the caller, and when the earliest seat that would let the caller in
        frees by idle timeout: any seat when all are held, one of the caller's own when it
        is at the cap (a running session has no idle deadline yet)."""
        held = list(live)
        mine = [seat for seat in held if seat.owner == caller]
        full = len(held) >= self.seats
        capped = self.cap is not None and len(mine) >= self.cap
        if not (full or capped):
            return None
        counts = f"{seat_count(self.seats)}, {len(held)} held, {len(mine)} by you"
        if capped:
            counts += f", the most one identity may hold (--max-sessions-per-identity {self.cap})"
        waiting_on = mine if capped else held
        deadlines = [d for d in (seat.idle_deadline() for seat in waiting_on) if d is not None]
        whose = "of yours " if capped else ""
        if deadlines:
            earliest = min(deadlines)
            seconds = max(0, math.ceil(earliest - (time.time() if now is None else now)))
            when = f"the earliest {whose}frees by idle timeout in {seconds} s (at {_utc(earliest)})"
        else:
            when = f"none {whose}is idle, so none frees by idle timeout before its program ends"
        return f"{NO_SEAT_PREFIX.format(seats=self.seats)}: {counts}; {when}"


def seat_count(count: int) -> str:
    """``1 seat``, ``2 seats``: the 503's count (it read ``1 seats``)."""
    return "1 seat" if count == 1 else f"{count} seats"


def _utc(seconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
