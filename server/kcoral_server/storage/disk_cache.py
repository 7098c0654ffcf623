"""Persistent cache of file-upload blobs (SERVER.md §10).

Layout ``<dir>/v1/<first two hex digits>/<sha256>`` for the ``default`` identity (every
caller of a server without named tokens) and ``<dir>/v1/id-<identity>/<two hex>/<sha256>`` for
each other identity; files 0600, directories 0700. Writes go
to a ``.tmp-*`` file renamed into place while holding an exclusive ``flock`` on ``v1/``, so
several servers may share one directory. Reads verify the hash (a mismatch is a miss and the
bad file is removed) and refresh the mtime that eviction orders by.

The cache can never fail a request: every storage error (read-only directory, full disk,
permissions, a vanished file) is a miss or a skipped write.

Who can reach what: a lookup names a *scope* (the caller's identity name) and finds only
files stored under it, so another token holder can neither read a blob it never uploaded by
naming its hash nor learn from a miss whether somebody else uploaded it (EXTENSIONS §6). The
same bytes uploaded by two identities are stored twice. Every server sharing the directory
and every unsandboxed program of the server's user can read the files directly.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import secrets
import stat
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from kcoral_server.storage.fair_eviction import fair_victims

LAYOUT_VERSION = "v1"
TMP_PREFIX = ".tmp-"
SCOPE_PREFIX = "id-"
DEFAULT_SCOPE = "default"  # stored in the original layout, straight under v1/
_SHA256 = re.compile(r"[0-9a-f]{64}", re.ASCII)
# An identity name (kcoral_server.front_door.callers): never "", "." or "..", never a "/".
_SCOPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}", re.ASCII)


class DiskCache:
    """``DiskCache(path, capacity_mbytes)``; disabled by ``path=None`` or capacity 0."""

    def __init__(self, path: Path | None, capacity_mbytes: int) -> None:
        self.capacity_bytes = max(0, int(capacity_mbytes)) * 1024 * 1024
        self.root = None if path is None else Path(path)
        self.enabled = self.root is not None and self.capacity_bytes > 0
        self.errors = 0  # storage errors swallowed so far (for diagnostics)
        self.last_error = ""  # the last of them, in words (``start_problem``)
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

    def path_for(self, sha256: str, scope: str = DEFAULT_SCOPE) -> Path:
        assert self.root is not None
        base = self.root / LAYOUT_VERSION
        if scope != DEFAULT_SCOPE:
            base = base / f"{SCOPE_PREFIX}{scope}"
        return base / sha256[:2] / sha256

    def _usable(self, sha256: object, scope: object) -> bool:
        return (
            self.enabled
            and isinstance(sha256, str)
            and _SHA256.fullmatch(sha256) is not None
            and isinstance(scope, str)
            and _SCOPE.fullmatch(scope) is not None
        )

    # ---------------------------------------------------------------- reads

    def get(self, sha256: str, scope: str = DEFAULT_SCOPE) -> bytes | None:
        """``scope``'s verified blob, or ``None`` (miss, disabled, corrupt or unreadable)."""
        if not self._usable(sha256, scope):
            return None
        try:
            return self._read(sha256, scope)
        except Exception:  # a cache must never fail a request
            self.errors += 1
            return None

    def _read(self, sha256: str, scope: str) -> bytes | None:
        path = self.path_for(sha256, scope)
        try:
            # O_NONBLOCK: opening a named pipe planted here must not wait for a writer.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError:
            self.errors += 1
            return None
        try:
            with os.fdopen(fd, "rb") as file:
                info = os.fstat(file.fileno())
                # Only a regular file within the budget can be ours: a pipe or device
                # would block the read, a huge (sparse) file would be read into memory.
                if not stat.S_ISREG(info.st_mode) or info.st_size > self.capacity_bytes:
                    self.errors += 1
                    return None
                data = file.read()
                inode = info.st_ino
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
        """Cheap presence check in the ``default`` scope (no hash verification)."""
        return self.contains(sha256, DEFAULT_SCOPE)

    def contains(self, sha256: object, scope: str) -> bool:
        """Cheap presence check in ``scope`` (no hash verification)."""
        if not self._usable(sha256, scope):
            return False
        try:
            return self.path_for(sha256, scope).is_file()  # type: ignore[arg-type]
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

    def put_many(self, items: Mapping[str, Any], scope: str = DEFAULT_SCOPE) -> None:
        """Store blobs keyed by their (already verified) SHA-256 in ``scope``, then evict to
        the budget.

        Blobs larger than the whole budget and malformed keys are skipped. Never raises.
        """
        if not self.enabled or not self._usable("0" * 64, scope):
            return
        try:
            self._store(items, scope)
        except Exception:  # a cache must never fail a request
            self.errors += 1

    def _store(self, items: Mapping[str, Any], scope: str) -> None:
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
                self._write(sha256, data, scope)
            self._evict()

    def _write(self, sha256: str, data: Any, scope: str) -> None:
        path = self.path_for(sha256, scope)
        try:
            # lstat: anything else at the path (a planted link) is replaced, not refreshed.
            if _is_regular_file(path):
                os.utime(path)  # already stored: just refresh
                return
            if scope != DEFAULT_SCOPE:  # (mkdir's parents=True would ignore the mode)
                path.parent.parent.mkdir(mode=0o700, exist_ok=True)
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
        except OSError as exc:
            self._ready = False
            self.errors += 1
            self.last_error = exc.strerror or type(exc).__name__
            return None

    def _shards(self) -> Iterator[os.DirEntry[str]]:
        """Every entry of every shard directory, of every scope."""
        base = self.base
        assert base is not None
        with os.scandir(base) as entries:
            top = [e for e in entries if e.is_dir(follow_symlinks=False)]
        shards = [e for e in top if len(e.name) == 2]
        for scope in top:
            if scope.name.startswith(SCOPE_PREFIX):
                try:
                    with os.scandir(scope.path) as entries:
                        shards.extend(
                            e
                            for e in entries
                            if len(e.name) == 2 and e.is_dir(follow_symlinks=False)
                        )
                except OSError:
                    self.errors += 1
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
        """Delete the oldest files (by mtime) of the identity holding the most bytes until
        the total fits the budget."""
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
        # Oldest first, but from the identity holding the most (``fair_victims``): another
        # token holder's uploads flush its own files, not everyone's oldest. A file that
        # cannot be removed stays, so the next victims are chosen again around it.
        budget = self.capacity_bytes
        for _round in range(3):
            victims = fair_victims(files, budget, owner=_file_scope, size=lambda file: file[3])
            stuck = 0
            for _, _, path, size in victims:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                except OSError:
                    self.errors += 1
                    stuck += size
            if not stuck:
                return
            chosen = set(victims)
            files = [file for file in files if file not in chosen]
            budget -= stuck


