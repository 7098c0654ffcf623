"""Files below one directory, reached through directory descriptors (``kcoral run``'s
worker side, CLIENT_API.md §11): ``TreeWriter`` writes the inputs and copies the outputs,
``entries`` walks a tree the tool made.

Part of the runner module ``kcoral run`` uploads (``kcoral.run.command.runner_source``), so
it stays plain: standard library only, nothing done at import time. Paths relative to an
open directory reach a tree deeper than PATH_MAX allows from '/' ('File name too long'), and
no symbolic link is followed below the top.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Callable, Iterator

DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: a directory on the way to a fetched path: a symlinked parent is followed, as a path would be
FOLLOWING_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class TreeWriter:
    """Writes files below one directory relative to directory descriptors. Absolute paths
    passed PATH_MAX for a tree the protocol allows (4096 bytes below the work directory,
    which has its own path) and failed with 'File name too long'. Only the directory
    written into is open, as a tree may be deeper than the open-files limit; a move opens
    only where the next file's parents differ, climbing through '..' (nothing else writes
    there meanwhile: inputs go in before the tool starts, outputs are copied once it ended)."""

    def __init__(self, directory: str, what: str = "inputs") -> None:
        self._fd = os.open(directory, DIRECTORY_FLAGS)
        self._names: list[str] = []  # the open directory's path below ``directory``
        self._what = what  # how a conflict is named

    def close(self) -> None:
        os.close(self._fd)

    def write(self, parts: list[str], data: memoryview, executable: bool) -> None:
        self._move_to(parts[:-1], parts)
        mode = 0o700 if executable else 0o600
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(parts[-1], flags, mode, dir_fd=self._fd)
        except FileExistsError:
            raise ValueError(f"{self._what}: path conflict at {'/'.join(parts)!r}") from None
        # Plain writes, not a file object: os.fdopen added an fstat, an ioctl and two
        # lseeks to each file, a third of the calls of a --send of many small files.
        try:
            while data:
                data = data[os.write(fd, data) :]
            os.fchmod(fd, mode)  # the umask must not strip the executable bit
        finally:
            os.close(fd)

    def make_directory(self, parts: list[str]) -> None:
        self._move_to(parts, parts)

    def set_mode(self, parts: list[str], executable: bool) -> None:
        """Give the existing file ``parts`` the mode ``write`` gives; nothing is created."""
        self._move_to(parts[:-1], parts, create=False)
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._fd)
        try:
            os.fchmod(fd, 0o700 if executable else 0o600)
        finally:
            os.close(fd)

    def copy_file(self, parts: list[str], source_fd: int) -> None:
        """Copy the open file ``source_fd`` (left open) to ``parts``, replacing a file."""
        self._move_to(parts[:-1], parts)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        with (
            os.fdopen(os.open(parts[-1], flags, 0o600, dir_fd=self._fd), "wb") as target,
            os.fdopen(source_fd, "rb", closefd=False) as source,
        ):
            shutil.copyfileobj(source, target)

    def _move_to(self, parents: list[str], parts: list[str], create: bool = True) -> None:
        shared = 0
        while shared < min(len(parents), len(self._names)):
            if parents[shared] != self._names[shared]:
                break
            shared += 1
        while len(self._names) > shared:
            self._enter(os.open("..", DIRECTORY_FLAGS, dir_fd=self._fd))
            self._names.pop()
        for name in parents[shared:]:
            if create:
                self._make_here(name, parts)
            self._enter(os.open(name, DIRECTORY_FLAGS, dir_fd=self._fd))
            self._names.append(name)

    def _make_here(self, name: str, parts: list[str]) -> None:
        try:
            os.mkdir(name, 0o700, dir_fd=self._fd)
        except FileExistsError:
            # only directories this writer made can exist here; anything else conflicts
            mode = os.stat(name, dir_fd=self._fd, follow_symlinks=False).st_mode
            if not stat.S_ISDIR(mode):
                raise ValueError(f"{self._what}: path conflict at {'/'.join(parts)!r}") from None

    def _enter(self, fd: int) -> None:
        os.close(self._fd)
        self._fd = fd


def enter_from(old: int, new: int) -> int:
    """Close the directory descriptor ``old`` and go on in ``new``."""
    os.close(old)
    return new


def entries(
    top: int,
    unreadable: Callable[[int, list[str], OSError], None],
    descend: Callable[[str], bool] = lambda name: True,
) -> Iterator[tuple[int, list[str], os.stat_result]]:
    """Each entry below the open directory ``top`` (symlinks not followed), a directory
    before what it holds: the open directory holding it (valid until the next entry), its
    path parts below ``top`` and its ``lstat``. Only the directory listed is open (a tree
    may be deeper than the open-files limit); the walk climbs back through '..', which
    must be the directory listed before (iterative: no recursion limit either).

    A directory that cannot be opened or listed is not yielded: ``unreadable`` gets the
    open directory holding it, its parts and the error (a tool's ``chmod 000`` directory
    raised a traceback or stopped the copy). A directory whose name ``descend`` refuses is
    yielded and not entered."""
    current = os.dup(top)
    try:
        info = os.fstat(current)
        listing = sorted(os.listdir(current), reverse=True)
        stack: list[tuple[tuple[int, int], list[str], list[str]]] = [
            ((info.st_dev, info.st_ino), [], listing)
        ]
        while stack:
            _identity, parts, names = stack[-1]
            if not names:
                stack.pop()
                if stack:
                    up = os.open("..", DIRECTORY_FLAGS, dir_fd=current)
                    current = enter_from(current, up)
                    info = os.fstat(current)
                    if (info.st_dev, info.st_ino) != stack[-1][0]:
                        raise OSError(errno.ESTALE, "a directory moved while it was copied")
                continue
            name = names.pop()
            entry = os.stat(name, dir_fd=current, follow_symlinks=False)
            if not stat.S_ISDIR(entry.st_mode) or not descend(name):
                yield current, [*parts, name], entry
                continue
            try:
                child = os.open(name, DIRECTORY_FLAGS, dir_fd=current)
            except OSError as exc:
                unreadable(current, [*parts, name], exc)
                continue
            try:
                info = os.fstat(child)
                listing = sorted(os.listdir(child), reverse=True)
            except OSError as exc:
                os.close(child)
                unreadable(current, [*parts, name], exc)
                continue
            yield current, [*parts, name], entry
            current = enter_from(current, child)
            stack.append(((info.st_dev, info.st_ino), [*parts, name], listing))
    finally:
        os.close(current)
