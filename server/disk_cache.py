"""Persistent cache of file-upload blobs (SERVER.md §10).

Layout ``<dir>/v1/<first two hex digits>/<sha256>``; files 0600, directories 0700. Writes go
to a ``.tmp-*`` file renamed into place while holding an exclusive ``flock`` on ``v1/``, so
several servers may share one directory. Reads verify the hash (a mismatch is a miss and the
bad file is removed) and refresh the mtime that eviction orders by.

The cache can never fail a request: every storage error (read-only directory, full disk,
permissions, a vanished file) is a miss or a skipped write.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import secrets
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

LAYOUT_VERSION = "v1"
TMP_PREFIX = ".tmp-"
_SHA256 = re.compile(r"[0-9a-f]{64}", re.ASCII)


class DiskCache:
    """``DiskCache(path, capacity_mbytes)``; disabled by ``path=None`` or capacity 0."""

    def __init__(self, path: Path | None, capacity_mbytes: int) -> None:
        self.capacity_bytes = max(0, int(capacity_mbytes)) * 1024 * 1024
        self.root = None if path is None else Path(path)
        self.enabled = self.root is not None and self.capacity_bytes > 0
        self.errors = 0  # storage errors swallowed so far (for diagnostics)
        self._lock = threading.Lock()  # flock is per open file; threads need their own lock
        self._ready = False
        if self.enabled:
            # Start-up housekeeping: stray temporary files of a crashed writer, then budget.
            try:
                with self._locked() as locked:
                    if locked:
                        self._remove_stray_temporaries()
                        self._evict()
            except Exception:  # start-up housekeeping is best effort too
                self.errors += 1

    @property
    def base(self) -> Path | None:
        """``<dir>/v1``, or None when disabled."""
        return None if self.root is None else self.root / LAYOUT_VERSION

    def path_for(self, sha256: str) -> Path:
        assert self.root is not None
        return self.root / LAYOUT_VERSION / sha256[:2] / sha256

    # ---------------------------------------------------------------- reads

    def get(self, sha256: str) -> bytes | None:
        """The verified blob, or ``None`` (miss, disabled, corrupt or unreadable)."""
        if not self.enabled or not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
            return None
        try:
            return self._read(sha256)
        except Exception:  # a cache must never fail a request
            self.errors += 1
            return None

    def _read(self, sha256: str) -> bytes | None:
        path = self.path_for(sha256)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError:
            self.errors += 1
            return None
        try:
            with os.fdopen(fd, "rb") as file:
                data = file.read()
                inode = os.fstat(file.fileno()).st_ino
        except OSError:
            self.errors += 1
            return None
        if hashlib.sha256(data).hexdigest() != sha256:
            self._remove_corrupt(path, inode)
            return None
        try:
            os.utime(path)  # eviction is by oldest mtime: a read makes the file young
        except OSError:
            self.errors += 1
        return data

    def __contains__(self, sha256: object) -> bool:
        """Cheap presence check (no hash verification)."""
        if not self.enabled or not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
            return False
        try:
            return self.path_for(sha256).is_file()
        except OSError:
            return False

    def _remove_corrupt(self, path: Path, inode: int) -> None:
        # Under the lock, and only if no writer has renamed a good copy into place meanwhile.
        with self._locked() as locked:
            if not locked:
                return
            try:
                if os.stat(path, follow_symlinks=False).st_ino == inode:
                    os.unlink(path)
            except OSError:
                self.errors += 1

    # ---------------------------------------------------------------- writes

    def put_many(self, items: Mapping[str, Any]) -> None:
        """Store blobs keyed by their (already verified) SHA-256, then evict to the budget.

        Blobs larger than the whole budget and malformed keys are skipped. Never raises.
        """
        if not self.enabled:
            return
        try:
            self._store(items)
        except Exception:  # a cache must never fail a request
            self.errors += 1

    def _store(self, items: Mapping[str, Any]) -> None:
        wanted = {}
        for sha256, data in items.items():
            try:
                size = memoryview(data).nbytes
            except TypeError:
                continue
            if (
                isinstance(sha256, str)
                and _SHA256.fullmatch(sha256)
                and size <= self.capacity_bytes
            ):
                wanted[sha256] = data
        if not wanted:
            return
        with self._locked() as locked:
            if not locked:
                return
            for sha256, data in wanted.items():
                self._write(sha256, data)
            self._evict()

    def _write(self, sha256: str, data: Any) -> None:
        path = self.path_for(sha256)
        try:
            if path.is_file():
                os.utime(path)  # already stored: just refresh
                return
            path.parent.mkdir(mode=0o700, exist_ok=True)
        except OSError:
            self.errors += 1
            return
        tmp = path.parent / f"{TMP_PREFIX}{secrets.token_hex(8)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError:
            self.errors += 1
            return
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
            os.replace(tmp, path)
        except OSError:
            self.errors += 1
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    # ---------------------------------------------------------------- housekeeping

    @contextlib.contextmanager
    def _locked(self) -> Iterator[bool]:
        """Thread lock plus exclusive ``flock`` on ``v1/``; yields False if unusable."""
        with self._lock:
            fd = self._open_base()
            if fd is None:
                yield False
                return
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:
                self.errors += 1
                os.close(fd)
                yield False
                return
            try:
                yield True
            finally:
                os.close(fd)  # closing the last descriptor releases the flock

    def _open_base(self) -> int | None:
        base = self.base
        assert base is not None
        try:
            if not self._ready:
                base.mkdir(mode=0o700, parents=True, exist_ok=True)
                self._ready = True
            return os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            self._ready = False
            self.errors += 1
            return None

    def _shards(self) -> Iterator[os.DirEntry[str]]:
        base = self.base
        assert base is not None
        with os.scandir(base) as entries:
            shards = [e for e in entries if len(e.name) == 2 and e.is_dir(follow_symlinks=False)]
        for shard in shards:
            try:
                with os.scandir(shard.path) as entries:
                    yield from list(entries)
            except OSError:
                self.errors += 1

    def _remove_stray_temporaries(self) -> None:
        try:
            for entry in self._shards():
                if entry.name.startswith(TMP_PREFIX):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)
        except OSError:
            self.errors += 1

    def _evict(self) -> None:
        """Delete the oldest files (by mtime) until the total fits the budget."""
        files = []
        total = 0
        try:
            for entry in self._shards():
                if not _SHA256.fullmatch(entry.name):
                    continue
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                files.append((info.st_mtime_ns, entry.name, entry.path, info.st_size))
                total += info.st_size
        except OSError:
            self.errors += 1
            return
        if total <= self.capacity_bytes:
            return
        files.sort()
        for _, _, path, size in files:
            if total <= self.capacity_bytes:
                break
            try:
                os.unlink(path)
                total -= size
            except FileNotFoundError:
                total -= size
            except OSError:
                self.errors += 1
