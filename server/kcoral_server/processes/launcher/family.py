"""A subreaper's children, as the fork server and a spawn supervisor keep track of them.

Both processes are child subreapers (SERVER §11): what a dead worker left running is
re-parented to them. ``Family`` reaps the workers, kills those orphans at once and reports a
worker's exit only once no orphan is left, so "exited" means "and its descendants are gone";
an orphan that outlives ``SIGKILL`` for ``orphan_kill_seconds()`` is reported as a survivor.
``watch_parent`` ties either process to the front-end.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field

from kcoral_server.processes.launcher.wire import STATUS, orphan_kill_seconds
from kcoral_server.processes.pidfd import open_pidfd
from kcoral_server.processes.procfs import children, is_alive, kill_process
from kcoral_server.worker.reaper import tie_to_parent

ORPHAN_POLL_SECONDS = 0.01  # how often the launcher looks again while orphans are dying
STUCK_POLL_SECONDS = 0.5  # ... and once they have outlived ``orphan_kill_seconds()``


@dataclass
class Exited:
    """A reaped worker whose exit is not reported yet."""

    pid: int
    code: int
    status_fd: int
    at: float


@dataclass
class Family:
    """The launcher's children: workers it forked (exit codes go out through their status
    pipes) and orphans a dead worker left, re-parented to the subreaper (killed at once)."""

    workers: dict[int, int] = field(default_factory=dict)  # pid -> status pipe write end
    exited: list[Exited] = field(default_factory=list)  # reaped, not yet reported
    orphans: list[int] = field(default_factory=list)
    orphans_since: float | None = None  # when the current run of live orphans began
    #: workers whose exit code stays in ``reported`` once reported: a spawn supervisor's one
    #: worker. The fork server keeps none: it forks a worker per program for as long as the
    #: server runs, and a code kept for each would grow its heap (and every fork's) forever.
    kept: set[int] = field(default_factory=set)
    reported: dict[int, int] = field(default_factory=dict)  # pid -> exit code, of ``kept``
    kill_seconds: float = field(default_factory=orphan_kill_seconds)

    @property
    def poll_interval(self) -> float | None:
        """How long the loop may sleep before ``collect`` must run again (None: until a
        signal): briefly while orphans die, slowly once they have outlived ``SIGKILL``."""
        if self.exited:
            return ORPHAN_POLL_SECONDS
        if not self.orphans:
            return None
        since = self.orphans_since if self.orphans_since is not None else time.monotonic()
        if time.monotonic() - since < self.kill_seconds:
            return ORPHAN_POLL_SECONDS
        return STUCK_POLL_SECONDS

    @property
    def empty(self) -> bool:
        return not (self.workers or self.exited or self.orphans)

    def collect(self) -> None:
        """Reap what finished, kill orphans, report exits nothing is left behind for."""
        self._reap()
        # Children that are not workers can only be orphans: the launcher forks nothing else.
        self.orphans = [
            pid for pid in children(os.getpid()) if pid not in self.workers and is_alive(pid)
        ]
        for pid in self.orphans:
            kill_process(pid)  # our unreaped child: its pid cannot have been recycled
        now = time.monotonic()
        if not self.orphans:
            self.orphans_since = None
        elif self.orphans_since is None:
            self.orphans_since = now
        waiting = []
        for entry in self.exited:
            # An orphan may belong to any worker that died: hold every report until none is
            # left (orphans die within moments of a SIGKILL), so "exited" means "and its
            # descendants are gone" to the front-end. Past the limit the report says how
            # many survived, and the front-end quarantines instead of trusting it.
            if self.orphans and now - entry.at < self.kill_seconds:
                waiting.append(entry)
            else:
                report_exit(entry.status_fd, entry.code, len(self.orphans))
                if entry.pid in self.kept:
                    self.reported[entry.pid] = entry.code
        self.exited = waiting

    def _reap(self) -> None:
        while True:
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            fd = self.workers.pop(pid, None)
            if fd is not None:
                code = os.waitstatus_to_exitcode(wait_status)
                self.exited.append(Exited(pid, code, fd, time.monotonic()))

    def kill_all(self, timeout: float = 5.0) -> None:
        """The front-end is gone: kill every child (workers and orphans) and reap them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._reap()
            live = [pid for pid in children(os.getpid()) if is_alive(pid)]
            if not live:
                break
            for pid in live:
                kill_process(pid)
            time.sleep(ORPHAN_POLL_SECONDS)
        self._reap()
        survivors = sum(1 for pid in children(os.getpid()) if is_alive(pid))
        for entry in self.exited:
            report_exit(entry.status_fd, entry.code, survivors)
        self.exited = []

    def forget(self) -> None:
        """In a freshly forked worker: drop the launcher's bookkeeping and descriptors."""
        for fd in self.workers.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        for entry in self.exited:
            with contextlib.suppress(OSError):
                os.close(entry.status_fd)
        self.workers.clear()
        self.exited.clear()
        self.orphans.clear()

    def close(self) -> None:
        """The launcher leaves: running workers lose their exit reports (and, through the
        parent-death signal, their lives)."""
        self.forget()


def report_exit(fd: int, code: int, survivors: int = 0) -> None:
    """Write a worker's ``STATUS`` record to its status pipe ``fd`` and close it."""
    if fd < 0:
        return  # a supervisor's worker: the code becomes the supervisor's own
    with contextlib.suppress(OSError):
        os.write(fd, STATUS.pack(code, survivors))
    with contextlib.suppress(OSError):
        os.close(fd)


def watch_parent(parent: int | None) -> tuple[bool, int | None]:
    """``(alive, pidfd)`` for the front-end: a pidfd turns readable when the whole process
    is gone (unlike the parent-death signal, which follows the thread that forked us)."""
    if parent is None:
        return True, None
    try:
        pidfd = open_pidfd(parent)
    except ProcessLookupError:
        return False, None
    if pidfd is None:
        # No pidfds (Linux < 5.3, gVisor): the parent-death signal is the next best thing.
        if not tie_to_parent(parent):
            return False, None
    # Checked after the pidfd is open: a parent that died before cannot be missed.
    if os.getppid() != parent:
        if pidfd is not None:
            os.close(pidfd)
        return False, None
    return True, pidfd
