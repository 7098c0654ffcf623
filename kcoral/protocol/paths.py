"""Workspace path rules of PROTOCOL.md §5.5, shared by client and server."""

from __future__ import annotations

from collections.abc import Iterable

from kcoral.protocol.errors import ValidationError

MAX_COMPONENT_BYTES = 255
MAX_PATH_BYTES = 4096
#: a path in a message is cut to its first and last characters past this length
SHOWN_PATH_CHARS = 120


def shown_path(path: str) -> str:
    """``path`` for a message, the client's or the worker's: a deep one (up to 4096 bytes)
    keeps its start and its leaf, not kilobytes of ``a/a/a/…`` (files soak)."""
    if len(path) <= SHOWN_PATH_CHARS:
        return path
    half = SHOWN_PATH_CHARS // 2
    return f"{path[:half]}...{path[-half:]}"


def normalize_workspace_path(path: object) -> str:
    """Validate ``path`` and return its normalized form (``./a//b`` -> ``a/b``).

    Raises ``ValidationError`` naming the broken rule.
    """
    if not isinstance(path, str):
        raise ValidationError(f"path must be a string, not {type(path).__name__}")
    if not path:
        raise ValidationError("path must not be empty")
    if path.startswith("/"):
        raise ValidationError(f"path {path!r} must be relative")
    if "\x00" in path:
        raise ValidationError("path must not contain NUL")
    if "\\" in path:
        raise ValidationError(f"path {path!r} must not contain a backslash")
    parts = path.split("/")
    if ".." in parts:
        raise ValidationError(f"path {path!r} must not contain a '..' component")
    kept = [part for part in parts if part not in ("", ".")]
    if not kept:
        raise ValidationError(f"path {path!r} is empty after normalization")
    for part in kept:
        try:
            size = len(part.encode("utf-8"))
        except UnicodeEncodeError:
            raise ValidationError(f"path {path!r} is not valid UTF-8") from None
        if size > MAX_COMPONENT_BYTES:
            raise ValidationError(f"path component longer than {MAX_COMPONENT_BYTES} bytes")
    normalized = "/".join(kept)
    if len(normalized.encode("utf-8")) > MAX_PATH_BYTES:
        raise ValidationError(f"path longer than {MAX_PATH_BYTES} bytes")
    return normalized


def conflicting_paths(paths: list[str]) -> tuple[str, str] | None:
    """First pair of normalized paths that are equal or a file-vs-directory conflict: the
    first path (in order) below another one, with the shortest such one.

    Linear in the paths' bytes (after a sort): joining each path's every prefix took
    O(depth x length) per path, 40 s for 4000 files of a 2000-level folder. With ``/`` read
    as NUL (which no normalized path holds), everything below a path sorts right after it,
    so one pass over the sorted paths, keeping the chain of paths that hold the current
    one, finds for each path the outermost path above it."""
    seen: set[str] = set()
    for path in paths:
        if path in seen:
            return path, path
        seen.add(path)
    outermost: dict[str, str] = {}
    chain: list[str] = []  # sort keys, each below the one before it
    for key in sorted(path.replace("/", "\x00") for path in paths):
        while chain and not key.startswith(chain[-1] + "\x00"):
            chain.pop()
        if chain:
            outermost[key] = chain[0]
        chain.append(key)
    for path in paths:
        above = outermost.get(path.replace("/", "\x00"))
        if above is not None:
            return above.replace("\x00", "/"), path
    return None


class UploadedPaths:
    """The normalized file paths of a program's uploads so far, each new one checked against
    them (PROTOCOL §5.1: the same path, or a file where another needs a directory) in time of
    its own length: ``conflicting_paths`` over all of them at each ``upload_file`` made a
    loop of them quadratic (20,000 files took almost 4 minutes to add, an ``upload_folder``
    of them half a second)."""

    def __init__(self) -> None:
        self._files: set[str] = set()
        self._directories: dict[str, str] = {}  # each directory -> a file below it

    def conflict(self, paths: Iterable[str]) -> tuple[str, str] | None:
        """The first conflict of ``paths`` (in order) with those added and each other, as
        ``(path, path)`` for one twice or ``(file, path below it)``; None when they fit."""
        files: set[str] = set()
        directories: dict[str, str] = {}
        for path in paths:
            found = self._place(path, files, directories)
            if found is not None:
                return found
        return None

    def add(self, paths: Iterable[str]) -> None:
        """Add ``paths``, which ``conflict`` accepted."""
        for path in paths:
            self._place(path, self._files, self._directories)

    def _place(
        self, path: str, files: set[str], directories: dict[str, str]
    ) -> tuple[str, str] | None:
        """Record ``path`` in ``files``/``directories`` (those of ``self`` seen too), or the
        conflict it makes. A directory already known ends the walk up: its own directories
        are known, and a file is never one of them."""
        if path in files or path in self._files:
            return path, path
        below = directories.get(path) or self._directories.get(path)
        if below is not None:
            return path, below
        new_directories = []
        directory = path.rpartition("/")[0]
        while directory and directory not in directories and directory not in self._directories:
            if directory in files or directory in self._files:
                return directory, path
            new_directories.append(directory)
            directory = directory.rpartition("/")[0]
        files.add(path)
        for directory in new_directories:
            directories[directory] = path
        return None
