"""Reading local files and folders to upload them: ``Program.upload_folder`` and
``kcoral run --send`` (CLIENT_API.md §3.3, §11).

A folder is walked through directory descriptors (``DirectoryCursor``): every name is opened
relative to its directory with ``O_NOFOLLOW``, so no symlink is followed and the depth is not
bounded by the system's PATH_MAX (an absolute path over 4096 bytes made "File name too long"
of a folder whose every name was fine); the protocol's own path limits apply where the files
are uploaded. A file is opened with ``O_NONBLOCK`` and must then be the regular file that was
listed: an entry swapped for a FIFO after it was checked fails instead of hanging the client.

``hash_folder`` keeps no large file's bytes: each file is hashed as it is read, and its
``FileBlob`` reads it again, chunk by chunk, only while a request body is being sent, so a
4 GiB folder needs a few MiB of the client's memory, not 4 GiB (CLIENT_API §3.3). A small
file (``KEPT_FILE_BYTES``, within ``KEPT_TOTAL_BYTES`` in all) keeps the bytes it was
hashed from: opening, checking and hashing it a second time cost a folder of 200 files of
512 B 1.5 times the client CPU per upload (``benchmarks/upload_client_cpu.py``), and what
is sent is then exactly what was hashed (a snapshot, which no later change touches).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from kcoral.protocol.errors import ValidationError
from kcoral.protocol.multipart import PIECE_BYTES
from kcoral.protocol.nofollow import (
    CLOEXEC,
    DIRECTORY_FLAGS,
    DirectoryCursor,
    closing_fd,
    open_beneath,
)
from kcoral.protocol.paths import shown_path
from kcoral.protocol.utf8_text import as_its_bytes, is_utf8

_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | CLOEXEC
#: A file of at most this size keeps the bytes it was hashed from (sent from memory) ...
KEPT_FILE_BYTES = 64 << 10
#: ... while the files kept by one walk (``KeptBudget``) hold no more than this in all.
KEPT_TOTAL_BYTES = 8 << 20

T = TypeVar("T")


class LinkRefused(ValueError):
    """A symbolic link below a folder being read, refused: a link can point outside the
    folder (a program would send what the user never meant to). The message names the link,
    where it points and what to do instead, in the words of the caller's way of sending
    (``advice``: ``kcoral run --send`` has its own)."""

    def __init__(self, where: str, target: str | None) -> None:
        self.where = where
        self.target = target
        super().__init__(self.advice("upload", "by its own path"))

    def advice(self, verb: str, separately: str) -> str:
        """The message, ``verb`` being how the caller sends (``upload``), ``separately``
        how it sends one more thing (``by its own path``)."""
        to = "" if self.target is None else f" (to {self.target!r})"
        return (
            f"{self.where!r} is a symbolic link{to}; links are refused, as one could point "
            f"outside the folder: {verb} the folder without it, or what it points to "
            f"{separately}"
        )


@dataclass(frozen=True)
class LocalFile:
    """A regular file read from a folder: its ``/``-separated path in the folder, its bytes
    and its mode as listed."""

    path: str
    data: bytes
    mode: int


class SentFileChanged(ValueError):
    """A file of ``upload_folder`` that is no longer what was hashed when its bytes are
    sent (changed, replaced, removed, unreadable). The request is cut before its body is
    complete, so the server runs nothing; it never receives other bytes under the hash.

    ``file`` is its local path and ``reason`` what changed (``its bytes changed``), apart,
    so each caller words its own line (``kcoral run --send`` says "after kcoral run read
    it"); ``cause`` is ``upload_folder``'s line without its advice (a notebook cell gives
    its own)."""

    def __init__(self, file: str, reason: str) -> None:
        self.file = file
        self.reason = reason
        self.cause = f"{file!r} changed after upload_folder hashed it ({reason}); nothing was run"
        super().__init__(f"{self.cause}: upload the folder again, in a new Program")


class KeptBudget:
    """How many more bytes small files may keep (``KEPT_TOTAL_BYTES`` at first, read when
    made); one per folder walk or ``kcoral run``'s inputs."""

    def __init__(self) -> None:
        self.left = KEPT_TOTAL_BYTES

    def take(self, size: int) -> bool:
        """Whether a file of ``size`` bytes keeps them (they are then counted)."""
        if size > KEPT_FILE_BYTES or size > self.left:
            return False
        self.left -= size
        return True


