"""The connection a request runs on, as the keep-alive pool hands it to the request's thread.

Three things reach a request's connection from outside urllib3: a cut (``in_flight``: the
task awaiting it was cancelled) and a deadline (``answer_deadline``: its answer took too
long) shut its socket from other threads, and a body being sent (``early_answer``) looks
whether an answer already waits on it. All three read this one record. Before, the pool set
a thread-local record for each side by side, and each kept its own copy of the connection.

The thread running a request opens its record (``running_as``; ``of_this_thread`` opens one
where none is open, or is the one a caller opened, as a cuttable call's); the pool
(``kcoral.connection.keep_alive``) hands it each connection it takes out for that thread
(``taken``) and takes it back (``returned``) when the connection returns to the pool: from
then on the connection may carry another request, which a late shut must not touch.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

_current = threading.local()

#: The attribute naming the record a pooled connection was taken for.
_TAKEN_FOR = "_kcoral_request"


class RequestCut(OSError):
    """The request was cut before it was sent (its task was cancelled)."""


class RequestConnection:
    """One request's connection, as its thread takes it; shut from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connection: Any = None
        #: a cut came: a connection taken from now on is closed before it carries anything
        self.cut_asked = False

    @property
    def connection(self) -> Any:
        """The urllib3 connection the request runs on now; None before and after."""
        return self._connection

    def take(self, connection: Any) -> None:
        """The request's thread took ``connection`` (a urllib3 connection) for it."""
        with self._lock:
            self._connection = connection
            cut = self.cut_asked
        setattr(connection, _TAKEN_FOR, self)
        if cut:
            connection.close()
            raise RequestCut("the request was cancelled before it was sent")

    def give_back(self, connection: Any) -> None:
        """``connection`` went back to the pool: a shut no longer reaches it. (A cancel that
        lands after the answer was read, as the task is about to get it, cut the pooled
        connection: by then another request of the client could be running on it.)"""
        with self._lock:
            if self._connection is connection:
                self._connection = None

    def cut(self) -> bool:
        """Shut the socket now, and close any connection taken from now on before it carries
        anything (``RequestCut``); False when there was no socket to shut yet."""
        with self._lock:
            self.cut_asked = True
        return self.shut()

    def shut(self) -> bool:
        """Shut the socket of the request's connection (a blocked read then ends at once);
        False when it has none (not taken yet, or still connecting)."""
        with self._lock:
            sock = getattr(self._connection, "sock", None)
        if sock is None:
            return False
        with contextlib.suppress(OSError):  # closed meanwhile: the request ended anyway
            sock.shutdown(socket.SHUT_RDWR)
        return True


def current() -> RequestConnection | None:
    """The record of the request running on this thread; None outside one."""
    record: RequestConnection | None = getattr(_current, "record", None)
    return record


@contextlib.contextmanager
def running_as(record: RequestConnection) -> Iterator[None]:
    """Run a request on this thread as ``record`` (the connections taken here go to it)."""
    outer = current()
    _current.record = record
    try:
        yield
    finally:
        _current.record = outer


@contextlib.contextmanager
def of_this_thread() -> Iterator[RequestConnection]:
    """The record of the request running on this thread: the one a caller opened (a
    cuttable call's, ``kcoral.connection.in_flight``), else a new one for the duration."""
    record = current()
    if record is not None:
        yield record
        return
    record = RequestConnection()
    with running_as(record):
        yield record


def taken(connection: Any) -> None:
    """The pool hands ``connection`` out on this thread: to its request's record, if any."""
    record = current()
    if record is not None:
        record.take(connection)


def returned(connection: Any) -> None:
    """``connection`` goes back to the pool: the record it was taken for lets go of it."""
    record = getattr(connection, _TAKEN_FOR, None)
    if record is not None:
        setattr(connection, _TAKEN_FOR, None)
        record.give_back(connection)
