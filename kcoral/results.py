"""Outcome of a program: ``ProgramResult`` and returned files and folders (CLIENT_API.md §6–§7).

``save`` never follows a symlink in the destination's parent chain (every component is
opened with ``O_NOFOLLOW`` relative to the previous one) and publishes atomically: a hard
link from a private temporary when nothing may be overwritten, a rename otherwise.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from kcoral.notebook import html_of
from kcoral.protocol.nofollow import (
    CLOEXEC,
    DIRECTORY_FLAGS,
    DirectoryCursor,
    closing_fd,
    open_beneath,
)
from kcoral.protocol.output_order import interleave
from kcoral.protocol.paths import normalize_workspace_path

# O_PATH lets us walk through directories we may search but not list.
_DIR_WALK_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | CLOEXEC


@dataclass(repr=False)
class ProgramResult:
    """What one ``execute`` produced; instruction failures are data (``status == "FAILED"``)."""

    status: str
    request_id: str
    queue_ms: float
    elapsed_ms: float
    lease_wait_ms: float
    lease_held_ms: float
    results: dict[str, Any]
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    error: dict[str, Any] | None = None
    gpu_ids: tuple[int, ...] = field(default=())
    #: The node that ran it: the router's ``X-KCoral-Node`` answer header (None from a
    #: direct server, which names no node).
    node: str | None = None
    #: How ``stdout`` and ``stderr`` interleaved: the answer's ``output_order`` runs
    #: (EXTENSIONS §16), ``()`` where the server sent none; ``output_in_order`` applies it.
    output_order: tuple[tuple[int, int], ...] = ()

    @property
    def completed(self) -> bool:
        return self.status == "COMPLETED"

    def __getitem__(self, key: str) -> Any:
        return self.results[key]

    def output_in_order(self) -> list[tuple[str, str]]:
        """``("stdout" or "stderr", text)`` pieces in the order the program wrote them,
        as far as the server recorded it (EXTENSIONS §16); without a record, all of
        stdout, then all of stderr. Every character of both texts is in exactly one piece."""
        return interleave(self.stdout, self.stderr, self.output_order)

    def _repr_html_(self) -> str | None:
        return html_of(self)

    def __repr__(self) -> str:
        parts = [
            f"status={self.status!r}",
            f"request_id={self.request_id!r}",
            f"elapsed_ms={self.elapsed_ms:.1f}",
            f"results={list(self.results)!r}",
            f"stdout={_size_note(self.stdout, self.stdout_truncated)}",
            f"stderr={_size_note(self.stderr, self.stderr_truncated)}",
        ]
        if self.error is not None:
            parts.append(f"error={self.error.get('kind')}: {self.error.get('message')!r}")
        if self.gpu_ids:
            parts.append(f"gpu_ids={self.gpu_ids!r}")
        if self.node is not None:
            parts.append(f"node={self.node!r}")
        return f"ProgramResult({', '.join(parts)})"


def plural(count: int, one: str, many: str | None = None) -> str:
    """``1 file``, ``2 files`` (``many`` where an added s is wrong: ``directories``); a
    returned file's repr and the notebook's view read '1 bytes' and '1 directories'."""
    return f"{count} {one if count == 1 else (many or one + 's')}"


def _size_note(text: str, truncated: bool) -> str:
    return f"<{len(text)} chars{', truncated' if truncated else ''}>"


@dataclass(frozen=True, repr=False)
class ReturnedFile:
    """An in-memory snapshot of a returned file."""

    data: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.data, bytes):
            raise TypeError(f"ReturnedFile data must be bytes, not {type(self.data).__name__}")

    def _repr_html_(self) -> str | None:
        return html_of(self)

    def __repr__(self) -> str:
        return f"ReturnedFile(<{plural(len(self.data), 'byte')}>)"

    def read_bytes(self) -> bytes:
        return self.data

    def save(self, destination: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Write exactly ``destination`` (mode 0600) and return it as a ``Path``.

        ``overwrite=False``: ``FileExistsError`` if it exists. ``overwrite=True``: only a
        regular file may be replaced (``ValueError`` otherwise).
        """
        parent, name = _split_destination(destination)
        with _open_parent(parent) as parent_fd:
            existing = _lstat_at(name, parent_fd)
            if existing is not None:
                if not overwrite:
                    raise FileExistsError(f"{os.fspath(destination)!r} already exists")
                if not stat.S_ISREG(existing.st_mode):
                    raise ValueError(
                        f"{os.fspath(destination)!r} exists and is not a regular file; "
                        "only regular files are overwritten"
                    )
            temporary = _write_temporary(parent_fd, self.data)
            try:
                if overwrite:
                    os.rename(temporary, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
                else:
                    os.link(
                        temporary,
                        name,
                        src_dir_fd=parent_fd,
                        dst_dir_fd=parent_fd,
                        follow_symlinks=False,
                    )
            finally:
                _unlink_quietly(temporary, parent_fd)
        return Path(destination)


class ReturnedFolder:
    """An in-memory snapshot of a returned folder: files plus (possibly empty) directories."""

    __slots__ = ("_directories", "_files")

    def __init__(self, files: Mapping[str, ReturnedFile], directories: Iterable[str] = ()) -> None:
        if not isinstance(files, Mapping):
            raise TypeError(f"files must be a mapping, not {type(files).__name__}")
        if isinstance(directories, (str, bytes)):
            raise TypeError("directories must be an iterable of paths, not a single string")
        items = list(files.items())
        dirs = tuple(directories)
        for path, value in items:
            if not isinstance(value, ReturnedFile):
                raise TypeError(f"files[{path!r}] must be a ReturnedFile")
        _check_sorted_canonical([path for path, _ in items], "file")
        _check_sorted_canonical(list(dirs), "directory")
        dir_set = set(dirs)
        for path, _ in items:
            if path in dir_set:
                raise ValueError(f"{path!r} is both a file and a directory")
        for path in [*(path for path, _ in items), *dirs]:
            parent = path.rpartition("/")[0]
            if parent and parent not in dir_set:
                raise ValueError(f"parent directory {parent!r} of {path!r} is not listed")
        self._files: Mapping[str, ReturnedFile] = MappingProxyType(dict(items))
        self._directories: tuple[str, ...] = dirs

    @property
    def files(self) -> Mapping[str, ReturnedFile]:
        return self._files

    @property
    def directories(self) -> tuple[str, ...]:
        return self._directories

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReturnedFolder):
            return NotImplemented
        return dict(self._files) == dict(other._files) and self._directories == other._directories

    __hash__ = None  # type: ignore[assignment]

    def _repr_html_(self) -> str | None:
        return html_of(self)

    def __repr__(self) -> str:
        directories = plural(len(self._directories), "directory", "directories")
        return f"ReturnedFolder(<{plural(len(self._files), 'file')}, {directories}>)"

    def save(self, destination: str | os.PathLike[str]) -> Path:
        """Create ``destination`` (must not exist) with the folder's content.

        Directories get mode 0700, files 0600; on failure everything created is removed.
        A trailing ``/`` names the same folder (``"results/"`` creates ``results``).
        """
        text = os.fsdecode(os.fspath(destination))
        parent, name = _split_destination(text.rstrip("/") or text)
        with _open_parent(parent) as parent_fd:
            try:
                os.mkdir(name, 0o700, dir_fd=parent_fd)
            except FileExistsError:  # the system names only the last part ('File exists: x')
                raise FileExistsError(f"{text!r} already exists") from None
            try:
                self._fill(parent_fd, name)
            except BaseException:
                self._remove_created(parent_fd, name)
                raise
        return Path(destination)

    def _in_tree_order(self) -> list[tuple[list[str], str, ReturnedFile | None]]:
        """Every entry as ``(parent components, name, file or None for a directory)``, sorted
        by path: a directory before what it holds, and all it holds together, so a
        ``DirectoryCursor`` enters each directory once."""
        ordered = []
        for path in sorted([*self._files, *self._directories]):
            *parents, leaf = path.split("/")
            ordered.append((parents, leaf, self._files.get(path)))
        return ordered

    def _remove_created(self, parent_fd: int, name: str) -> None:
        """Remove what ``_fill`` made, by the manifest, deepest first (in reverse sorted order
        what a directory holds comes before it), then the root. Not ``shutil.rmtree``: it
        recursed once per level, and a tree over ~1000 levels deep raised RecursionError over
        the save's own error, leaving the tree behind."""
        try:
            root_fd = os.open(name, DIRECTORY_FLAGS, dir_fd=parent_fd)
        except OSError:
            return
        with closing_fd(root_fd), DirectoryCursor(root_fd) as cursor:
            for parents, leaf, returned in reversed(self._in_tree_order()):
                with suppress(OSError):  # not made yet, or already gone
                    dir_fd = cursor.move_to(parents)
                    if returned is None:
                        os.rmdir(leaf, dir_fd=dir_fd)
                    else:
                        os.unlink(leaf, dir_fd=dir_fd)
        with suppress(OSError):
            os.rmdir(name, dir_fd=parent_fd)

    def _fill(self, parent_fd: int, name: str) -> None:
        root_fd = os.open(name, DIRECTORY_FLAGS, dir_fd=parent_fd)
        with closing_fd(root_fd), DirectoryCursor(root_fd) as cursor:
            os.fchmod(root_fd, 0o700)  # mkdir's mode is filtered by the umask
            for parents, leaf, returned in self._in_tree_order():
                dir_fd = cursor.move_to(parents)
                if returned is None:
                    os.mkdir(leaf, 0o700, dir_fd=dir_fd)
                    # entered now, as what it holds comes next: one open for both
                    os.fchmod(cursor.move_to([*parents, leaf]), 0o700)
                    continue
                fd = os.open(leaf, _NEW_FILE_FLAGS, 0o600, dir_fd=dir_fd)
                with closing_fd(fd):
                    os.fchmod(fd, 0o600)
                    _write_all(fd, returned.data)


