"""Where finished jobs keep large results and event logs: a private directory on disk.

A finished job's answer can be as large as ``max_response_bytes`` (256 MiB) and its event log
as large as its output limit; kept in memory, two tiny jobs returning a lot held 400 MB of
the front-end for an hour. ``JobRegistry`` (``jobs.store``) keeps only small ones in memory and
writes the rest here: one directory per server process, created owner-only (0700) on first
use in the system temporary directory, one 0600 file per stored body, each removed when its
job is dropped and the whole directory at shutdown (after a SIGKILL, by the next server to
start: the directory's name carries the server's instance, ``storage.workspace``).

Who can reach what: through the API only the job's owner (or an admin identity) reaches a
job's files (``jobs.store`` decides). Other local users cannot open them (modes). A program the
server runs *without* a sandbox runs as the server's user and can read them, as it can read
anything that user can; under bubblewrap the temporary directory is not the program's.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Generator, Iterable
from pathlib import Path

from kcoral_server.storage.workspace import JOBS_PREFIX, instance_prefix

READ_CHUNK_BYTES = 1 << 20  # a stored body is streamed back in pieces of this size


class SpillFile:
    """One stored body: ``length`` bytes in an owner-only file."""

    def __init__(self, path: Path, length: int) -> None:
        self.path = path
        self.length = length

    def chunks(self, start: int = 0) -> Generator[bytes, None, None]:
        """The bytes from ``start`` on, ``READ_CHUNK_BYTES`` at a time (blocking reads).

        The file is opened once, so a job dropped while its result is being read (the file
        unlinked) still delivers every byte."""
        fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb", buffering=0) as file:
            file.seek(start)
            while True:
                data = file.read(READ_CHUNK_BYTES)
                if not data:
                    return
                yield data

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)


class SpillDirectory:
    """The private directory of one server's stored job bodies (created on first write)."""

    def __init__(self, parent: Path | None = None) -> None:
        self.parent = parent
        self.path: Path | None = None
        self.closed = False
        self._count = 0
        self._lock = threading.Lock()  # executor threads write concurrently

    def write(self, chunks: Iterable[bytes | memoryview]) -> SpillFile:
        """Write ``chunks`` to a new 0600 file (blocking: run it in the executor).

        ``OSError`` after ``close()``: a job finishing during shutdown must not leave a new
        directory behind."""
        with self._lock:
            if self.closed:
                raise OSError("the job spill directory is closed")
            if self.path is None or not self.path.is_dir():
                # mkdtemp creates the directory 0700 with an unguessable name; in the
                # temporary directory, the instance in it lets the next server remove it
                # when this one was killed (the next server looks nowhere else).
                prefix = JOBS_PREFIX
                if self.parent is None:
                    prefix = instance_prefix(JOBS_PREFIX, tempfile.gettempdir())
                self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=self.parent))
            self._count += 1
            path = self.path / f"{self._count:08d}"
        fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        length = 0
        try:
            with os.fdopen(fd, "wb") as file:
                for chunk in chunks:
                    length += file.write(chunk)
            with self._lock:
                if self.closed:
                    # ``close()`` ran meanwhile: its removal could not take this file (made
                    # or still open after it listed the directory), so the writer does.
                    raise OSError("the job spill directory was closed while writing")
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(path)
            if self.closed:
                with contextlib.suppress(OSError):  # the last writer out removes it
                    os.rmdir(path.parent)
            raise
        return SpillFile(path, length)

    def close(self) -> None:
        """Remove the directory and everything in it (shutdown)."""
        with self._lock:
            self.closed = True
            path, self.path = self.path, None
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)
