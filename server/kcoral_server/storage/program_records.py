"""The programs a run stores, held under a byte bound (SERVER §13, ``--log-programs-max-bytes``).

Who can reach it: any client-token holder (on a token-less loopback server, any local
process) decides what lands in ``programs/``: every program the server accepts is stored
there, each up to ``--max-request-bytes`` (256 MiB by default). Unbounded, another token
holder fills the server's disk by sending program after program, the disk that also holds
the caches, the jobs' spill files and every identity's logs. So one run's stored programs
stay under a bound: the oldest this run stored are removed to make room for a new one, and a
program larger than the whole bound is not stored at all.

The bookkeeping is in memory (the order this run stored its files and a running total):
``store`` is on the request path, so it never lists the folder. Each file is charged in whole
4 KiB blocks, at least one, so that a flood of tiny programs is charged what it costs the
disk, not its few bytes (and the bookkeeping holds at most ``limit / 4 KiB`` entries).

Trimming is reported through ``report`` at most once per ``report_every`` seconds, with the
counts since the last report, so a flood does not flood ``events.jsonl`` too.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: What a stored file is charged in: a file system block (the usual 4 KiB).
BLOCK = 4096
#: ``--log-programs-max-bytes``'s default where no setting is given (1 GiB).
DEFAULT_LIMIT = 1024**3
#: At most one ``programs_log_trimmed`` report per this many seconds.
REPORT_EVERY_SECONDS = 60.0
#: Repeated request ids whose next free suffix is remembered (``_create``).
SUFFIXES_KEPT = 4096


def charged(size: int) -> int:
    """What a file of ``size`` bytes is charged: whole blocks, at least one."""
    return max(1, -(-size // BLOCK)) * BLOCK


class ProgramRecords:
    """The ``programs/`` folder of one run, under ``limit`` charged bytes (``limit`` > 0).

    ``report(fields)`` is called (outside the lock) when trimming is due to be reported;
    ``failed()`` counts a swallowed I/O error. Thread-safe; never raises.
    """

    def __init__(
        self,
        directory: Path,
        limit: int,
        *,
        report: Callable[[dict[str, Any]], None],
        failed: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
        report_every: float = REPORT_EVERY_SECONDS,
    ) -> None:
        self.directory = directory
        self.limit = limit
        self._report = report
        self._failed = failed
        self._clock = clock
        self._report_every = report_every
        self._lock = threading.Lock()
        # (file name, charged bytes), oldest first: what this run stored and still holds.
        self._stored: deque[tuple[str, int]] = deque()
        # Charged bytes on disk: the files in _stored plus those this run could not remove.
        self._total = 0
        self._stuck: list[tuple[str, int]] = []  # could not be removed: still charged
        self._suffixes: dict[str, int] = {}  # a repeated request id -> its next suffix
        self._last_report: float | None = None
        # Counts since the last report.
        self._removed = 0
        self._removed_bytes = 0
        self._refused = 0

    @property
    def total(self) -> int:
        """Charged bytes this run holds in ``programs/`` now."""
        return self._total

    def store(self, request_id: str, data: bytes | memoryview) -> str | None:
        """Write ``<request-id>.json`` (``-N`` added for a repeated id) after making room;
        its file name, or None where it is not stored (too large, no room, or an error).
        ``request_id`` must already be a safe file name."""
        charge = charged(memoryview(data).nbytes)
        with self._lock:
            fd = None
            name = None
            if self._make_room(charge):
                opened = self._create(request_id)
                if opened is not None:
                    name, fd = opened
                    self._stored.append((name, charge))
                    self._total += charge
            else:
                self._refused += 1
            fields = self._due_report()
        if fields is not None:
            self._report(fields)
        if fd is None or name is None:
            return None
        # Written outside the lock: a large program must not hold up everyone else's. Its
        # bytes are reserved already, so the bound holds while it is written.
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
        except Exception:
            self._failed()
            self._forget(name, charge)
            return None
        return name

    def take_pending_report(self) -> dict[str, Any] | None:
        """The counts not yet reported, now counted as reported (a last report at close),
        or None."""
        with self._lock:
            return self._fields() if self._removed or self._refused else None

    def _make_room(self, charge: int) -> bool:
        """Remove the oldest files until ``charge`` more fits; False where it cannot."""
        if charge > self.limit:
            return False  # larger than the whole bound: keep what is there
        # Files that could not be removed before are tried again first (a passing error
        # must not keep their bytes charged for the rest of the run), then the oldest.
        stuck, self._stuck = self._stuck, []
        for name, size in stuck:
            if self._total + charge <= self.limit or not self._remove(name, size):
                self._stuck.append((name, size))
        while self._total + charge > self.limit and self._stored:
            name, size = self._stored.popleft()
            if not self._remove(name, size):
                # Still on disk: its bytes stay charged, so the bound holds (at the cost of
                # storing less); tried again when room is next needed.
                self._stuck.append((name, size))
        return self._total + charge <= self.limit

    def _remove(self, name: str, size: int) -> bool:
        """Remove a stored file and uncharge it; False (counted) where it stays on disk."""
        try:
            os.unlink(self.directory / name)
        except FileNotFoundError:
            pass  # removed by hand meanwhile: its bytes are free all the same
        except OSError:
            self._failed()
            return False
        self._total -= size
        self._removed += 1
        self._removed_bytes += size
        return True

    def _create(self, request_id: str) -> tuple[str, int] | None:
        # A client may send one request id again and again (it chooses them): the next
        # free suffix is remembered, so the k-th repeat costs one open, not k.
        suffix = self._suffixes.get(request_id, 0)
        while True:
            name = f"{request_id}.json" if suffix == 0 else f"{request_id}-{suffix}.json"
            try:
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
                fd = os.open(self.directory / name, flags, 0o600)
            except FileExistsError:  # the same client id twice: keep both programs
                suffix += 1
                continue
            except OSError:
                self._failed()
                return None
            if suffix or request_id in self._suffixes:
                if len(self._suffixes) >= SUFFIXES_KEPT:
                    self._suffixes.clear()  # bounded; forgetting only costs a probe
                self._suffixes[request_id] = suffix + 1
            return name, fd

    def _forget(self, name: str, charge: int) -> None:
        """Undo a store whose write failed (unless trimming removed it meanwhile)."""
        with self._lock:
            try:
                self._stored.remove((name, charge))
            except ValueError:
                return  # trimmed already: unlinked and uncharged
            self._total -= charge
            with contextlib.suppress(OSError):
                os.unlink(self.directory / name)

    def _due_report(self) -> dict[str, Any] | None:
        if not (self._removed or self._refused):
            return None
        now = self._clock()
        if self._last_report is not None and now - self._last_report < self._report_every:
            return None  # counted; reported with the next one
        self._last_report = now
        return self._fields()

    def _fields(self) -> dict[str, Any]:
        fields = {
            "removed": self._removed,
            "bytes": self._removed_bytes,
            "refused": self._refused,
            "limit": self.limit,
            "message": "stored programs past --log-programs-max-bytes: the oldest were "
            "removed, and a program larger than the bound is not stored",
        }
        self._removed = self._removed_bytes = self._refused = 0
        return fields
