"""Per-request workspace and output capture files (SERVER.md §7, §9).

The front-end creates both and reads the capture files itself, so the output of a worker that
crashed or was killed is still available (for the response or the ``output_tail`` log field).

Workspaces are named ``kcoral-program-<instance>-*``; the front-end instance holds an
``flock`` on ``kcoral-instance-<instance>.lock`` next to them for its whole life. A front-end
killed with SIGKILL cannot remove its in-flight workspaces; the next one to start removes the
workspaces of every instance whose lock is free (or gone): provably stale, whatever pid
namespace the dead one ran in. Legacy names without an instance are never touched.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import re
import secrets
import shutil
import stat
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

OUTPUT_TAIL_BYTES = 4096
PROGRAM_PREFIX = "kcoral-program-"
LOCK_PREFIX = "kcoral-instance-"
LOCK_SUFFIX = ".lock"
_PROGRAM_NAME = re.compile(r"kcoral-program-([0-9a-f]{12})-")
_LOCK_NAME = re.compile(r"kcoral-instance-([0-9a-f]{12})\.lock")


class _Instance:
    """This process's instance token per temporary directory, and the locks that prove it
    alive."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self.held: dict[str, tuple[str, int]] = {}  # directory -> (token, locked fd)
        self.pid = os.getpid()

    def token_in(self, directory: str) -> str:
        with self._mutex:
            if self.pid != os.getpid():
                self.held = {}  # a forked child: the parent's locks are not its own
                self.pid = os.getpid()
            if directory in self.held:
                return self.held[directory][0]
            while True:
                token = secrets.token_hex(6)
                path = _lock_path(directory, token)
                try:
                    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                except FileExistsError:
                    continue
                fcntl.flock(fd, fcntl.LOCK_EX)
                # A cleaner may have taken the fresh file for a dead instance's between the
                # create and the flock (and unlinked it): then start over with a new token.
                try:
                    same = os.stat(path).st_ino == os.fstat(fd).st_ino
                except OSError:
                    same = False
                if same:
                    break
                os.close(fd)
            self.held[directory] = (token, fd)
            return token

    def release(self) -> None:
        """Remove the locks (at exit: every workspace of a clean front-end is gone)."""
        with self._mutex:
            if self.pid != os.getpid():
                return  # a forked child never touches its parent's locks
            for directory, (token, fd) in self.held.items():
                with contextlib.suppress(OSError):
                    os.unlink(_lock_path(directory, token))
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.held = {}


def _lock_path(directory: str, token: str) -> str:
    return os.path.join(directory, f"{LOCK_PREFIX}{token}{LOCK_SUFFIX}")


_instance = _Instance()
atexit.register(_instance.release)


def remove_stale_workspaces(directory: str | os.PathLike | None = None) -> int:
    """Remove the workspaces of front-ends that are gone (their instance lock is free or
    missing) from ``directory`` (default: the temporary directory); returns how many. The
    caller's own instance is registered first, so it is never taken for a dead one."""
    directory = os.fspath(directory) if directory is not None else tempfile.gettempdir()
    try:
        own = _instance.token_in(directory)
        names = os.listdir(directory)
    except OSError:
        return 0  # an unusable temporary directory fails its first request instead
    locks = {m.group(1) for m in map(_LOCK_NAME.fullmatch, names) if m}
    removed = 0
    for token in sorted(locks - {own}):
        removed += _remove_if_unlocked(directory, token, names)
    # A workspace whose lock is missing: its instance exited (it removes its lock last) or
    # a cleaner already found it dead (it removes the workspaces before the lock).
    orphaned = {m.group(1) for m in map(_PROGRAM_NAME.match, names) if m} - locks - {own}
    for token in sorted(orphaned):
        removed += _remove_workspaces(directory, token, names)
    return removed


