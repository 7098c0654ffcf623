"""The front-end's end of one worker's socket: an inbox of messages in arrival order.

The IPC channel hands every frame over as soon as it is read (``ipc.AsyncChannel`` with a
sink). Lease messages go straight to whoever holds the worker's lease; everything else
waits in the inbox for whoever drives the current request or start-up (``receive``).
``interrupt`` wakes a waiting ``receive`` (a cancel, a deadline's alarm). Once broken,
every later ``receive`` raises the same ``WorkerGone``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from kcoral_server.processes import ipc


class WorkerGone(Exception):
    """The worker's channel broke: the process died or spoke garbage."""

    def __init__(
        self, reason: str, *, invalid: bool = False, too_large: ipc.FrameTooLarge | None = None
    ) -> None:
        super().__init__(reason)
        self.invalid = invalid  # True: it sent something unreadable, not just EOF
        self.too_large = too_large  # the frame past what an answer carries, if that was it


class ReceiveInterrupted(Exception):
    """``receive`` was woken by ``interrupt`` (a cancel, or the deadline's alarm)."""


_INTERRUPT = object()


class WorkerChannel:
    """Messages from one worker, and the way to send it more.

    ``on_lease`` gets ``LeaseAcquire``/``LeaseRelease``. When the channel breaks (once),
    ``describe`` turns the reason into the ``WorkerGone`` every ``receive`` raises from then
    on (the worker handle adds what it knows, e.g. a limit the worker hit), and ``on_gone``
    is told after it is in the inbox."""

    def __init__(
        self,
        *,
        on_lease: Callable[[ipc.Message], None],
        describe: Callable[[WorkerGone], WorkerGone],
        on_gone: Callable[[], None],
    ) -> None:
        self._on_lease = on_lease
        self._describe = describe
        self._on_gone = on_gone
        self._socket: ipc.AsyncChannel | None = None
        # A deque and the futures of waiting receives, not an ``asyncio.Queue``: ``receive``
        # is on every request's path (~6 messages each), and its timeout is a timer on the
        # waiter rather than ``wait_for`` (a task per call before Python 3.12).
        self._inbox: deque[Any] = deque()
        self._receivers: list[asyncio.Future] = []
        self._interrupted = False
        self.gone: WorkerGone | None = None

    def attach(self, sock: socket.socket, max_frame_bytes: int = ipc.MAX_FRAME_BYTES) -> None:
        """Start reading ``sock`` (the front-end's end of the worker's socket pair), taking
        no frame over ``max_frame_bytes``."""
        self._socket = ipc.AsyncChannel(sock, sink=self._arrived, max_frame_bytes=max_frame_bytes)

    def _arrived(self, item: ipc.ChannelItem) -> None:
        """Called by the IPC channel for each message, in order, and once with the
        exception that broke it."""
        if isinstance(item, BaseException):
            if isinstance(item, ipc.IpcError):
                too_large = item if isinstance(item, ipc.FrameTooLarge) else None
                self.fail(
                    WorkerGone(f"invalid worker message: {item}", invalid=True, too_large=too_large)
                )
            else:
                self.fail(WorkerGone(f"channel closed: {item}"))
            return
        message, fds = item
        if isinstance(message, ipc.LeaseAcquire | ipc.LeaseRelease):
            close_fds(fds)
            self._on_lease(message)
        else:
            self._put(item)

    def fail(self, gone: WorkerGone) -> None:
        """The worker is gone (once; later calls are ignored)."""
        if self.gone is None:
            self.gone = self._describe(gone)
            self._put(self.gone)
            self._on_gone()

    def process_exited(self) -> None:
        """The process died: the channel fails behind every frame already received."""
        if self._socket is not None and self.gone is None:
            self._socket.finish(EOFError("worker process exited"))

    def send(self, message: ipc.Message, fds: Sequence[int] = ()) -> None:
        if self._socket is None or self.gone is not None:
            raise WorkerGone(str(self.gone) if self.gone else "worker not started")
        try:
            self._socket.send(message, fds)
        except OSError as exc:
            self.fail(WorkerGone(f"cannot write to worker: {exc}"))
            raise self.gone from None  # type: ignore[misc]

    async def receive(self, timeout: float | None) -> tuple[ipc.Message, list[int]]:
        """Next non-lease message; ``TimeoutError`` after ``timeout``; ``WorkerGone``;
        ``ReceiveInterrupted`` after ``interrupt``."""
        while True:
            if not self._inbox:
                await self._inbox_filled(timeout)
                if not self._inbox:
                    continue  # another receive took it first
            item = self._inbox.popleft()
            if isinstance(item, WorkerGone):
                self._inbox.append(item)  # every later receive fails the same way
                raise item
            if item is not _INTERRUPT:
                return item
            if self._interrupted:
                self._interrupted = False
                raise ReceiveInterrupted()
            # a stale wake-up (cleared after the request ended): skip it

    async def _inbox_filled(self, timeout: float | None) -> None:
        """Wait until something is put in the inbox; ``TimeoutError`` after ``timeout``."""
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._receivers.append(waiter)
        timer = loop.call_later(timeout, _expire, waiter) if timeout is not None else None
        try:
            filled = await waiter
        finally:
            if timer is not None:
                timer.cancel()
            with contextlib.suppress(ValueError):
                self._receivers.remove(waiter)
        if not filled:
            raise TimeoutError()

    def _put(self, item: Any) -> None:
        self._inbox.append(item)
        receivers, self._receivers = self._receivers, []
        for waiter in receivers:
            if not waiter.done():
                waiter.set_result(True)

    def interrupt(self) -> None:
        """Wake the current (or next) ``receive`` with ``ReceiveInterrupted``."""
        self._interrupted = True
        self._put(_INTERRUPT)

    def clear_interrupt(self) -> None:
        """Forget a pending ``interrupt`` (its request is over)."""
        self._interrupted = False

    def close(self) -> None:
        """Stop reading; a later ``receive`` reports the worker closed."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        if self.gone is None:
            self.gone = WorkerGone("worker closed")
            self._put(self.gone)


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(False)  # a result, not an exception: none left unretrieved


def close_fds(fds: Sequence[int]) -> None:
    """Close descriptors that came with a message and are not kept (already closed: fine)."""
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