def _file_scope(file: tuple[int, str, str, int]) -> str:
    """Whose a cached file is: the ``id-<identity>`` directory above its shard, or ``v1``
    itself for the ``default`` identity."""
    return os.path.basename(os.path.dirname(os.path.dirname(file[2])))


def _is_regular_file(path: Path) -> bool:
    """Whether ``path`` itself (not what a link there points to) is a regular file."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def start_problem(cache: DiskCache) -> tuple[str, str] | None:
    """What the server says at start about this cache (SERVER §10), or None: the event
    (``disk_cache_unusable``: every file upload is sent in full each time, or
    ``disk_cache_open``: a local user other than the server's may plant entries) and
    its message. The hash check keeps planted bytes from being served either way; this
    only makes the operator hear of it (a cache that never worked said nothing)."""
    if not cache.enabled:
        return None
    assert cache.root is not None and cache.base is not None
    if not cache._ready:
        reason = cache.last_error or "unknown error"
        return (
            "disk_cache_unusable",
            f"cannot use {cache.root}: {reason}; uploads are not cached",
        )
    for folder in (cache.root, cache.base):
        try:
            info = os.stat(folder)
        except OSError:
            continue
        if info.st_uid not in (os.geteuid(), 0):
            return (
                "disk_cache_open",
                f"{folder} is owned by uid {info.st_uid}, not this server's user",
            )
        sticky = bool(info.st_mode & stat.S_ISVTX)
        if info.st_mode & 0o022 and not (sticky and folder == cache.root):
            mode = stat.S_IMODE(info.st_mode)
            return (
                "disk_cache_open",
                f"{folder} has mode {mode:04o}: others can write it, and plant entries: "
                "chmod 700 it",
            )
    return None
