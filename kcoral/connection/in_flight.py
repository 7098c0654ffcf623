"""Cutting a request whose awaiting task was cancelled.

``AsyncClient`` runs each request on a transport thread (``ThreadedAsyncTransport``). When
the task awaiting it is cancelled (``asyncio.wait_for``'s timeout, a task group's failure,
a server shutting its loop down), the thread is still blocked reading the answer; only
closing its connection stops the remote work, as ``KeyboardInterrupt`` does for ``Client``:
the server cancels a program whose client went away (EXTENSIONS §9). Before, the program
ran on to its end or its deadline, holding its worker and, on a GPU server, its GPU.

The thread running a request runs it as its ``InFlight`` (``running``), whose record of the
request's connection (``kcoral.connection.request_connection``) the keep-alive pool fills
as it hands the thread a connection, and empties when the connection returns to the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from kcoral.connection.per_process import PerProcess
from kcoral.connection.request_connection import RequestConnection, running_as

T = TypeVar("T")

#: How long a cut keeps trying when the request's connection has no socket yet (it is
#: connecting): the thread then sends, and the socket appears.
CUT_PATIENCE_SECONDS = 10.0


class InFlight:
    """One request, as its thread runs it; ``cut`` from any thread."""

    def __init__(self) -> None:
        self.record = RequestConnection()

    def cut(self, done: Future[Any]) -> None:
        """Close the request's connection under its thread (a blocked read then fails, and
        the connection never goes back to the pool); ``done`` is the thread's future. A
        connection still connecting is cut once its socket exists, on a thread of its own,
        so the caller's event loop never waits."""
        if not self.record.cut() and not done.done():
            threading.Thread(target=self._cut_when_connected, args=(done,), daemon=True).start()

    def _cut_when_connected(self, done: Future[Any]) -> None:
        deadline = time.monotonic() + CUT_PATIENCE_SECONDS
        while not done.done() and time.monotonic() < deadline and not self.record.shut():
            time.sleep(0.01)


@contextlib.contextmanager
def running(request: InFlight) -> Iterator[None]:
    """Run a request on this thread as ``request`` (its connections are recorded for it)."""
    with running_as(request.record):
        yield


#: Threads of ``call_cuttable`` (as many as a client's default ``max_connections``).
_CALL_THREADS = 64
#: made on first use, and afresh in a forked child (which has none of its parent's threads)
_call_pools = PerProcess(
    lambda: ThreadPoolExecutor(_CALL_THREADS, thread_name_prefix="kcoral-call")
)


async def call_cuttable(call: Callable[[], T]) -> T:
    """Await a blocking client call (``Client.execute``) run on a thread; cancelling the
    awaiting task cuts the connection it is using, as for an ``AsyncClient`` request, so the
    server cancels its program (EXTENSIONS §9). A remote function's ``run_async`` call on a
    sync ``Client`` uses it: before, its program ran on to its end after a cancel."""
    flight = InFlight()
    future = _call_pools.get().submit(_call_as, flight, call)
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        flight.cut(future)  # a call not started yet was cancelled with the task
        raise


def _call_as(flight: InFlight, call: Callable[[], T]) -> T:
    with running(flight):
        return call()
