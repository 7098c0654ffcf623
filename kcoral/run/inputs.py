"""``kcoral run --send``: local files and directories read for upload (CLIENT_API.md §11)."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence

from kcoral.protocol.paths import conflicting_paths


class LocalFileError(Exception):
    """An input that cannot be sent or an output that cannot be saved (exit status 1)."""


def collect_inputs(paths: Sequence[str]) -> list[tuple[str, bytes, bool]]:
    """Read the ``--send`` files as ``(remote path, data, executable)``, sorted by path.

    A file goes under its base name, a directory under its own name with its layout;
    ``__pycache__`` entries and empty directories are skipped. Symlinks, special files, a
    directory reached twice, files changing while read and conflicting remote paths raise
    ``LocalFileError``.
    """
    files: dict[str, tuple[bytes, bool]] = {}
    for path in paths:
        name = os.path.basename(os.path.abspath(path))
        if not name:
            raise LocalFileError(f"--send {path!r}: cannot send the root directory")
        for remote, data, executable in _read_input(path, name):
            if not is_text(remote):
                raise LocalFileError(
                    f"--send: the name {remote!r} is not valid UTF-8 (names go as text)"
                )
            if remote in files:
                raise LocalFileError(f"--send: two inputs would both be sent as {remote!r}")
            files[remote] = (data, executable)
    names = sorted(files)
    # Not neighbours in sorted order: 'a-b' sorts between 'a' and 'a/c' ('-' < '/').
    conflict = conflicting_paths(names)
    if conflict is not None:
        raise LocalFileError(
            f"--send: {conflict[0]!r} is both a file and a directory in the inputs"
        )
    return [(name, *files[name]) for name in names]


def _read_input(path: str, name: str) -> list[tuple[str, bytes, bool]]:
    info = _lstat(path)
    if stat.S_ISREG(info.st_mode):
        return [(name, _read_file(path, info), bool(info.st_mode & stat.S_IXUSR))]
    if not stat.S_ISDIR(info.st_mode):
        raise LocalFileError(f"--send {path!r}: {_kind(info)} cannot be sent")
    result = []
    seen_dirs = {(info.st_dev, info.st_ino)}
    pending = [(path, name)]
    while pending:  # iterative: deep trees must not hit the recursion limit
        directory, remote_dir = pending.pop()
        try:
            entries = sorted(os.listdir(directory))
        except OSError as exc:
            raise LocalFileError(f"--send: cannot list {directory!r}: {exc.strerror}") from None
        for entry in entries:
            if entry == "__pycache__":
                continue
            local = os.path.join(directory, entry)
            remote = f"{remote_dir}/{entry}"
            entry_info = _lstat(local)
            if stat.S_ISDIR(entry_info.st_mode):
                key = (entry_info.st_dev, entry_info.st_ino)
                if key in seen_dirs:
                    raise LocalFileError(f"--send: directory {local!r} is reached twice")
                seen_dirs.add(key)
                pending.append((local, remote))
            elif stat.S_ISREG(entry_info.st_mode):
                executable = bool(entry_info.st_mode & stat.S_IXUSR)
                result.append((remote, _read_file(local, entry_info), executable))
            else:
                raise LocalFileError(f"--send: {local!r} is a {_kind(entry_info)}; refused")
    return result


def _lstat(path: str) -> os.stat_result:
    try:
        return os.lstat(path)
    except OSError as exc:
        raise LocalFileError(f"--send {path!r}: {exc.strerror}") from None


def _read_file(path: str, before: os.stat_result) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as handle:
            data = handle.read()
            after = os.fstat(handle.fileno())
    except OSError as exc:
        raise LocalFileError(f"--send: cannot read {path!r}: {exc.strerror}") from None
    changed = (before.st_size, before.st_mtime_ns, before.st_ino) != (
        after.st_size,
        after.st_mtime_ns,
        after.st_ino,
    )
    if changed or len(data) != after.st_size:
        raise LocalFileError(f"--send: {path!r} changed while it was read")
    return data


def _kind(info: os.stat_result) -> str:
    if stat.S_ISLNK(info.st_mode):
        return "symbolic link"
    if stat.S_ISFIFO(info.st_mode):
        return "FIFO"
    if stat.S_ISSOCK(info.st_mode):
        return "socket"
    if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode):
        return "device file"
    return "special file"


def is_text(word: str) -> bool:
    """Whether ``word`` encodes as UTF-8 (undecodable bytes of a command line or a file
    name arrive as lone surrogates, which the request cannot carry as text)."""
    try:
        word.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