@dataclass(frozen=True)
class FileBlob:
    """A regular file below a folder, hashed when listed, whose bytes stay in the file
    until a request sends them (``chunks``): the blob of one ``upload_folder`` file.

    ``path`` is its ``/``-separated path in the folder, ``shown`` its local path for
    messages; ``identity`` (device, inode) and ``signature`` (size, mtime, ctime) are the
    file's as it was hashed. ``kept`` is a small file's bytes as hashed, sent as they are
    (``KeptBudget``); None: read again as it is sent."""

    top: str
    components: tuple[str, ...]
    name: str
    path: str
    shown: str
    mode: int
    identity: tuple[int, int]
    signature: tuple[int, int, int]
    sha256: str
    kept: bytes | None = field(default=None, repr=False, compare=False)

    @property
    def size(self) -> int:
        return self.signature[0]

    def chunks(self) -> Iterator[bytes]:
        """The file's bytes, at most ``PIECE_BYTES`` at a time; ``SentFileChanged`` when
        they are not the ones hashed. The last chunk is held back until the whole file has
        been read and its hash checked, so a changed file never completes a body. Kept
        bytes are those hashed: they go as they are, whatever became of the file."""
        if self.kept is not None:
            if self.kept:
                yield self.kept
            return
        try:
            fd = self._reopen()
        except OSError as exc:
            raise self._changed(f"it cannot be read ({exc.strerror})") from None
        with closing_fd(fd):
            digest = hashlib.sha256()
            held = b""
            left = self.size
            try:
                before = os.fstat(fd)
                if _signature(before)[0] != self.size:
                    raise self._changed("its size changed")
                while left:
                    chunk = os.read(fd, min(left, PIECE_BYTES))
                    if not chunk:
                        raise self._changed("it was cut short")
                    digest.update(chunk)
                    left -= len(chunk)
                    if held:
                        yield held
                    held = chunk
                after = os.fstat(fd)
            except OSError as exc:
                raise self._changed(f"it cannot be read ({exc.strerror})") from None
            if _signature(before) != _signature(after) or digest.hexdigest() != self.sha256:
                raise self._changed("its bytes changed")
            if held:
                yield held

    def read(self) -> bytes:
        """The whole file, checked as ``chunks`` checks it."""
        if self.kept is not None:
            return self.kept
        return b"".join(self.chunks())

    def _reopen(self) -> int:
        """A descriptor of the file that was hashed (no link followed on the way)."""
        with closing_fd(os.open(self.top, DIRECTORY_FLAGS)) as top_fd:
            with closing_fd(open_beneath(top_fd, self.components)) as dir_fd:
                fd = os.open(self.name, _FILE_FLAGS, dir_fd=dir_fd)
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != self.identity:
            os.close(fd)
            raise self._changed("it was replaced by another file")
        return fd

    def _changed(self, why: str) -> SentFileChanged:
        return SentFileChanged(self.shown, why)


def hash_folder(
    folder: str | os.PathLike[str],
    *,
    skip: Collection[str] = (),
    check: Callable[[str, str], None] | None = None,
    budget: KeptBudget | None = None,
) -> list[FileBlob]:
    """``read_folder``'s files, in its order and with its refusals, each hashed as it is
    read and kept as a ``FileBlob``: only small files' bytes stay in memory, as much as
    ``budget`` (a fresh one when None) lets them."""
    # absolute: a relative folder is found again after the caller changed directory; joined,
    # never normalised: ``abspath`` folds ``link/..`` by text, where the walk followed the
    # link, so every send of ``upload_folder("link/../data")`` read another folder's file
    absolute = os.path.join(os.getcwd(), os.fsdecode(os.fspath(folder)))
    room = KeptBudget() if budget is None else budget

    def hashed(item: _Listed, top: str, where: str, dir_fd: int) -> FileBlob:
        components = tuple(item.components)
        return _hashed(absolute, components, item.name, item.entry, where, dir_fd, room)

    return _each_file(folder, skip, check, hashed)


