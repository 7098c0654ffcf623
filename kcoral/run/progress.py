"""A one-line progress display on stderr for large transfers of ``kcoral run``.

The line is redrawn in place (carriage return) at most a few times per second and shows bytes
done, the total and the average rate. It is silent when the stream is not a terminal, so
pipes, logs and tests see nothing, and for transfers too small to be worth a line. One line at
a time on a stream: a progress started while another is drawn there stays silent (the client's
upload line inside ``kcoral run``'s own would overwrite it, and it that one).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

#: Transfers smaller than this show no progress line.
LARGE_TRANSFER_BYTES = 8 * 1024 * 1024
_REDRAW_SECONDS = 0.2
# id of a stream -> the progress drawing on it now
_DRAWING: dict[int, Progress] = {}
_DRAWING_LOCK = threading.Lock()


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is an interactive terminal (closed or odd streams are not)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def format_bytes(count: float) -> str:
    """``1536`` -> ``1.5 KiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


class Progress:
    """Progress of one transfer of ``total`` bytes; use as a context manager.

    ``advance(n)`` records bytes done; the final line (with the average rate) is printed when
    the context ends. With ``waiting=True`` a background thread also redraws the line while
    no bytes arrive, for phases whose bytes the caller cannot observe (the HTTP request); its
    line is erased at the end instead of reporting a rate.
    """

    def __init__(
        self,
        label: str,
        total: int,
        stream: TextIO,
        *,
        waiting: bool = False,
        clock: Callable[[], float] = time.monotonic,
        force: bool = False,
    ) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self._stream = stream
        self._clock = clock
        self._enabled = force or (total >= LARGE_TRANSFER_BYTES and is_terminal(stream))
        self._waiting = waiting
        self._started = clock()
        self._last_draw = float("-inf")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self._enabled

    def __enter__(self) -> Progress:
        self._started = self._clock()
        if self._enabled:
            with _DRAWING_LOCK:
                self._enabled = _DRAWING.setdefault(id(self._stream), self) is self
        if self._enabled and self._waiting:
            self._thread = threading.Thread(target=self._tick, name="kcoral-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if not self._enabled:
            return
        with _DRAWING_LOCK:
            _DRAWING.pop(id(self._stream), None)
        with self._lock:
            if exc_type is None and not self._waiting:
                self._draw(final=True)
            else:
                # a waiting line has no meaningful rate (the request also ran the tool), and an
                # error message must not follow half a line
                self._stream.write("\r\x1b[K")
            self._stream.flush()

    def advance(self, count: int) -> None:
        """Record ``count`` more bytes and redraw when the last redraw is old enough."""
        self.done += count
        if not self._enabled:
            return
        now = self._clock()
        if now - self._last_draw >= _REDRAW_SECONDS:
            with self._lock:
                self._draw(final=False)

    def line(self, *, final: bool = False) -> str:
        """The text of the progress line at this moment."""
        elapsed = max(self._clock() - self._started, 1e-9)
        if self._waiting and not final:
            return f"{self.label}: {format_bytes(self.total)}, waiting {elapsed:.0f} s"
        rate = format_bytes(self.done / elapsed) + "/s"
        if final:
            return f"{self.label}: {format_bytes(self.done)} in {elapsed:.1f} s ({rate})"
        return f"{self.label}: {format_bytes(self.done)} of {format_bytes(self.total)} ({rate})"

    def _draw(self, *, final: bool) -> None:
        self._last_draw = self._clock()
        self._stream.write("\r\x1b[K" + self.line(final=final) + ("\n" if final else ""))
        self._stream.flush()

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                self._draw(final=False)
