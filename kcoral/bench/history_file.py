"""Opening the benchmark history file (EXTENSIONS §12.6) so that only the user's own plain
file is read and appended to.

Who can reach what: the file sits beside the notebook, often in a shared folder (a group
project, ``/tmp``). Another user there can put a symbolic link in its place (the magic would
append JSON to whatever it points at: the user's ``~/.bashrc``), a file of their own (its
lines would pose as the user's earlier runs and show a fake ``REGRESSION`` or speed-up), or
a FIFO (reading it would hang the kernel). So the file is opened without following a link
and without blocking, and used only when it is a regular file the user owns.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_FLAGS = (
    os.O_RDWR
    | os.O_APPEND
    | os.O_CREAT
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


def open_history(path: Path) -> int:
    """A descriptor of ``path`` for reading and appending (created when missing), or
    ``OSError`` saying why it is not the user's own plain file."""
    if path.is_symlink():
        raise OSError(errno.ELOOP, "it is a symbolic link, not a plain file of yours")
    try:
        fd = os.open(path, _FLAGS, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link put there after the check above
            raise OSError(errno.ELOOP, "it is a symbolic link, not a plain file of yours") from exc
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "it is not a plain file")
        if info.st_uid != os.geteuid():
            raise OSError(
                errno.EPERM,
                f"it belongs to another user (uid {info.st_uid}), whose lines could pose as "
                "your earlier runs",
            )
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_all(fd: int) -> bytes:
    """The whole file behind ``fd``, from its start."""
    chunks = []
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def append(fd: int, data: bytes) -> None:
    """``data`` at the end of the file (``O_APPEND``), all of it."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
