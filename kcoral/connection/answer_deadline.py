"""Deadlines for a whole answer, not for each read of it (CLIENT_API §1).

A read timeout bounds one ``recv``: a server that trickles a byte every half second (a
chunked ``200`` sending ``1\\r\\n \\r\\n`` forever) never trips it, and held ``health()`` for
as long as it liked. So:

* a status read (``Request.read_timeout`` set: ``health()``, ``info()``, a job's state, the
  job list) gets its whole answer, head and body, within that many seconds of being sent;
* any other answer (a program's result, which may be large) gets ``BODY_GRACE_SECONDS``
  once its head came, plus one second per ``BODY_FLOOR_BYTES_PER_SECOND`` of body: a body
  coming at least that fast, after a slow start, always ends in time. Its head may take as
  long as the program runs: that deadline is the server's (the program's ``timeout_seconds``).

Past a deadline the socket of the request's connection (its record,
``kcoral.connection.request_connection``) is shut from one watcher thread (a blocked read
then ends at once) and the transport raises ``TransportError``. Arming one costs a heap push
under a lock, no thread per request: ``benchmarks/`` round trips of a small program.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time

from kcoral.connection.per_process import PerProcess
from kcoral.connection.request_connection import RequestConnection

#: seconds a status read has for its whole answer (``base_client.STATUS_READ_TIMEOUT_SECONDS``)
STATUS_ANSWER_SECONDS = 30.0
#: seconds a program's answer has for its body once its head came, before the floor counts
BODY_GRACE_SECONDS = 30.0
#: the slowest a program's answer body may come on average (512 kbit/s: a poor link's)
BODY_FLOOR_BYTES_PER_SECOND = 64 << 10

#: the watcher's heap is swept of ended deadlines once it holds this many (then twice as
#: many as it kept)
_PRUNE_FROM = 64
#: the watcher sleeps at most this long at once (a deadline a server's huge declared length
#: set far off is then looked at again, never an overflow of the platform's wait)
_LONGEST_WAIT_SECONDS = 3600.0


class AnswerDeadline:
    """One request's deadline (``time.monotonic()`` seconds); the watcher shuts the socket
    of ``request``'s connection once it passes, unless the request ``end``ed first."""

    def __init__(self, at: float, request: RequestConnection | None = None) -> None:
        self.at = at
        #: where it was set; a body of no stated length moves ``at`` on from it as it comes
        self.first_at = at
        self.passed = False
        self.ended = False
        self.request = request
        # ``end`` and the watcher's ``_shut`` one at a time: a shut between the request's
        # last read and its connection's return to the pool broke a pooled connection
        self._lock = threading.Lock()

    def end(self) -> bool:
        """The request is over: its connection may carry the next one, never to be shut.
        Whether the deadline had passed first (its socket was shut: what came may look
        whole, and the connection must not go back to the pool)."""
        with self._lock:
            self.ended = True
            self.request = None
            return self.passed

    def _shut(self) -> None:
        with self._lock:
            if self.ended:
                return
            self.passed = True
            if self.request is not None:
                self.request.shut()


class _Watcher:
    """One thread per process shutting the sockets of requests past their deadline."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, AnswerDeadline]] = []
        self._order = itertools.count()
        self._prune_at = _PRUNE_FROM
        #: the time the thread sleeps toward (``inf``: until told): only an earlier deadline
        #: wakes it
        self._sleeping_until = math.inf
        self._changed = threading.Condition()
        threading.Thread(target=self._run, name="kcoral-answer-deadlines", daemon=True).start()

    def watch(self, deadline: AnswerDeadline) -> None:
        with self._changed:
            heap = self._heap
            if len(heap) >= self._prune_at:
                # ended deadlines wait for their time in the heap: drop them in bulk, so a
                # client doing thousands of calls a second keeps the heap small
                self._heap = heap = [entry for entry in heap if not entry[2].ended]
                heapq.heapify(heap)
                self._prune_at = max(_PRUNE_FROM, 2 * len(heap))
            heapq.heappush(heap, (deadline.at, next(self._order), deadline))
            # not "earlier than the heap's first": a sweep that empties the heap made every
            # next deadline the earliest, and woke the thread once per sweep for nothing
            if deadline.at < self._sleeping_until:
                self._changed.notify()

    def _run(self) -> None:
        with self._changed:
            while True:
                if not self._heap:
                    self._sleeping_until = math.inf
                    self._changed.wait()
                    continue
                at, _, deadline = self._heap[0]
                now = time.monotonic()
                if at > now:
                    # an ended one too waits here for its time (or the bulk sweep in
                    # ``watch``): popped at once, it left the heap empty, so each request's
                    # deadline woke this thread again (two thread switches, ~80 us a round
                    # trip on a loaded 2-core machine)
                    wait = min(at - now, _LONGEST_WAIT_SECONDS)
                    self._sleeping_until = now + wait
                    self._changed.wait(wait)
                    continue
                heapq.heappop(self._heap)
                if deadline.ended:
                    continue
                if deadline.at > at:  # moved on as its body came
                    heapq.heappush(self._heap, (deadline.at, next(self._order), deadline))
                    continue
                deadline._shut()


_watchers = PerProcess(_Watcher)


def watched(at: float, request: RequestConnection) -> AnswerDeadline:
    """A deadline at ``at`` for ``request``, which the watcher keeps."""
    deadline = AnswerDeadline(at, request)
    _watchers.get().watch(deadline)
    return deadline
