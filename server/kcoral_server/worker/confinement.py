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
import shutil
from collections.abc import Mapping

from kcoral_server.processes.limits import memory_limit, process_limit
from kcoral_server.processes.sandbox import PRIVATE_TMP_ENV, SCRATCH_STATE_DIRS, STATE_DIRS

STATE_DIR = ".kcoral"


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
        if os.path.lexists(path):  # a program may have taken its own permissions away
            for root, dirs, _files in os.walk(path):
                for name in dirs:
                    with contextlib.suppress(OSError):
                        os.chmod(os.path.join(root, name), 0o700)
            shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _empty(directory: str, keep: tuple[str, ...] = ()) -> None:
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(directory):
            if name not in keep:
                _remove(os.path.join(directory, name))


def clear_workspace(root: str) -> bool:
    """Empty the sandbox workspace ``root`` for the next program; True when it is clean."""
    with contextlib.suppress(OSError):
        os.chmod(root, 0o700)
    _empty(root, keep=(STATE_DIR,))
    state = os.path.join(root, STATE_DIR)
    if os.path.islink(state) or not os.path.isdir(state):
        _remove(state)
    for name in SCRATCH_STATE_DIRS:
        _empty(os.path.join(state, name))
    for name in STATE_DIRS:
        with contextlib.suppress(OSError):
            os.makedirs(os.path.join(state, name), mode=0o700, exist_ok=True)
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


def empty_private_tmp(environ: Mapping[str, str] | None = None) -> None:
    """Empty the sandbox's private ``/tmp``, ``/var/tmp`` and ``/dev/shm`` for a new worker
    or program: every seat's workers share those tmpfs, what one program left there must
    not reach the next, and it holds memory charged to the seat's workers."""
    raw = (os.environ if environ is None else environ).get(PRIVATE_TMP_ENV)
    if not raw:
        return
    try:
        spec = json.loads(raw)
        roots, keep = list(spec["roots"]), [str(k) for k in spec["keep"]]
    except (ValueError, KeyError, TypeError):
        return
    for root in roots:
        # Only the sandbox's own tmpfs (a mount point there); never a host's directory.
        if root in ("/tmp", "/var/tmp", "/dev/shm") and os.path.ismount(root):
            _empty_except(root, keep)


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
