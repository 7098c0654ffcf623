"""The worker's own asyncio event loop (EXTENSIONS §3), made when a program first needs it.

One loop per worker process, created once and reused by later instructions and requests.
Making it copies ~260 pages a forked worker shares with its fork server (~0.8 ms: an epoll
selector, a self-pipe socket pair and the loop's own objects, issue 31), which a program
that never awaits anything (most notebook cells; a one-shot worker's only program) need not
pay. So the loop is made at the first awaitable a ``run`` returns, or when a program asks
asyncio for the main thread's current loop (``asyncio.get_event_loop()``): the policy
installed here hands out the worker's loop there, without the warning asyncio gives when
it has to make one, as the loop made and set at start used to be handed out.

Who can reach what: only the program, in its own process; it may replace the policy or set
a loop of its own, as it could before, and the worker's awaits still run on the worker's.
"""

from __future__ import annotations

import asyncio
import threading


class WorkerLoop:
    """The worker process's event loop, made on first use."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        asyncio.set_event_loop_policy(_MainThreadGetsWorkerLoop(self))

    @property
    def created(self) -> asyncio.AbstractEventLoop | None:
        """The loop if one was made (teardown looks at its tasks and executor), else None."""
        return self._loop

    def get(self) -> asyncio.AbstractEventLoop:
        """The loop, made and set as the main thread's current one the first time."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
        return self._loop


class _MainThreadGetsWorkerLoop(asyncio.DefaultEventLoopPolicy):
    """asyncio's default policy, except that the main thread's current loop, until one is
    set, is the worker's (made then)."""

    def __init__(self, worker_loop: WorkerLoop) -> None:
        super().__init__()
        self._worker_loop = worker_loop
        self._main_thread_set = False

    def set_event_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        if threading.current_thread() is threading.main_thread():
            self._main_thread_set = True
        super().set_event_loop(loop)

    def get_event_loop(self) -> asyncio.AbstractEventLoop:
        if not self._main_thread_set and threading.current_thread() is threading.main_thread():
            return self._worker_loop.get()
        return super().get_event_loop()
