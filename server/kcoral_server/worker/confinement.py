"""Worker-side parts of the sandbox and of the per-worker limits.

* ``clear_workspace``: a sandboxed worker keeps one workspace (``/work``) for its whole life,
  so it empties it between programs (SERVER §14); the runtime state under ``.kcoral/``
  survives except its scratch directories (``tmp``, ``shm``).
* ``empty_private_tmp``: the sandbox's ``/tmp``, ``/var/tmp`` and ``/dev/shm`` are private
  tmpfs that the front-end cannot empty from outside; a new worker empties them itself,
  before anything of a program runs (and again between programs), keeping only the
  read-only binds that live there (an install under ``/tmp``).
* ``limit_note``: turns an exception caused by a per-worker limit into a message that says
  so (``MemoryError`` under the memory rlimit, ``EAGAIN`` from ``fork`` at ``pids.max``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Mapping

from kcoral_server.processes.limits import memory_limit, process_limit
from kcoral_server.processes.sandbox import PRIVATE_TMP_ENV, SCRATCH_STATE_DIRS, STATE_DIRS
from kcoral_server.storage.trees import remove_tree

STATE_DIR = ".kcoral"


def _remove(path: str) -> None:
    # iterative, never following links, never raising: a program's tree of any depth or
    # permissions (``storage.trees``; shutil.rmtree's recursion was audit F1)
    remove_tree(path)


def _empty(directory: str) -> bool:
    """Remove everything in ``directory``; False when it was already empty (True also when
    it cannot be listed: a program took its permissions away, and the check must see it)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return False  # made again by the caller
    except OSError:
        return True
    for name in names:
        _remove(os.path.join(directory, name))
    return bool(names)


def clear_workspace(root: str) -> bool:
    """Empty the sandbox workspace ``root`` for the next program; True when it is clean,
    False (never an exception) when it is not: the caller then discards the directory.

    Runs after every program of a reused sandboxed worker, so the usual case (a program
    that left nothing) is one scan of the workspace, of ``.kcoral`` and of its scratch
    directories, each of which shows it clean; only what was removed is scanned again
    (issue 31: the earlier ``makedirs`` per state directory and second listing were most of
    the sandbox's worker CPU per request). Who reaches it: the front-end before a seat's
    next worker, and a reused worker after each program, on whatever tree the last program
    (of any token holder) left."""
    try:
        return _clear_workspace(root)
    except Exception:  # e.g. MemoryError in a worker: unclean, never a stopped seat
        return False


def _clear_workspace(root: str) -> bool:
    with contextlib.suppress(OSError):
        os.chmod(root, 0o700)
    try:
        with os.scandir(root) as entries:
            strays = [
                entry.path
                for entry in entries
                if entry.name != STATE_DIR or not entry.is_dir(follow_symlinks=False)
            ]
    except OSError:
        return False
    for path in strays:  # a ``.kcoral`` that is a file or a link goes too
        _remove(path)
    removed = bool(strays)
    state = os.path.join(root, STATE_DIR)
    try:
        with os.scandir(state) as entries:
            present = {entry.name: entry.is_dir(follow_symlinks=False) for entry in entries}
    except OSError:
        present = {}
    for name in STATE_DIRS:
        if present.get(name) is False:  # a file or a link where a directory belongs
            _remove(os.path.join(state, name))
            del present[name]
        if name not in present:
            with contextlib.suppress(OSError):
                os.makedirs(os.path.join(state, name), mode=0o700, exist_ok=True)
    for name in SCRATCH_STATE_DIRS:
        removed = _empty(os.path.join(state, name)) or removed
    if not removed:
        return True
    try:
        leftovers = [name for name in os.listdir(root) if name != STATE_DIR]
        scratch = [os.listdir(os.path.join(state, name)) for name in SCRATCH_STATE_DIRS]
    except OSError:
        return False
    return not leftovers and not any(scratch)


def _empty_except(directory: str, keep: list[str]) -> None:
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            path = os.path.join(directory, name)
            if path in keep:
                continue  # a read-only bind (the install): nothing of a program's
            if any(k.startswith(path + os.sep) for k in keep):
                _empty_except(path, keep)  # a directory on the way to a bind
            else:
                _remove(path)


#: this process's private tmpfs roots and the binds in them, read once (``empty_private_tmp``)
_private_tmp: tuple[list[str], list[str]] | None = None


def _private_tmp_spec(environ: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """The sandbox's own tmpfs roots (a mount point there; never a host's directory) and the
    read-only binds inside them, from the launch environment."""
    raw = environ.get(PRIVATE_TMP_ENV)
    if not raw:
        return [], []
    try:
        spec = json.loads(raw)
        roots, keep = list(spec["roots"]), [str(k) for k in spec["keep"]]
    except (ValueError, KeyError, TypeError):
        return [], []
    mounted = [r for r in roots if r in ("/tmp", "/var/tmp", "/dev/shm") and os.path.ismount(r)]
    return mounted, keep


def empty_private_tmp(environ: Mapping[str, str] | None = None) -> None:
    """Empty the sandbox's private ``/tmp``, ``/var/tmp`` and ``/dev/shm`` for a new worker
    or program: every seat's workers share those tmpfs, what one program left there must
    not reach the next, and it holds memory charged to the seat's workers.

    The process's own roots are found once, at its start (``main`` calls this before any
    program): a program can change ``os.environ`` but not the mounts, and parsing and two
    ``lstat`` per root after every program was sandbox-only worker CPU (issue 31)."""
    global _private_tmp
    try:
        if environ is not None:
            roots, keep = _private_tmp_spec(environ)
        else:
            if _private_tmp is None:
                _private_tmp = _private_tmp_spec(os.environ)
            roots, keep = _private_tmp
        for root in roots:
            _empty_except(root, keep)
    except Exception:  # best effort: what stays is the seat's identity's own (§14)
        pass


def limit_note(exc: BaseException) -> str | None:
    """`` (…limit…)`` to append to the message of ``exc`` when a worker limit caused it."""
    if isinstance(exc, MemoryError):
        limit = memory_limit()
        if limit:
            return f"the worker memory limit of {limit} bytes (--worker-memory-limit-bytes) was hit"
    if isinstance(exc, OSError) and exc.errno == errno.EAGAIN:
        limit = process_limit()
        if limit:
            return (
                f"the worker process limit of {limit} processes (--worker-process-limit) "
                "may have been hit"
            )
    return None
