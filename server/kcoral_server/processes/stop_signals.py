"""The stop signals of a long-running KCoral process (a server, a router, a node's
supervisor) once it has stopped.

Each of them answers SIGTERM, SIGINT and SIGHUP through its asyncio loop, which has every
signal written to the loop's self-pipe (``signal.set_wakeup_fd``). At the end of
``asyncio.run`` the loop closes that pipe *before* it removes its signal handlers, so a
signal landing between made CPython print ``Exception ignored when trying to write to the
signal wakeup fd: ... Bad file descriptor`` after the process had logged that it stopped
(seen in a node's log, when a second SIGTERM reached its supervisor as it exited).
"""

from __future__ import annotations

import signal
from collections.abc import Awaitable
from typing import TypeVar

#: what the three processes answer through their loops
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

Result = TypeVar("Result")


async def then_ignoring_stop_signals(work: Awaitable[Result]) -> Result:
    """``work``'s result; once it has ended, a stop signal changes nothing until the loop
    has closed. The process has stopped by then: a second SIGTERM had nothing left to do
    before either (it set a stop that was set), and the loop's close restores the default
    actions after its pipe is gone."""
    try:
        return await work
    finally:
        for signum in STOP_SIGNALS:
            # replaces the loop's handler in one step: no moment of the default action,
            # which would end the process with a status that is not its own
            signal.signal(signum, signal.SIG_IGN)