def _remove_if_unlocked(directory: str, token: str, names: list[str]) -> int:
    path = _lock_path(directory, token)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return 0  # gone meanwhile, or another user's
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return 0  # held: that front-end is alive
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode) or (
                os.lstat(path).st_ino != os.fstat(fd).st_ino
            ):
                return 0
        except OSError:
            return 0
        removed = _remove_workspaces(directory, token, names)
        with contextlib.suppress(OSError):
            os.unlink(path)  # while holding the lock: nobody can be using it
        return removed
    finally:
        os.close(fd)


def _remove_workspaces(directory: str, token: str, names: list[str]) -> int:
    removed = 0
    prefix = f"{PROGRAM_PREFIX}{token}-"
    for name in names:
        path = Path(directory, name)
        if name.startswith(prefix) and path.is_dir() and not path.is_symlink():
            _remove_tree(path)
            removed += 1
    return removed


@dataclass(frozen=True)
class CapturedOutput:
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool


NO_OUTPUT = CapturedOutput("", "", False, False)


class Workspace:
    """A private ``kcoral-program-*`` directory plus the request's capture files."""

    def __init__(self, path: Path, stdout_path: Path | None, stderr_path: Path | None) -> None:
        self.path = path
        self.stdout_path = stdout_path
        self.stderr_path = stderr_path

    @classmethod
    def create(cls, output_dir: Path | None, capture_name: str | None) -> Workspace:
        """Make the workspace (mode 0700) and, when ``capture_name`` is given, empty capture
        files ``<output_dir>/<capture_name>.out`` / ``.err`` (mode 0600)."""
        parent = tempfile.gettempdir()
        token = _instance.token_in(parent)
        path = Path(tempfile.mkdtemp(prefix=f"{PROGRAM_PREFIX}{token}-", dir=parent))
        stdout_path = stderr_path = None
        if capture_name is not None:
            directory = Path(output_dir) if output_dir is not None else path.parent
            directory.mkdir(parents=True, exist_ok=True)
            stdout_path = directory / f"{capture_name}.out"
            stderr_path = directory / f"{capture_name}.err"
            for capture in (stdout_path, stderr_path):
                fd = os.open(capture, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.close(fd)
        return cls(path, stdout_path, stderr_path)

    def read_output(self, limit: int) -> CapturedOutput:
        """First ``limit`` bytes of each stream, UTF-8 with replacement (blocking: run it in
        the executor for big limits)."""
        if self.stdout_path is None or limit <= 0:
            return NO_OUTPUT
        out, out_more = _read_head(self.stdout_path, limit)
        err, err_more = _read_head(self.stderr_path, limit)
        return CapturedOutput(out, err, out_more, err_more)

    def output_tail(self) -> dict[str, str] | None:
        """Last 4096 bytes of each stream, for the log after a timeout or crash."""
        if self.stdout_path is None:
            return None
        return {
            "stdout": _read_tail(self.stdout_path, OUTPUT_TAIL_BYTES),
            "stderr": _read_tail(self.stderr_path, OUTPUT_TAIL_BYTES),
        }

    def output_size(self) -> int:
        """Bytes in the capture files so far (0 without capture)."""
        total = 0
        for path in (self.stdout_path, self.stderr_path):
            if path is not None:
                try:
                    total += os.stat(path).st_size
                except OSError:
                    pass
        return total

    def remove(self) -> None:
        """Remove the workspace in every case; capture files stay (they belong to the log)."""
        _remove_tree(self.path)


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    if path.exists():
        # A program may have removed its own permissions; restore them and retry.
        for root, dirs, _files in os.walk(path):
            for name in dirs:
                try:
                    os.chmod(os.path.join(root, name), 0o700)
                except OSError:
                    pass
        shutil.rmtree(path, ignore_errors=True)


def _read_head(path: Path | None, limit: int) -> tuple[str, bool]:
    if path is None:
        return "", False
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError:
        return "", False
    return data[:limit].decode("utf-8", errors="replace"), len(data) > limit


def _read_tail(path: Path | None, count: int) -> str:
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - count))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
