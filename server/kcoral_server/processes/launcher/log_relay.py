"""The fork servers' messages, relayed to the front-end's console (SERVER §1, §13).

Who can reach what: a launcher and the workers it forks never hold the front-end's own
stdin, stdout or stderr. Those were the server's console: under bubblewrap a program of any
token holder re-opened them through ``/proc/self/fd`` (the dups its worker keeps while a
program's output is captured) or ``/proc/1/fd`` (bwrap's init inside the sandbox) and read
every identity's console lines, or wrote forged ones. Instead:

* a forked or spawned worker has ``/dev/null`` on its descriptors 0, 1 and 2 (what a
  program's process inherits, and where the capture's saved descriptors point);
* a launcher's stdout and stderr are a pipe only the launcher holds (``--log-fd``; it is
  non-dumpable, so no program reads its descriptors) and that it closes in every child;
  this relay copies its lines to the front-end's stderr, each prefixed ``kcoral launcher:``:
  the preload's failures, the fork rule's refusals, a traceback if it crashes;
* ``bwrap`` (and the launcher until it has taken ``--log-fd``) writes to a second pipe,
  relayed until the launcher first answers: bwrap's own errors come before that, and its
  init, which keeps the pipe for the sandbox's lifetime, is visible to programs, so what
  arrives there later is never read.

One daemon thread serves every launcher of the process; it stops following a pipe at its
end of file or when asked (``stop``), then closes it.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import threading

PREFIX = "kcoral launcher: "
#: a line longer than this is relayed in pieces (the relay never holds more per pipe)
MAX_LINE = 64 * 1024


class LogRelay:
    """Copies lines from pipes to the front-end's stderr, in a thread of its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, bytes] = {}  # followed pipe -> its unfinished line
        self._stopping: set[int] = set()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._thread: threading.Thread | None = None

    def follow(self, fd: int) -> None:
        """Relay ``fd``'s lines (it now belongs to the relay, which closes it)."""
        with self._lock:
            self._pending[fd] = b""
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="kcoral-launcher-log", daemon=True
                )
                self._thread.start()
        self._wake()

    def stop(self, fd: int) -> None:
        """Relay what ``fd`` holds now, then close it: nothing written later is read."""
        with self._lock:
            if fd in self._pending:
                self._stopping.add(fd)
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"w")

    def _run(self) -> None:
        poller = select.poll()
        polled: set[int] = set()
        poller.register(self._wake_r, select.POLLIN)
        while True:
            with self._lock:
                wanted = set(self._pending)
                stopping = self._stopping & wanted
            for fd in wanted - polled:
                poller.register(fd, select.POLLIN)
            for fd in polled - wanted:
                poller.unregister(fd)
            polled = wanted
            for fd in stopping:
                self._drain(fd)  # whatever is there now, without waiting
                self._drop(fd)
                poller.unregister(fd)
                polled.discard(fd)
            for fd, _events in poller.poll():
                if fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 512)
                elif fd in polled and self._read(fd) is False:
                    self._drop(fd)
                    poller.unregister(fd)
                    polled.discard(fd)

    def _drain(self, fd: int) -> None:
        os.set_blocking(fd, False)
        with contextlib.suppress(OSError):
            while self._read(fd):
                pass

    def _read(self, fd: int) -> bool | None:
        """Relay the complete lines of one read: True, or None when nothing is there now
        (a drain's end), False at the end of the pipe."""
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return None
        except OSError:
            data = b""
        with self._lock:
            pending = self._pending.get(fd, b"")
        if not data:
            if pending:
                _write(pending)
            with self._lock:
                self._pending[fd] = b""
            return False
        *lines, rest = (pending + data).split(b"\n")
        while len(rest) > MAX_LINE:
            lines.append(rest[:MAX_LINE])
            rest = rest[MAX_LINE:]
        for line in lines:
            _write(line)
        with self._lock:
            self._pending[fd] = rest
        return True

    def _drop(self, fd: int) -> None:
        with self._lock:
            pending = self._pending.pop(fd, b"")
            self._stopping.discard(fd)
        if pending:
            _write(pending)  # a last line without its newline
        with contextlib.suppress(OSError):
            os.close(fd)


def _write(line: bytes) -> None:
    """One line on the front-end's stderr (the server's console), prefixed once."""
    text = line.decode(errors="replace").rstrip("\r")
    if not text.startswith(PREFIX):
        text = PREFIX + text
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # a console that is gone must not stop the relay


_relay: LogRelay | None = None
_relay_lock = threading.Lock()


def log_relay() -> LogRelay:
    """The process's relay (started on first use)."""
    global _relay
    with _relay_lock:
        if _relay is None:
            _relay = LogRelay()
        return _relay
