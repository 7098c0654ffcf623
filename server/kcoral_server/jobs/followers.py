"""Jobs that end when nobody follows them (``X-KCoral-Cancel-Unfollowed``, EXTENSIONS §5).

``kcoral run`` ties its remote tool to the terminal: Ctrl-C, SIGTERM and SIGHUP cancel the
job, but a client killed with SIGKILL (the OOM killer, ``kill -9``, ``timeout -s KILL``, a
crashed machine) cancels nothing, and its job ran on to its deadline with no one told its id.
A submission may therefore ask to be cancelled once no event stream of it has been open for
a number of seconds: what ``/execute`` does for a client that goes away (§9), with room for a
follower to reconnect (a restarted router, a network blip).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kcoral.protocol.headers import CANCEL_UNFOLLOWED_HEADER

#: the most seconds the header may name (a day)
MOST_SECONDS = 86_400
HEADER_PROBLEM = (
    f"{CANCEL_UNFOLLOWED_HEADER} must be a whole number of seconds from 1 to {MOST_SECONDS}"
)


def unfollowed_grace(value: str | None) -> int | str | None:
    """The header's seconds; None when absent; ``HEADER_PROBLEM`` when it is not valid."""
    if value is None:
        return None
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 6:
        return HEADER_PROBLEM
    seconds = int(text)
    return seconds if 1 <= seconds <= MOST_SECONDS else HEADER_PROBLEM


class FollowerWatch:
    """Counts a job's open event streams and calls ``cancel`` once there has been none for
    ``grace`` seconds (from acceptance, or from the last stream's end)."""

    def __init__(self, grace: int, cancel: Callable[[], None]) -> None:
        self.grace = grace
        self.followers = 0
        self.fired = False  # the job was cancelled for want of a follower
        self.closed = False  # its job finished: no stream that ends arms it again
        self._cancel = cancel
        self._timer: asyncio.TimerHandle | None = None
        self._arm()  # the 202 is out: its client has ``grace`` seconds to open the stream

    def follower_came(self) -> None:
        self.followers += 1
        self._disarm()

    def follower_left(self) -> None:
        self.followers -= 1
        if self.followers == 0:
            self._arm()

    @property
    def armed(self) -> bool:
        """Whether the job is to be cancelled unless a follower comes first."""
        return self._timer is not None

    def close(self) -> None:
        """The job finished: nothing left to cancel."""
        self.closed = True
        self._disarm()

    def _arm(self) -> None:
        self._disarm()
        if self.closed:
            # the last stream of a finished job ended (kcoral run's, once it read the end):
            # armed, it logged job_unfollowed of every such job, which nobody cancelled
            return
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.grace, self._unfollowed)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _unfollowed(self) -> None:
        self._timer = None
        if self.followers == 0:
            self.fired = True
            self._cancel()
