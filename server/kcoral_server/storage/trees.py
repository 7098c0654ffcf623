"""Removing and emptying directory trees that a program made (SERVER §7 workspaces, §14).

Who can reach what: a program of any token holder shapes these trees as it likes (its
request workspace without a sandbox, its seat's sandbox directory, the sandbox's private
``/tmp``): thousands of levels deep, directories without permissions, symlinks to anything,
names that are not UTF-8. ``shutil.rmtree`` recurses once per level: a 1500-level tree
raised ``RecursionError`` in the front-end, which escaped the seat's spare start and left
the seat without a worker for good, every later request of every identity waiting (audit
F1). So the walk here:

* is iterative: the levels below the top are a list, not Python frames, and only one
  directory descriptor is open at a time (climbing back through ``..``, whose device and
  inode must be the ones recorded on the way down, else the walk stops: the tree was moved);
* never follows a symlink (entries are judged by ``lstat``; directories are opened with
  ``O_NOFOLLOW`` and must be the inode that ``lstat`` saw);
* stays on the tree's filesystem (a directory of another device is left alone);
* gives the owner back the permissions a program took away (``chmod`` through an
  ``O_PATH`` descriptor, never a path that could be swapped for a link);
* never raises: it says whether everything went.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["empty_tree", "remove_tree"]

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_ONLY = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OWNER_ALL = stat.S_IRWXU


def remove_tree(path: str | os.PathLike) -> bool:
    """Remove ``path`` (a file, a link or a directory tree; never what a link points to).
    True when it is gone (or never was)."""
    parent, name = os.path.split(os.path.abspath(path))
    try:
        parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        return _remove_at(parent_fd, name)
    except Exception:  # MemoryError in a worker under its limit, among others: say so
        return False
    finally:
        os.close(parent_fd)


def empty_tree(path: str | os.PathLike) -> bool:
    """Remove everything in the directory ``path`` (kept itself; not followed when it is a
    link). True when it is empty now."""
    try:
        fd = _open_directory(None, os.fspath(path))
    except OSError:
        return False
    try:
        _writable(fd)
        return _empty_open(fd)
    except Exception:
        return False
    finally:
        os.close(fd)


def _remove_at(parent_fd: int, name: str) -> bool:
    try:
        device = os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_dev
    except FileNotFoundError:
        return True
    entered = _take(parent_fd, name, device)
    if entered is None:
        return True
    if entered is False:
        return False
    try:
        complete = _empty_open(entered)
    finally:
        os.close(entered)
    return _rmdir(parent_fd, name) and complete


def _take(fd: int, name: str, device: int) -> int | bool | None:
    """Remove the entry ``name`` of the directory open as ``fd`` when that takes one call
    (a file, a link, an empty directory): None. A directory to empty first: its open
    descriptor. False: it cannot go (another filesystem, a mount point, ...)."""
    try:
        seen = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError:
        return False
    if not stat.S_ISDIR(seen.st_mode):
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            return None
        except OSError:
            return False
        return None
    try:
        os.rmdir(name, dir_fd=fd)
        return None
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.EACCES, errno.EPERM):
            return False  # EBUSY (a mount point), EROFS, ...
    if seen.st_dev != device:
        return False  # another filesystem mounted below: not ours to empty
    try:
        child = _open_directory(fd, name)
    except OSError:
        return False
    try:
        opened = os.fstat(child)
        if (opened.st_dev, opened.st_ino) != (seen.st_dev, seen.st_ino):
            raise OSError(errno.ESTALE, "replaced while it was removed")
        _writable(child, opened)
    except OSError:
        os.close(child)
        return False
    return child


def _open_directory(fd: int | None, name: str) -> int:
    try:
        return os.open(name, _DIRECTORY, dir_fd=fd)
    except PermissionError:
        pass  # a program took its owner's permissions away: given back without following
    path_fd = os.open(name, _PATH_ONLY, dir_fd=fd)
    try:
        os.chmod(f"/proc/self/fd/{path_fd}", _OWNER_ALL)
    finally:
        os.close(path_fd)
    return os.open(name, _DIRECTORY, dir_fd=fd)


def _writable(fd: int, info: os.stat_result | None = None) -> None:
    """Let the owner list, enter and change the open directory ``fd``."""
    mode = (info or os.fstat(fd)).st_mode
    if mode & _OWNER_ALL != _OWNER_ALL:
        os.fchmod(fd, stat.S_IMODE(mode) | _OWNER_ALL)


def _rmdir(fd: int, name: str) -> bool:
    try:
        os.rmdir(name, dir_fd=fd)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _listing(fd: int) -> list[str] | None:
    try:
        return os.listdir(fd)
    except OSError:
        return None


def _empty_open(top: int) -> bool:
    """Remove everything below the open directory ``top`` (its descriptor stays open and
    unmoved); True when all of it went."""
    complete = True
    device = os.fstat(top).st_dev
    fd = os.dup(top)
    names = _listing(fd)
    if names is None:
        os.close(fd)
        return False
    #: per level entered below ``top``: its name, its parent's names still to see, and the
    #: parent's (device, inode) that ``..`` must lead back to
    above: list[tuple[str, list[str], tuple[int, int]]] = []
    try:
        while True:
            if names:
                name = names.pop()
                entered = _take(fd, name, device)
                if entered is False:
                    complete = False
                elif entered is not None:
                    here = os.fstat(fd)
                    above.append((name, names, (here.st_dev, here.st_ino)))
                    os.close(fd)
                    fd = entered
                    listed = _listing(fd)
                    complete = complete and listed is not None
                    names = listed or []
                continue
            if not above:
                return complete
            name, names, expected = above.pop()
            parent = os.open("..", _DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = parent
            here = os.fstat(fd)
            if (here.st_dev, here.st_ino) != expected:
                return False  # the tree was moved while it was removed: stop here
            complete = _rmdir(fd, name) and complete
    except OSError:
        return False
    finally:
        os.close(fd)