def hash_file(path: str, listed: os.stat_result, budget: KeptBudget | None = None) -> FileBlob:
    """The regular file ``path`` (``listed`` its ``lstat``), hashed as ``read_regular`` reads
    it and kept as a ``FileBlob`` (``kcoral run --send FILE``), its ``path`` its name; its
    bytes stay in memory where it is small and ``budget`` (a fresh one when None) lets it."""
    # the folder holding it, its links resolved as opening the path resolves them (realpath
    # of the joined path: ``abspath`` would fold ``link/..`` by text, naming another folder)
    top = os.path.realpath(os.path.dirname(os.path.join(os.getcwd(), path)))
    with closing_fd(os.open(top, DIRECTORY_FLAGS)) as dir_fd:
        room = KeptBudget() if budget is None else budget
        return _hashed(top, (), os.path.basename(path), listed, path, dir_fd, room)


def _hashed(
    top: str,
    components: tuple[str, ...],
    name: str,
    listed: os.stat_result,
    shown: str,
    dir_fd: int,
    budget: KeptBudget,
) -> FileBlob:
    digest = hashlib.sha256()
    held: list[bytes] = []  # a small file's pieces (one, as a rule); none of a large one
    held_bytes = 0

    def consume(piece: bytes) -> None:
        nonlocal held_bytes
        digest.update(piece)
        held_bytes += len(piece)
        if held_bytes <= KEPT_FILE_BYTES:
            held.append(piece)
        else:
            held.clear()

    after = _read_listed(name, listed, shown, consume, dir_fd=dir_fd)
    # the size read (_read_listed checked it is the file's), not the size listed: the file
    # may have grown in between
    kept = b"".join(held) if held_bytes <= KEPT_FILE_BYTES and budget.take(held_bytes) else None
    return FileBlob(
        top=top,
        components=components,
        name=name,
        path="".join(f"{part}/" for part in components) + name,
        shown=shown,
        mode=listed.st_mode,
        identity=(after.st_dev, after.st_ino),
        signature=_signature(after),
        sha256=digest.hexdigest(),
        kept=kept,
    )


def read_folder(
    folder: str | os.PathLike[str],
    *,
    skip: Collection[str] = (),
    check: Callable[[str, str], None] | None = None,
) -> list[LocalFile]:
    """Every regular file below ``folder``, depth first with each directory's names sorted;
    entries named in ``skip`` are passed over at any depth. ``check(relative, local)`` sees
    each file's path in the folder and its local path before the file is read, and may
    refuse it by raising: a huge tree with one path the upload cannot carry fails there,
    not after reading every file.

    ``ValueError``: ``folder`` or an entry is a symlink or a special file, a directory is
    reached twice, or a file changes while read. ``OSError`` (its ``filename`` the local
    path): something is unreadable, ``folder`` is missing or not a directory.
    """

    def read(item: _Listed, top: str, where: str, dir_fd: int) -> LocalFile:
        data = read_regular(item.name, item.entry, where, dir_fd=dir_fd)
        prefix = "".join(f"{name}/" for name in item.components)
        return LocalFile(f"{prefix}{item.name}", data, item.entry.st_mode)

    return _each_file(folder, skip, check, read)


