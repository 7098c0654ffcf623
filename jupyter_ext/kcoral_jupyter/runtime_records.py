"""Small owner-only records in Jupyter's runtime directory, written by kernels and read by
the Jupyter server extension: the embedded servers kernels started, and which KCoral server
each kernel uses, so that the JupyterLab status bar can show the one of the notebook in focus.

Who can reach them: only this user. A record is written 0600 from its first byte (a
``mkstemp`` file renamed into place) in the runtime directory, which must be this user's
and not writable by others (else nothing is written); a reader skips records another user
owns and removes this user's records of processes that are gone (a kernel killed with
SIGKILL cannot withdraw its own). Records may hold a bearer token (the embedded
server's, or the user's own token for a server they connected to): the server extension
needs it to ask that server for its health and jobs on the panel's behalf.

No IPython import; works on every platform (owner checks only where the OS has them).
"""

from __future__ import annotations

import atexit
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

KERNEL_PREFIX = "kcoral-kernel-"


def runtime_dir() -> Path:
    """Jupyter's runtime directory (``JUPYTER_RUNTIME_DIR`` honoured)."""
    try:
        from jupyter_core.paths import jupyter_runtime_dir

        return Path(jupyter_runtime_dir())
    except ImportError:  # jupyter_core absent: the same default it would pick
        base = os.environ.get("JUPYTER_RUNTIME_DIR")
        return Path(base) if base else Path.home() / ".local/share/jupyter/runtime"


def _owned_by_someone_else(info: os.stat_result) -> bool:
    return hasattr(os, "getuid") and info.st_uid != os.getuid()


def private_runtime_dir() -> Path | None:
    """The runtime directory, created 0700 if missing; None when it is not private.

    A directory that another user owns or may write to could swap a record (or read it, if
    it is theirs): then nothing is written."""
    folder = runtime_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = folder.stat()
    if _owned_by_someone_else(info) or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return None
    return folder


def write_record(name: str, record: dict[str, Any]) -> Path | None:
    """Write ``record`` as ``name`` (0600, atomically); None when it cannot be written."""
    try:
        folder = private_runtime_dir()
        if folder is None:
            return None
        path = folder / name
        descriptor, temporary = tempfile.mkstemp(dir=folder, prefix=".kcoral-", suffix=".tmp")
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as file:
                json.dump(record, file)
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
        return path
    except OSError:
        return None  # a record is a convenience for the panel; the kernel works without it


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, but not ours to signal
    try:  # a zombie (exited, not yet reaped: an orphan under an init that is slow to) is gone
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True  # no /proc (not Linux): it answered the signal


def read_records(prefix: str, pid_key: str) -> list[dict[str, Any]]:
    """Records named ``prefix*.json`` of this user whose process ``record[pid_key]`` lives;
    the records of processes that are gone are removed."""
    found: list[dict[str, Any]] = []
    try:
        paths = sorted(runtime_dir().glob(f"{prefix}*.json"))
    except OSError:
        return found
    for path in paths:
        try:
            if _owned_by_someone_else(path.stat()):
                continue  # not written by one of this user's kernels
            record = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(record, dict):
                continue
            if not _alive(int(record[pid_key])):
                # Its process is gone without withdrawing it (a kernel killed with SIGKILL):
                # removed, or it stayed for good, with the token it holds.
                path.unlink(missing_ok=True)
                continue
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(record.get("url"), str):
            found.append(record)
    return found


def current_kernel_id() -> str | None:
    """The Jupyter kernel id of this process (from its connection file), else None."""
    try:
        from ipykernel.connect import get_connection_file

        name = Path(get_connection_file()).name
    except Exception:  # not an ipykernel (a plain IPython shell, a script)
        return None
    if name.startswith("kernel-") and name.endswith(".json"):
        return name[len("kernel-") : -len(".json")] or None
    return None


class KernelConnection:
    """This kernel's record of the KCoral server its cells use (one file per kernel)."""

    def __init__(self, kernel_id: str | None = None) -> None:
        self.kernel_id = kernel_id if kernel_id is not None else current_kernel_id()
        self.path: Path | None = None
        self._exit_hook = False

    def announce(self, url: str, token: str, *, embedded: bool) -> None:
        """Say that this kernel's cells now go to ``url`` (rewritten on every change)."""
        if self.kernel_id is None:
            return
        record = {
            "kernel_id": self.kernel_id,
            "kernel_pid": os.getpid(),
            "url": url,
            "token": token,
            "embedded": embedded,
        }
        self.path = write_record(f"{KERNEL_PREFIX}{self.kernel_id}.json", record)
        if self.path is not None and not self._exit_hook:
            # The kernel's exit (a shutdown, a restart) withdraws it: one record a kernel
            # would otherwise stay behind, with its token, kernel after kernel.
            atexit.register(self.withdraw)
            self._exit_hook = True

    def withdraw(self) -> None:
        """This kernel uses no server (a failed connect, a stopped embedded server)."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.path = None


def kernel_connections() -> list[dict[str, Any]]:
    """The servers live kernels use: ``kernel_id``, ``url``, ``token``, ``embedded``."""
    return [
        record
        for record in read_records(KERNEL_PREFIX, "kernel_pid")
        if isinstance(record.get("kernel_id"), str)
    ]
