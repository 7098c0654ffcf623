"""How many jobs may be queued or running at once (``--max-queued-jobs``, EXTENSIONS §5).

A job is answered ``202`` before it runs, so a token holder can submit small jobs faster
than they run. Each one waiting holds its request (body, record, pipeline task: a few KiB)
and, for a body over 64 KiB, descriptors; without a bound enough of them exhausted the
server's descriptors, and every other user's service with them. ``--max-inflight-request-
bytes`` bounds their bytes, not their number.

The default is a quarter of the open-files limit (16 to 4096): the front-end's own
connections, worker pipes and caches keep the rest, as a router keeps three quarters of its
descriptors from unclassified connections. With two or more identities one identity holds at
most half of the slots, rounded up (the rule of session seats, ``seat_shares``), so one
flooding token holder leaves the other half to the rest.
"""

from __future__ import annotations

import resource
from collections import Counter

from kcoral_server.sessions.seat_shares import per_identity_cap

#: the default bound's range (a quarter of the open-files limit in between)
FEWEST_DEFAULT_SLOTS = 16
MOST_DEFAULT_SLOTS = 4096


def default_job_slots() -> int:
    """A quarter of this process's soft open-files limit, 16 to 4096."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MOST_DEFAULT_SLOTS
    return max(FEWEST_DEFAULT_SLOTS, min(MOST_DEFAULT_SLOTS, soft // 4))


class JobSlots:
    """The jobs each identity holds (queued or running, or being submitted)."""

    def __init__(self, setting: int | None, identities: int | None) -> None:
        #: the bound (0: none), and the most one identity may hold (None: no share)
        self.limit = default_job_slots() if setting is None else setting
        self.per_identity: int | None = None
        self.use_identity_count(identities)
        self.held: Counter[str] = Counter()

    def use_identity_count(self, identities: int | None) -> None:
        """The most one identity may hold for ``identities`` callers (at start, and when a
        token reload changes how many there are)."""
        self.per_identity = per_identity_cap(self.limit, None, identities) if self.limit else None

    def take(self, owner: str) -> str | None:
        """Take a slot for ``owner``; or why not (the ``server saturated: …`` reason)."""
        if self.limit:
            total = sum(self.held.values())
            if total >= self.limit:
                return (
                    f"{total} jobs are queued or running, the most --max-queued-jobs allows "
                    f"({self.limit}); submit again once one has finished"
                )
            mine = self.held[owner]
            if self.per_identity is not None and mine >= self.per_identity:
                return (
                    f"you hold {mine} queued or running jobs, the most one identity may "
                    f"(half of --max-queued-jobs {self.limit}); submit again once one of "
                    "yours has finished"
                )
        self.held[owner] += 1
        return None

    def give_back(self, owner: str) -> None:
        self.held[owner] -= 1
        if self.held[owner] <= 0:
            del self.held[owner]
