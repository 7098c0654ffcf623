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
from collections.abc import Callable, Iterable, Iterator

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
