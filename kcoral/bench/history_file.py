"""Opening the benchmark history file (EXTENSIONS §12.6) so that only the user's own plain
file is read and appended to.

Who can reach what: the file sits beside the notebook, often in a shared folder (a group
project, ``/tmp``). Another user there can put a symbolic link in its place (the magic would
append JSON to whatever it points at: the user's ``~/.bashrc``), a file of their own (its
lines would pose as the user's earlier runs and show a fake ``REGRESSION`` or speed-up), or
a FIFO (reading it would hang the kernel), or, where the system lets one link another
user's file (macOS; Linux without ``fs.protected_hardlinks``), a hard link to one of the
user's own files. So the file is opened without following a link and without blocking, and
used only when it is a regular file the user owns, with no other name.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path


def _flags() -> int:
    """Read, append, create; no link followed and no blocking where the system has them
    (Windows has neither, nor FIFOs; it needs ``O_BINARY``, or it writes ``\r\n``)."""
    optional = ("O_NOFOLLOW", "O_NONBLOCK", "O_CLOEXEC", "O_BINARY")
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT
    for name in optional:
        flags |= getattr(os, name, 0)
    return flags


def open_history(path: Path) -> int:
    """A descriptor of ``path`` for reading and appending (created when missing), or
    ``OSError`` saying why it is not the user's own plain file. The client runs on macOS
    and Windows too: what a system lacks (``geteuid``, ``O_NONBLOCK``) is not checked."""
    if path.is_symlink():
        raise OSError(errno.ELOOP, "it is a symbolic link, not a plain file of yours")
    try:
        fd = os.open(path, _flags(), 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link put there after the check above
            raise OSError(errno.ELOOP, "it is a symbolic link, not a plain file of yours") from exc
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "it is not a plain file")
        if info.st_nlink > 1:
            # A hard link is no link to refuse by name: where a neighbour may link another
            # user's file (macOS, Linux without fs.protected_hardlinks) it is e.g. the user's
            # ~/.zshrc, which a line holding a server's "$(...)" would then run.
            raise OSError(
                errno.EMLINK,
                f"it has {info.st_nlink} names (hard links), so it may be another file of yours",
            )
        geteuid = getattr(os, "geteuid", None)
        if geteuid is not None and info.st_uid != geteuid():
            raise OSError(
                errno.EPERM,
                f"it belongs to another user (uid {info.st_uid}), whose lines could pose as "
                "your earlier runs",
            )
        if hasattr(os, "O_NONBLOCK"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


#: How much of the file is read at a time, from its end.
CHUNK = 1 << 20


def lines_from_end(fd: int) -> Iterator[bytes]:
    """The file's lines, last first, read a chunk at a time from its end: the last run of a
    key is near the end, and a history of 20 000 runs (160 MB) took seconds a cell to read
    and parse whole."""
    position = os.fstat(fd).st_size
    # the pieces of the line being read, last piece first: joined once its start is found,
    # so a single long line costs one copy, not one per chunk
    pieces: list[bytes] = []
    while position > 0:
        size = min(CHUNK, position)
        position -= size
        parts = _read_at(fd, size, position).split(b"\n")
        if len(parts) > 1:
            yield b"".join([parts[-1], *reversed(pieces)])
            yield from reversed(parts[1:-1])
            pieces = []
        pieces.append(parts[0])
    yield b"".join(reversed(pieces))


def ends_a_line(fd: int) -> bool:
    """Whether the file is empty or ends with a newline (a write cut short leaves a partial
    line, which the next record must not be glued to)."""
    size = os.fstat(fd).st_size
    return size == 0 or _read_at(fd, 1, size - 1) == b"\n"


def _read_at(fd: int, size: int, offset: int) -> bytes:
    """``size`` bytes at ``offset`` (``os.pread``, which Windows lacks: a seek and reads)."""
    pread = getattr(os, "pread", None)
    if pread is not None:
        data: bytes = pread(fd, size, offset)
        return data
    os.lseek(fd, offset, os.SEEK_SET)
    chunks = []
    while size > 0 and (chunk := os.read(fd, size)):
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def append(fd: int, data: bytes) -> None:
    """``data`` at the end of the file (``O_APPEND``), all of it."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
