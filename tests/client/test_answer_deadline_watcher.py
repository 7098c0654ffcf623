"""The one thread that shuts the sockets of answers past their deadline
(``kcoral.connection.answer_deadline``) sleeps through a client's ordinary requests: each
request arms a deadline 30 s off and ends long before it. It used to drop each ended
deadline at once, so the next request found its heap empty and woke it again: two thread
switches per request, about 80 us of a small program's 0.5 ms round trip on a loaded
2-core machine; then once per bulk sweep of ended deadlines (every 64 requests), which left
its heap empty, so the next deadline looked the earliest. Counted here in wake-ups, not
timed."""

from __future__ import annotations

import socket
import threading
import time

from kcoral.connection.answer_deadline import AnswerDeadline, _Watcher
from kcoral.connection.request_connection import RequestConnection


def test_requests_that_end_before_their_deadline_do_not_wake_the_watcher_each() -> None:
    watcher = _Watcher()
    wakes = 0
    notify = watcher._changed.notify

    def counted_notify(n: int = 1) -> None:
        nonlocal wakes
        wakes += 1
        notify(n)

    watcher._changed.notify = counted_notify  # type: ignore[method-assign]
    for _ in range(200):
        deadline = AnswerDeadline(time.monotonic() + 30)
        watcher.watch(deadline)
        deadline.end()  # its answer came before the watcher got to run (it needs the GIL)
        time.sleep(0.001)  # the next request's round trip: the watcher runs meanwhile
    # one wake when the heap first gets a deadline; a bulk sweep that empties the heap
    # (each 64 requests) wakes it no more: the next deadline is later than the swept one it
    # sleeps toward
    assert wakes <= 1, wakes


def test_a_deadline_that_passes_still_shuts_its_request_among_ended_ones() -> None:
    watcher = _Watcher()
    for _ in range(10):
        ended = AnswerDeadline(time.monotonic() + 30)
        watcher.watch(ended)
        ended.end()
    due = AnswerDeadline(time.monotonic() + 0.2)  # earlier than the ended ones: wakes it
    watcher.watch(due)
    give_up = time.monotonic() + 10
    while not due.passed and time.monotonic() < give_up:
        time.sleep(0.02)
    assert due.passed


class _Connection:
    """What a deadline reaches of a urllib3 connection: its socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock


def test_a_request_that_ended_first_never_has_its_pooled_connection_shut() -> None:
    # The request ends (and its connection goes back to the pool) as the watcher finds its
    # deadline passed: whichever comes first wins, and an end that won sees a live socket.
    for _ in range(300):
        ours, theirs = socket.socketpair()
        with ours, theirs:
            request = RequestConnection()
            request.take(_Connection(ours))
            deadline = AnswerDeadline(time.monotonic(), request)
            watcher = threading.Thread(target=deadline._shut)
            watcher.start()
            passed = deadline.end()
            watcher.join()
            assert passed == deadline.passed
            if not passed:  # back in the pool: still able to carry the next request
                ours.sendall(b"x")
                assert theirs.recv(1) == b"x"
