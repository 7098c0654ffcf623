"""Opening directories beneath a directory descriptor without following any symlink.

Both ends walk into a tree they must not be led out of: the client saving a returned folder
(``kcoral.results``) and the worker writing uploads and reading returns
(``kcoral_server.worker.files``). Each component is opened relative to the previous one with
``O_NOFOLLOW``, so a symlink planted anywhere on the way, or a later ``chdir``, cannot point the
walk elsewhere. It lives in ``kcoral.protocol`` because the worker already imports that package
and this module needs nothing but ``os``: ``import kcoral`` does not load it, and
``kcoral.results`` (which does) already imports ``kcoral.protocol``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator, Sequence

CLOEXEC = getattr(os, "O_CLOEXEC", 0)  # absent on Windows
DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | CLOEXEC


def open_beneath(
    dir_fd: int,
    components: Iterable[str],
    *,
    flags: int = DIRECTORY_FLAGS,
    create_mode: int | None = None,
    before_each: Callable[[int, str, int], None] | None = None,
) -> int:
    """A new descriptor of the directory reached from ``dir_fd`` through ``components``.

    ``dir_fd`` stays open and the caller closes the result. ``create_mode`` makes a missing
    component with that mode instead of failing; ``before_each(parent_fd, name, index)`` may
    inspect (and refuse) each component before it is opened. OSError propagates.
    """
    current = os.dup(dir_fd)
    try:
        for index, name in enumerate(components):
            if before_each is not None:
                before_each(current, name, index)
            try:
                child = os.open(name, flags, dir_fd=current)
            except FileNotFoundError:
                if create_mode is None:
                    raise
                os.mkdir(name, create_mode, dir_fd=current)
                child = os.open(name, flags, dir_fd=current)
            os.close(current)
            current = child
    except BaseException:
        os.close(current)
        raise
    return current


@contextlib.contextmanager
def closing_fd(fd: int) -> Iterator[int]:
    """``fd`` for the ``with`` block, closed after it whatever happens."""
    try:
        yield fd
    finally:
        os.close(fd)


class DirectoryCursor:
    """The open directory at one path beneath ``root_fd`` after another, for a walk that
    visits a tree in order (sorted paths: everything below a directory comes together).

    Each move opens only the components where the new path leaves the old one, each with
    ``O_NOFOLLOW`` relative to its parent; opening every level from the root for each entry
    made a 2000-level folder quadratic (11 s to save 200 files). Not every level stays open,
    so a deep tree cannot run out of descriptors: the deepest ``window`` levels and every
    ``window``-th level are kept (about ``depth / window + window``), and a level closed on
    the way down is opened again from the nearest kept one below it on the way back up. That
    costs at most one open per level climbed, so a walk's opens stay linear in its moves.
    ``root_fd`` stays open; ``close`` closes what the cursor opened. ``create_mode`` makes a
    missing directory with that mode instead of failing (the worker placing uploads).
    """

    def __init__(
        self,
        root_fd: int,
        *,
        flags: int = DIRECTORY_FLAGS,
        window: int = 32,
        create_mode: int | None = None,
    ) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        self._root = root_fd
        self._flags = flags
        self._window = window
        self._create_mode = create_mode
        self._names: list[str] = []
        self._fds: list[int | None] = []  # the open directory at each depth, None if let go

    def __enter__(self) -> DirectoryCursor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def move_to(self, components: Sequence[str]) -> int:
        """A descriptor of the directory at ``components`` below the root (``[]``: the root
        itself), owned by the cursor and valid until the next move. OSError propagates and
        leaves the cursor usable."""
        self._leave_below(self._shared_depth(components))
        for name in components[len(self._names) :]:
            child = self._open(name, self._current())
            self._names.append(name)
            self._fds.append(child)
            self._let_go_above_window()
        return self._current()

    def close(self) -> None:
        self._leave_below(0)

    def _shared_depth(self, components: Sequence[str]) -> int:
        """How many leading components the new path shares with the current one. Slices
        compare in C and the search halves, so a deep path costs a few comparisons rather
        than a Python loop over its levels."""
        names = self._names
        unequal = min(len(names), len(components))
        if list(components[:unequal]) == names[:unequal]:
            return unequal
        equal = 0  # invariant: the first ``equal`` components match, the first ``unequal`` not
        while unequal - equal > 1:
            middle = (equal + unequal) // 2
            if list(components[:middle]) == names[:middle]:
                equal = middle
            else:
                unequal = middle
        return equal

    def _leave_below(self, depth: int) -> None:
        while len(self._names) > depth:
            self._names.pop()
            fd = self._fds.pop()
            if fd is not None:
                os.close(fd)

    def _current(self) -> int:
        """The descriptor of the current directory, opened again if it was let go."""
        fds = self._fds
        first_closed, parent = len(fds), self._root
        while first_closed > 0:  # down to the nearest level still open (or the root)
            kept = fds[first_closed - 1]
            if kept is not None:
                parent = kept
                break
            first_closed -= 1
        for depth in range(first_closed, len(fds)):
            parent = self._open(self._names[depth], parent)
            fds[depth] = parent
        return parent

    def _open(self, name: str, parent: int) -> int:
        try:
            return os.open(name, self._flags, dir_fd=parent)
        except FileNotFoundError:
            if self._create_mode is None:
                raise
            os.mkdir(name, self._create_mode, dir_fd=parent)
            return os.open(name, self._flags, dir_fd=parent)

    def _let_go_above_window(self) -> None:
        depth = len(self._fds) - 1 - self._window
        fd = self._fds[depth] if depth >= 0 else None
        if fd is not None and (depth + 1) % self._window:  # every window-th level stays
            os.close(fd)
            self._fds[depth] = None
