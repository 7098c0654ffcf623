"""Connection pools and thread pools that a forked child does not share with its parent.

After ``os.fork()`` (``multiprocessing``'s default start method on Linux) the child holds
copies of its parent's pooled keep-alive sockets, which are the same TCP connections, and
of its thread pools' bookkeeping without their threads. Before, a child that reused such a
socket wrote on its parent's connection and the two processes read each other's answers (a
parent's ``GET /health`` got the child's ``/v1/info`` answer), and an ``AsyncClient`` call in
the child waited for a pool thread that the child did not have: it hung.

``PerProcess`` holds one such object, made on first use; in a forked child it is made
afresh. What the child inherited is let go without closing it through its owner: that takes
locks another thread of the parent may have held at the fork. The child's copies of idle
pooled sockets are closed (its descriptors only: the parent's connections stay open).
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_holders: weakref.WeakSet[PerProcess[Any]] = weakref.WeakSet()
#: What forked children inherited, kept so that no finalizer of it runs (see the docstring).
_inherited: list[object] = []


class PerProcess(Generic[T]):
    """One ``make()`` per process: ``get()`` makes it on first use, and again in a forked
    child; ``forget_inherited`` (if given) releases what a child inherited, lock-free."""

    def __init__(
        self, make: Callable[[], T], *, forget_inherited: Callable[[T], None] | None = None
    ) -> None:
        self._make = make
        self._forget_inherited = forget_inherited
        self._value: T | None = None
        self._lock = threading.Lock()
        _holders.add(self)

    def get(self) -> T:
        with self._lock:
            if self._value is None:
                self._value = self._make()
            return self._value

    def peek(self) -> T | None:
        """The object if this process made one, without making it."""
        return self._value

    def take(self) -> T | None:
        """The object, which this holder lets go (the next ``get()`` makes a new one)."""
        with self._lock:
            value, self._value = self._value, None
            return value

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()  # a parent thread may have held it at the fork
        inherited, self._value = self._value, None
        if inherited is not None:
            _inherited.append(inherited)
            if self._forget_inherited is not None:
                with contextlib.suppress(Exception):
                    self._forget_inherited(inherited)


def close_inherited_sockets(manager: Any) -> None:
    """Close a forked child's copies of the idle sockets of a ``urllib3.PoolManager``.

    Reads urllib3's containers without their locks: in the child no other thread runs."""
    for pool in list(manager.pools._container.values()):
        for connection in list(getattr(pool.pool, "queue", None) or ()):
            sock = getattr(connection, "sock", None)
            if sock is not None:
                sock.close()  # this process's descriptor; the parent's socket stays open
                connection.sock = None


def _after_fork_in_child() -> None:
    for holder in list(_holders):
        holder._after_fork_in_child()


if hasattr(os, "register_at_fork"):  # POSIX; elsewhere there is no fork to survive
    os.register_at_fork(after_in_child=_after_fork_in_child)