def _each_file(
    folder: str | os.PathLike[str],
    skip: Collection[str],
    check: Callable[[str, str], None] | None,
    take: Callable[[_Listed, str, str, int], T],
) -> list[T]:
    """``take(listed, top, local path, directory fd)`` of every regular file below
    ``folder``, as ``read_folder`` describes."""
    top = os.fsdecode(os.fspath(folder))
    info = os.lstat(top)
    if stat.S_ISLNK(info.st_mode):
        # it said only "'data' is a symbolic link; refused", where a data folder linked
        # from a bigger disk is common: the words now name the folder to pass instead
        target = os.fsdecode(os.readlink(top))
        real = os.path.realpath(top)
        if not os.path.isdir(real):  # a file, or nothing: "pass the folder" would be untrue
            raise ValueError(f"{top!r} is a symbolic link (to {target!r}), and not to a folder")
        raise ValueError(
            f"{top!r} is a symbolic link (to {target!r}), which is not followed: pass the "
            f"folder it points to, {real!r}"
        )
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", top)
    with closing_fd(os.open(top, DIRECTORY_FLAGS)) as root_fd, DirectoryCursor(root_fd) as cursor:
        return _walk(cursor, top, info, skip, check, take)


@dataclass(frozen=True)
class _Listed:
    """A regular file found by the listing pass, to be read by the second one."""

    components: list[str]  # its directory's names below the top
    directory: os.stat_result  # that directory as listed
    name: str
    entry: os.stat_result  # the file as listed


def _walk(
    cursor: DirectoryCursor,
    top: str,
    info: os.stat_result,
    skip: Collection[str],
    check: Callable[[str, str], None] | None,
    take: Callable[[_Listed, str, str, int], T],
) -> list[T]:
    """List the whole tree first (every refusal: special files, a directory reached twice,
    ``check``), then read the files in the same order: a tree refused for one entry fails
    before any file is read, not after reading gigabytes."""
    listed = _list_tree(cursor, top, info, skip, check)
    files: list[T] = []
    directory: list[str] | None = None
    for item in listed:
        prefix = "".join(f"{name}/" for name in item.components)
        where = f"{top}/{prefix}{item.name}"
        try:
            dir_fd = cursor.move_to(item.components)
            if item.components != directory:  # each directory checked once, not per file
                if not _same_file(os.fstat(dir_fd), item.directory):
                    shown = f"{top}/{prefix}".rstrip("/")
                    raise ValueError(f"{shown!r} changed while it was read")
                directory = item.components
        except OSError as exc:
            raise _located(exc, f"{top}/{prefix}".rstrip("/")) from None
        files.append(take(item, top, where, dir_fd))
    return files


def _list_tree(
    cursor: DirectoryCursor,
    top: str,
    info: os.stat_result,
    skip: Collection[str],
    check: Callable[[str, str], None] | None,
) -> list[_Listed]:
    found: list[_Listed] = []
    visited = {(info.st_dev, info.st_ino)}
    pending: list[tuple[list[str], os.stat_result]] = [([], info)]
    while pending:  # iterative: deep trees must not hit the recursion limit
        components, listed = pending.pop()
        prefix = "".join(f"{name}/" for name in components)
        shown = f"{top}/{prefix}".rstrip("/") if components else top
        try:
            dir_fd = cursor.move_to(components)
            if not _same_file(os.fstat(dir_fd), listed):
                raise ValueError(f"{shown!r} changed while it was read")
            names = sorted(os.listdir(dir_fd))
        except OSError as exc:
            raise _located(exc, shown) from None
        subdirectories = []
        for name in names:
            if name in skip:
                continue
            relative = f"{prefix}{name}"
            where = f"{top}/{relative}"
            try:
                entry = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError as exc:
                raise _located(exc, where) from None
            if stat.S_ISDIR(entry.st_mode):
                if (entry.st_dev, entry.st_ino) in visited:
                    raise ValueError(f"directory {where!r} is reached twice")
                visited.add((entry.st_dev, entry.st_ino))
                subdirectories.append(([*components, name], entry))
            elif stat.S_ISREG(entry.st_mode):
                if check is not None:
                    check(relative, where)
                found.append(_Listed(components, listed, name, entry))
            elif stat.S_ISLNK(entry.st_mode):
                raise LinkRefused(where, _link_target(name, dir_fd))
            else:
                raise ValueError(special_file_refused(where, entry.st_mode))
        pending.extend(reversed(subdirectories))  # popped from the end: sorted order
    return found