def _check_sorted_canonical(paths: list[str], what: str) -> None:
    previous: str | None = None
    for path in paths:
        if normalize_workspace_path(path) != path:
            raise ValueError(f"{what} path {path!r} is not in canonical form")
        if previous is not None and not previous < path:
            raise ValueError(f"{what} paths must be sorted and unique ({previous!r}, {path!r})")
        previous = path


def _split_destination(destination: str | os.PathLike[str]) -> tuple[str, str]:
    """``(parent, final name)``; ``ValueError`` for ``..`` or a missing final name."""
    text = os.fspath(destination)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if not isinstance(text, str) or not text:
        raise ValueError("destination must be a non-empty path")
    parts = text.split("/")
    if ".." in parts:
        raise ValueError(f"destination {text!r} must not contain a '..' component")
    name = parts[-1]
    if name in ("", "."):
        raise ValueError(f"destination {text!r} has no final file name")
    parent = "/".join(parts[:-1])
    if text.startswith("/") and not parent:
        parent = "/"
    return parent, name


@contextmanager
def _open_parent(parent: str) -> Iterator[int]:
    """Open ``parent`` component by component, refusing to follow any symlink."""
    start = "/" if parent.startswith("/") else "."
    components = [c for c in parent.split("/") if c not in ("", ".")]

    def refuse_link(parent_fd: int, name: str, index: int) -> None:
        # O_NOFOLLOW alone says "Not a directory: 'name'" of a link to a directory, which
        # the user sees is one; say what is refused (the open below still guarantees it).
        try:
            info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        except OSError:
            return  # the open reports it
        if stat.S_ISLNK(info.st_mode):
            shown = "/".join(components[: index + 1])
            shown = f"/{shown}" if start == "/" else shown
            raise NotADirectoryError(
                f"{shown!r} is a symbolic link: save follows no link in the destination's "
                "directories (save to the resolved path, os.path.realpath)"
            )

    with closing_fd(os.open(start, _DIR_WALK_FLAGS & ~os.O_NOFOLLOW)) as start_fd:
        try:
            walked = open_beneath(
                start_fd, components, flags=_DIR_WALK_FLAGS, before_each=refuse_link
            )
        except OSError as exc:
            if exc.errno is None:  # refuse_link's own message says it whole
                raise
            # the system names the component it failed at ('No such file or directory: x'):
            # the folder the caller wrote is what they can find and fix
            raise type(exc)(exc.errno, exc.strerror, parent) from None
        with closing_fd(walked) as fd:
            yield fd


def _lstat_at(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _write_temporary(dir_fd: int, data: bytes) -> str:
    while True:
        name = f".kcoral-{secrets.token_hex(12)}.tmp"
        try:
            fd = os.open(name, _NEW_FILE_FLAGS, 0o600, dir_fd=dir_fd)
        except FileExistsError:
            continue
        break
    try:
        os.fchmod(fd, 0o600)
        _write_all(fd, data)
    except BaseException:
        os.close(fd)
        _unlink_quietly(name, dir_fd)
        raise
    os.close(fd)
    return name


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _unlink_quietly(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
