"""The body bytes requests and jobs hold (``--max-inflight-request-bytes``, EXTENSIONS §6),
and each identity's share of them.

Bytes are charged as they arrive and released when their request ends (a job's when the
job ends: it keeps its body while it is queued and runs). Without shares one token holder's
two 256 MiB jobs held the whole default 512 MiB while they ran, and every other identity's
upload over 128 KiB got 503. With two or more identities one holds at most half of the
bound, rounded up (the rule of ``--max-queued-jobs`` and session seats), so the other half
stays open to the rest; a lone identity (one bare token, or none) still has the whole bound.

A request alone may always grow to ``--max-request-bytes``: the bound refuses a request only
while other requests hold bytes, and the share only while the same identity's other
requests hold bytes, so neither can refuse a server's or an identity's first upload.
"""

from __future__ import annotations

from collections import Counter

from kcoral_server.execution.exit_cause import size_text
from kcoral_server.sessions.seat_shares import per_identity_cap


class InflightBytes:
    """What every request holds, in all and by identity."""

    def __init__(self) -> None:
        self.total = 0
        self.by_owner: Counter[str] = Counter()

    def charge(self, owner: str, size: int) -> None:
        self.total += size
        self.by_owner[owner] += size

    def release(self, owner: str, size: int) -> None:
        self.total -= size
        self.by_owner[owner] -= size
        if self.by_owner[owner] <= 0:
            del self.by_owner[owner]

    def refusal(
        self, owner: str, mine: int, more: int, limit: int, identities: int | None
    ) -> str | None:
        """Why a request of ``owner`` that holds ``mine`` bytes may not take ``more`` (the
        ``server saturated: …`` reason), or None when it may. ``limit`` is the resolved
        bound (0: none); ``identities`` how many identities can call (None: several, a
        node behind a router)."""
        if not limit:
            return None
        # the rule of job slots and session seats: half, rounded up, with several callers
        share = per_identity_cap(limit, None, identities)
        held = self.by_owner[owner]
        if share is not None and held > mine and held + more > share:
            return (
                f"bodies of your requests being received and of your queued or running jobs "
                f"hold {size_text(held)} of your share of --max-inflight-request-bytes "
                f"({size_text(share)}, half of {size_text(limit)} while several identities "
                "share this server); send again once one of yours has ended"
            )
        if self.total > mine and self.total + more > limit:
            return (
                "bodies of requests being received and of queued or running jobs hold "
                f"{size_text(self.total)} of --max-inflight-request-bytes ({size_text(limit)})"
            )
        return None
