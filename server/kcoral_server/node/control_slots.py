"""How many control slots a node keeps open to its router (docs/scaling.md).

A control slot carries one request at a time, and an event stream (a job followed live, a
``result()`` that waits) holds its slot for the job's whole run. A fixed count of
``max(4, 2 × seats)`` let three people follow a one-seat node's job live while everyone
else saw nothing until it ended, without a word (jobs soak). So the node opens more as they
fill: whenever fewer than ``RESERVE`` of its control slots are free, it opens another, up
to ``ceiling`` (64, or the base count where that is more). A slot costs the router about
31 KiB and the node one gRPC stream and one loopback connection; slots opened for a burst
stay open until the server stops (a node cannot close a slot the router may be handing a
request at that moment). Who can make a node open them: a client-token holder, by opening
event streams; the ceiling bounds it, and the router's ``--max-slots-per-node`` bounds
what any node opens.

``KCORAL_NODE_CONTROL_SLOTS`` fixes the count (no growth): tests use it to pin the
behaviour of a node whose control slots are all taken.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

CONTROL_SLOTS_ENV = "KCORAL_NODE_CONTROL_SLOTS"
#: the most control slots a node opens by itself (its base count where that is more)
CEILING = 64
#: free control slots a node keeps while under its ceiling: one for the status or cancel of
#: a watched job (a stream never takes a node's last free slot) and one for the next stream
RESERVE = 2


def control_slot_count(worker_slots: int, environ: Mapping[str, str] | None = None) -> int:
    """Control slots to open at start: twice the worker seats, at least 4 (env override)."""
    env = os.environ if environ is None else environ
    value = env.get(CONTROL_SLOTS_ENV, "")
    if value.isdigit():
        return int(value)
    return max(4, 2 * worker_slots)


class ControlSlots:
    """The node's control slots: how many are open and which carry a request now.

    Indices are the tunnel's slot indices (worker slots first, then control slots)."""

    def __init__(self, worker_slots: int, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.base = control_slot_count(worker_slots, env)
        fixed = env.get(CONTROL_SLOTS_ENV, "").isdigit()
        self.ceiling = self.base if fixed else max(CEILING, self.base)
        self.opened = self.base
        self.busy: set[int] = set()
        self._given_up: set[int] = set()  # control slot numbers (0: the first) not reopened

    def taken(self, index: int) -> bool:
        """Slot ``index`` took a request; whether the node should open another slot now."""
        self.busy.add(index)
        free = self.opened - len(self.busy)  # slots still connecting count as free
        return free < RESERVE and self.opened < self.ceiling

    def freed(self, index: int) -> None:
        """Slot ``index``'s request ended (or its stream did)."""
        self.busy.discard(index)

    def open_one(self) -> None:
        self.opened += 1

    def refused(self, number: int, error: str) -> None:
        """Control slot ``number`` (0: the first; negative: a worker slot) failed to open
        with ``error``. One opened beyond the start's count that the router refuses for its
        ``--max-slots-per-node`` is given up, and the node opens no more: it retried for as
        long as the server ran, a refusal logged at the router each time (review)."""
        if number >= self.base and error.startswith("RESOURCE_EXHAUSTED"):
            self._given_up.add(number)
            self.opened -= 1
            self.ceiling = self.opened

    def given_up(self, number: int) -> bool:
        """Whether control slot ``number`` is not to be opened again (``refused``)."""
        return number in self._given_up

    def freer(self, request: Any, index: int) -> Callable[[Any], None]:
        """A done callback for slot ``index``'s relay of ``request``: the slot is free
        again, unless it carries the next request already (``request.followed``: that
        one's relay frees it). Run however the relay ends; called in the relay's own
        ``finally``, it was missed by a relay cancelled while it waited for the one before
        it (review), and the node opened slots it did not need."""
        return lambda _task: None if request.followed else self.freed(index)