def read_regular(
    name: str, listed: os.stat_result, shown: str, *, dir_fd: int | None = None
) -> bytes:
    """The bytes of the regular file ``name`` (relative to ``dir_fd``) that was ``listed``.

    ``ValueError`` when it is no longer that file (a symlink, a FIFO, another file) or it
    changes (size, mtime, ctime) while read; ``OSError`` with ``filename`` ``shown``.
    """
    chunks: list[bytes] = []
    _read_listed(name, listed, shown, chunks.append, dir_fd=dir_fd)
    return b"".join(chunks)


def _read_listed(
    name: str,
    listed: os.stat_result,
    shown: str,
    consume: Callable[[bytes], object],
    *,
    dir_fd: int | None = None,
) -> os.stat_result:
    """Every byte of ``read_regular``'s file to ``consume``, chunk by chunk, with its checks;
    the file's status once read."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # became a symlink after it was listed
            raise ValueError(f"{shown!r} is a symbolic link; refused") from None
        raise _located(exc, shown) from None
    with closing_fd(fd):
        try:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode):
                kind = kind_of(opened.st_mode)
                raise ValueError(f"{shown!r} changed while it was read: it is now a {kind}")
            if not _same_file(opened, listed):
                raise ValueError(f"{shown!r} changed while it was read")
            size = 0
            while chunk := os.read(fd, PIECE_BYTES):
                consume(chunk)
                size += len(chunk)
            after = os.fstat(fd)
        except OSError as exc:
            raise _located(exc, shown) from None
    if _signature(opened) != _signature(after) or size != after.st_size:
        raise ValueError(f"{shown!r} changed while it was read")
    return after


def check_utf8_name(
    name: str, local: str, verb: Literal["upload", "send"], *, in_folder: bool = True
) -> None:
    """``ValidationError`` when ``name``, a file's path in what is sent, is not UTF-8, as
    workspace paths are: its local path ``local`` shown as its bytes (``'data/\\xff.bin'``;
    the surrogates Python decodes them to, ``'\\udcff'``, no listing shows) and what to do.
    ``upload_folder`` and ``kcoral run --send`` (``verb``) say it alike, before reading."""
    if is_utf8(name):
        return
    done = {"upload": "uploaded", "send": "sent"}[verb]
    leave_out = f", or {verb} the folder without it" if in_folder else ""
    raise ValidationError(
        f"'{shown_path(as_its_bytes(local))}' cannot be {done}: its name is not UTF-8, as "
        f"workspace paths are: rename it{leave_out}"
    )


def special_file_refused(local: str, mode: int) -> str:
    """Why an entry that is neither a regular file, a folder nor a link is not read, for
    ``upload_folder`` and ``kcoral run --send`` alike (they read 'is a FIFO; refused' and
    'FIFO cannot be sent')."""
    return f"{local!r} is a {kind_of(mode)}; only regular files and folders are sent"


def kind_of(mode: int) -> str:
    """What an entry that is neither a regular file nor a directory is, in words."""
    if stat.S_ISLNK(mode):
        return "symbolic link"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device file"
    if stat.S_ISDIR(mode):
        return "directory"
    return "special file"


def _link_target(name: str, dir_fd: int) -> str | None:
    """Where the link ``name`` points (never followed), or None when it cannot be read."""
    try:
        return os.fsdecode(os.readlink(name, dir_fd=dir_fd))
    except OSError:
        return None


def _same_file(opened: os.stat_result, listed: os.stat_result) -> bool:
    return (opened.st_dev, opened.st_ino) == (listed.st_dev, listed.st_ino)


def _signature(info: os.stat_result) -> tuple[int, int, int]:
    return info.st_size, info.st_mtime_ns, info.st_ctime_ns


def _located(exc: OSError, shown: str) -> OSError:
    """``exc`` naming the local path: a relative name alone would not say which entry."""
    return OSError(exc.errno, exc.strerror, shown)
