"""The connection a request runs on, so that another thread can cut it.

``AsyncClient`` runs each request on a transport thread (``ThreadedAsyncTransport``). When
the task awaiting it is cancelled (``asyncio.wait_for``'s timeout, a task group's failure,
a server shutting its loop down), the thread is still blocked reading the answer; only
closing its connection stops the remote work, as ``KeyboardInterrupt`` does for ``Client``:
the server cancels a program whose client went away (EXTENSIONS §9). Before, the program
ran on to its end or its deadline, holding its worker and, on a GPU server, its GPU.

The thread running a request sets its ``InFlight`` (``running``); the keep-alive pool
(``kcoral.connection.keep_alive``) hands it each connection it takes out for that thread,
and takes it back (``detach``) when the connection returns to the pool: from then on the
connection may carry another request, which a late cut must not touch.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from kcoral.connection.per_process import PerProcess

T = TypeVar("T")

#: How long a cut keeps trying when the request's connection has no socket yet (it is
#: connecting): the thread then sends, and the socket appears.
CUT_PATIENCE_SECONDS = 10.0

_current = threading.local()

#: The attribute naming the ``InFlight`` a pooled connection is attached to.
_ATTACHED_TO = "_kcoral_in_flight"


class RequestCut(OSError):
    """The request was cut before it was sent (its task was cancelled)."""


class InFlight:
    """One request's connection, as its thread takes it; ``cut`` from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connection: Any = None
        self.cut_asked = False

    def attach(self, connection: Any) -> None:
        """The request's thread took ``connection`` (a urllib3 connection) for it."""
        with self._lock:
            self._connection = connection
            cut = self.cut_asked
        setattr(connection, _ATTACHED_TO, self)
        if cut:
            connection.close()
            raise RequestCut("the request was cancelled before it was sent")

    def detach(self, connection: Any) -> None:
        """``connection`` went back to the pool: a cut no longer closes it. (A cancel that
        lands after the answer was read, as the task is about to get it, cut the pooled
        connection: by then another request of the client could be running on it, and its
        program was cancelled on the server.)"""
        with self._lock:
            if self._connection is connection:
                self._connection = None

    def cut(self, done: Future[Any]) -> None:
        """Close the request's connection under its thread (a blocked read then fails, and
        the connection never goes back to the pool); ``done`` is the thread's future. A
        connection still connecting is cut once its socket exists, on a thread of its own,
        so the caller's event loop never waits."""
        with self._lock:
            self.cut_asked = True
        if not self._shut() and not done.done():
            threading.Thread(target=self._cut_when_connected, args=(done,), daemon=True).start()

    def _shut(self) -> bool:
        with self._lock:
            sock = getattr(self._connection, "sock", None)
        if sock is None:
            return False
        with contextlib.suppress(OSError):  # closed meanwhile: the request ended anyway
            sock.shutdown(socket.SHUT_RDWR)
        return True

    def _cut_when_connected(self, done: Future[Any]) -> None:
        deadline = time.monotonic() + CUT_PATIENCE_SECONDS
        while not done.done() and time.monotonic() < deadline and not self._shut():
            time.sleep(0.01)


@contextlib.contextmanager
def running(request: InFlight) -> Iterator[None]:
    """Run a request on this thread as ``request`` (its connections are attached to it)."""
    _current.request = request
    try:
        yield
    finally:
        _current.request = None


def attach_to_current(connection: Any) -> None:
    """Attach ``connection`` to the request running on this thread, if it is cuttable."""
    request = getattr(_current, "request", None)
    if request is not None:
        request.attach(connection)


def detach(connection: Any) -> None:
    """``connection`` goes back to the pool: the request it was attached to (if any) no
    longer cuts it."""
    request = getattr(connection, _ATTACHED_TO, None)
    if request is not None:
        setattr(connection, _ATTACHED_TO, None)
        request.detach(connection)


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
