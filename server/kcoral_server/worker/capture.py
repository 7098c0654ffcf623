"""Output capture (SERVER §9): fds 1 and 2 and ``sys.stdout``/``sys.stderr`` go to files.

Redirecting the descriptors, not just the Python objects, is what catches prints at module
load, ``os.write(1, ...)``, native code and child processes that inherit the descriptors.
The front-end created the files and reads them itself (also after a crash), so the worker
only writes and never truncates them.

The Python-level streams also note which of the two was written when (``StreamOrder``,
EXTENSIONS §16): the two files cannot say how their writes interleaved.
"""

from __future__ import annotations

import ctypes
import io
import os
import sys
from typing import TextIO

from kcoral.protocol.output_order import MAX_RUNS
from kcoral_server.processes.progress_slot import ProgressSlot

_LIBC = ctypes.CDLL(None)


def flush_c_stdio() -> None:
    """Flush libc's stdio buffers so native ``printf`` output lands in the current target."""
    try:
        _LIBC.fflush(None)
    except Exception:
        pass


class StreamOrder:
    """The runs of one program's writes (``processes.output_order``): which stream, and its
    file's size when the other stream took over. Costs a comparison per write, and one
    ``fstat`` and a store into ``shared`` (the front-end's live view) per switch of streams."""

    def __init__(self, shared: ProgressSlot | None = None) -> None:
        self.current = 0  # the fd written last (0: none yet)
        self.runs: list[list[int]] = []
        self.shared = shared

    def switch_to(self, fd: int) -> None:
        """``fd`` is about to be written and the other stream was written last."""
        if self.current and len(self.runs) < MAX_RUNS:
            try:
                run = [self.current, os.fstat(self.current).st_size]
            except OSError:
                run = []  # the program closed it: its output ends there anyway
            if run:
                self.runs.append(run)
                if self.shared is not None:
                    self.shared.run_written(len(self.runs) - 1, run[0], run[1])
        self.current = fd

    def runs_so_far(self) -> list[list[int]]:
        """The runs until now, the one still going ending at its stream's size now."""
        runs = list(self.runs)
        if self.current and len(runs) < MAX_RUNS:
            try:
                runs.append([self.current, os.fstat(self.current).st_size])
            except OSError:
                pass
        return runs


class _OrderedFile(io.FileIO):
    """fd 1 or 2 for the Python-level stream, noting a switch before the write."""

    def __init__(self, fd: int, order: StreamOrder) -> None:
        super().__init__(fd, "w", closefd=False)
        self._fd = fd
        self._order = order

    def write(self, data: object) -> int | None:  # type: ignore[override]
        if self._order.current != self._fd:
            self._order.switch_to(self._fd)
        return super().write(data)  # type: ignore[arg-type]


class OutputCapture:
    """Redirects fds 1/2 for one program; ``restore`` puts the worker's own streams back."""

    def __init__(
        self, stdout_path: str | int, stderr_path: str | int, shared: ProgressSlot | None = None
    ) -> None:
        """Targets are paths, or open descriptors (sandboxed workers) that stay the caller's;
        ``shared``: the progress slot the front-end reads the runs from as they happen."""
        self._saved_objects: tuple[TextIO, TextIO] = (sys.stdout, sys.stderr)
        _flush_quietly(sys.stdout, sys.stderr)
        flush_c_stdio()
        # The program can re-open these through /proc/self/fd: a worker's own 1 and 2 are
        # /dev/null (never the server's console, processes.launcher.log_relay).
        self._saved_fds = (os.dup(1), os.dup(2))
        self._wrappers: list[TextIO] = []
        self.order = StreamOrder(shared)
        self.runs_at_end: list[list[int]] | None = None  # set by ``restore``
        for target_fd, path in ((1, stdout_path), (2, stderr_path)):
            if isinstance(path, int):
                os.dup2(path, target_fd)
                continue
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            try:
                os.dup2(fd, target_fd)  # dup2 clears O_CLOEXEC: children inherit fds 1/2
            finally:
                os.close(fd)
        for fd in (1, 2):
            # write_through: every write reaches the file at once, so output is in order
            # with os.write()/native output and the front-end can stream it live.
            self._wrappers.append(
                io.TextIOWrapper(
                    _OrderedFile(fd, self.order),
                    encoding="utf-8",
                    errors="backslashreplace",
                    line_buffering=True,
                    write_through=True,
                )
            )
        sys.stdout, sys.stderr = self._wrappers[0], self._wrappers[1]

    def restore(self) -> None:
        """Flush, note the whole order (``runs_at_end``), put the worker's own streams back."""
        _flush_quietly(sys.stdout, sys.stderr, *self._wrappers)
        flush_c_stdio()
        self.runs_at_end = self.order.runs_so_far()  # while fds 1 and 2 are still the files
        sys.stdout, sys.stderr = self._saved_objects
        for target_fd, saved in zip((1, 2), self._saved_fds, strict=True):
            os.dup2(saved, target_fd)
            os.close(saved)


def _flush_quietly(*streams: object) -> None:
    for stream in streams:
        try:
            stream.flush()  # type: ignore[attr-defined]
        except Exception:  # user code may have replaced or closed the stream
            pass
