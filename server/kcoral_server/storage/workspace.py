"""Per-request workspace and output capture files (SERVER.md §7, §9).

The front-end creates both and reads the capture files itself, so the output of a worker that
crashed or was killed is still available (for the response or the ``output_tail`` log field).
Capture files are bounded while the program runs (the front-end releases everything between
the stream's first ``limit + CAPTURE_MARGIN`` bytes and its last ``CAPTURE_TAIL_KEEP``) and
removed with the workspace: a program printing 200 MiB costs about its output limit on disk,
and nothing once its request ended. Who reaches this: the program (any code a caller runs),
which can also fill its workspace directly; the bound here is for what the server itself
keeps, not a quota.

Workspaces are named ``kcoral-program-<instance>-*``, and so are the other directories a
front-end makes in the temporary directory (``INSTANCE_DIR_PREFIXES``: a bubblewrap seat's
sandbox directory, the finished jobs' store); the front-end instance holds an ``flock`` on
``kcoral-instance-<instance>.lock`` next to them for its whole life. A front-end killed with
SIGKILL cannot remove them; the next one to start removes those of every instance whose lock
is free (or gone): provably stale, whatever pid namespace the dead one ran in. Legacy names
without an instance are never touched.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import errno
import fcntl
import os
import re
import secrets
import stat
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kcoral.protocol.output_order import Run
from kcoral_server.processes.output_order import runs_in_characters
from kcoral_server.storage.trees import remove_tree

OUTPUT_TAIL_BYTES = 4096
# What a capture file keeps while its program runs: the head the response returns (limit +
# 1 bytes decide ``*_truncated``) plus this margin, and the last bytes for ``output_tail``.
CAPTURE_MARGIN = 64 * 1024
CAPTURE_TAIL_KEEP = 2 * OUTPUT_TAIL_BYTES
# How often the front-end trims live capture files, and the least it releases at once.
CAPTURE_CHECK_SECONDS = 0.05
CAPTURE_TRIM_STEP = 256 * 1024
_BLOCK = 4096
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
PROGRAM_PREFIX = "kcoral-program-"
SANDBOX_PREFIX = "kcoral-sandbox-"  # a bubblewrap seat's host directory (processes.sandbox)
JOBS_PREFIX = "kcoral-jobs-"  # where finished jobs keep large bodies (jobs.spill)
OUTPUT_PREFIX = "kcoral-output-"  # capture files without a log directory (storage.event_log)
# A Jupyter kernel's embedded server folder (its log and ready file): the kernel holds its
# own instance lock, so a kernel killed with SIGKILL leaves a folder the next server removes.
LOCAL_SERVER_PREFIX = "kcoral-local-"
# Each is followed by the instance: a sandbox directory (a program's files, up to
# --workspace-limit-bytes), the job store (results), the capture folder of a killed
# front-end and a killed kernel's server folder were named without one, so no later start
# could tell them stale, and they stayed for good.
INSTANCE_DIR_PREFIXES = (
    PROGRAM_PREFIX,
    SANDBOX_PREFIX,
    JOBS_PREFIX,
    OUTPUT_PREFIX,
    LOCAL_SERVER_PREFIX,
)
LOCK_PREFIX = "kcoral-instance-"
LOCK_SUFFIX = ".lock"
_INSTANCE_DIR_NAME = re.compile(r"(kcoral-[a-z]+-)([0-9a-f]{12})-")
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


def instance_prefix(prefix: str, parent: str | os.PathLike[str] | None = None) -> str:
    """``prefix`` (one of ``INSTANCE_DIR_PREFIXES``) and this process's instance in
    ``parent`` (default: the temporary directory), whose lock it holds from now on: the
    start of a directory name that the next front-end removes once this one is gone."""
    parent = parent if parent is not None else tempfile.gettempdir()
    return f"{prefix}{_instance.token_in(os.fspath(parent))}-"


def remove_stale_workspaces(directory: str | os.PathLike | None = None) -> int:
    """Remove the workspaces, sandbox directories and job stores of front-ends that are gone
    (their instance lock is free or missing) from ``directory`` (default: the temporary
    directory); returns how many. The caller's own instance is registered first, so it is
    never taken for a dead one."""
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
    named = (_INSTANCE_DIR_NAME.match(name) for name in names)
    tokens = {m.group(2) for m in named if m and m.group(1) in INSTANCE_DIR_PREFIXES}
    orphaned = tokens - locks - {own}
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
    prefixes = tuple(f"{prefix}{token}-" for prefix in INSTANCE_DIR_PREFIXES)
    for name in names:
        path = Path(directory, name)
        if name.startswith(prefixes) and path.is_dir() and not path.is_symlink():
            remove_tree(path)  # iterative, never raising (storage.trees)
            removed += 1
    return removed


class _CappedFile:
    """One live capture file: keeps ``[0, head_end)`` and the last ``CAPTURE_TAIL_KEEP``
    bytes. The middle becomes a hole (the size, i.e. how much was written, stays true, so
    ``*_truncated`` and the tail read as before); where holes are not supported the file is
    cut back to ``head_end`` instead (the writers append, so they continue there)."""

    def __init__(self, path: str, fd: int, head_end: int) -> None:
        self.path = path
        self.fd = fd
        self.inode = os.fstat(fd).st_ino
        self.head_end = -(-head_end // _BLOCK) * _BLOCK
        self.released_to = self.head_end
        self.holes = True

    def trim(self) -> None:
        size = os.fstat(self.fd).st_size
        if self.holes:
            end = (size - CAPTURE_TAIL_KEEP) // _BLOCK * _BLOCK
            if end - self.released_to < CAPTURE_TRIM_STEP:
                return
            mode = _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE
            if _LIBC.fallocate(self.fd, mode, self.released_to, end - self.released_to) == 0:
                self.released_to = end
                return
            self.holes = False  # EOPNOTSUPP and friends: fall back to cutting
        if size - self.head_end >= CAPTURE_TRIM_STEP:
            os.ftruncate(self.fd, self.head_end)


class _CaptureGuard:
    """Trims every live capture file on the event loop every ``CAPTURE_CHECK_SECONDS``
    (only while there are any). The front-end does it, not the worker: a program holding
    the GIL in native code cannot stall it."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()  # ``discard`` may run in an executor thread
        self._files: dict[int, list[_CappedFile]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, key: int, files: list[_CappedFile]) -> None:
        with self._mutex:
            self._files[key] = files
        self._schedule()

    def discard(self, key: int) -> None:
        with self._mutex:
            files = self._files.pop(key, [])
            for capped in files:
                with contextlib.suppress(OSError):
                    os.close(capped.fd)

    def _schedule(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a unit test): nothing trims, the files are removed all the same
        if self._timer is not None and self._loop is loop and not self._timer.cancelled():
            return
        self._loop = loop
        self._timer = loop.call_later(CAPTURE_CHECK_SECONDS, self._tick)

    def _tick(self) -> None:
        self._timer = None
        with self._mutex:
            for files in self._files.values():
                for capped in files:
                    try:
                        capped.trim()
                    except OSError:
                        pass  # never fail a request over its capture's size
            busy = bool(self._files)
        if busy:
            self._schedule()


_guard = _CaptureGuard()


@dataclass(frozen=True)
class CapturedOutput:
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    #: runs ``(stream, end in characters)`` of the two texts (EXTENSIONS §16); empty when
    #: the program wrote to one stream only, or the worker sent no record
    order: tuple[tuple[int, int], ...] = ()


NO_OUTPUT = CapturedOutput("", "", False, False)


class Workspace:
    """A private ``kcoral-program-*`` directory plus the request's capture files.

    Made once per request on the event loop, so it keeps plain strings (``root``,
    ``stdout_file``, ``stderr_file``); the ``Path`` forms are built when asked for. A
    sandboxed program's workspace is its sandbox's ``/work`` instead: ``root`` is then None
    (no directory of the front-end's to make or delete)."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        stdout_path: str | os.PathLike[str] | None,
        stderr_path: str | os.PathLike[str] | None,
    ) -> None:
        self.root = None if path is None else os.fspath(path)
        self.stdout_file = None if stdout_path is None else os.fspath(stdout_path)
        self.stderr_file = None if stderr_path is None else os.fspath(stderr_path)
        self._capped: list[_CappedFile] = []  # open while the guard trims them

    @property
    def path(self) -> Path | None:
        return None if self.root is None else Path(self.root)

    @property
    def stdout_path(self) -> Path | None:
        return None if self.stdout_file is None else Path(self.stdout_file)

    @property
    def stderr_path(self) -> Path | None:
        return None if self.stderr_file is None else Path(self.stderr_file)

    @classmethod
    def create(
        cls,
        output_dir: str | os.PathLike | None,
        capture_name: str | None,
        output_limit: int | None = None,
        *,
        directory: bool = True,
    ) -> Workspace:
        """Make the workspace (mode 0700; not with ``directory=False``: a sandboxed program
        has its own) and, when ``capture_name`` is given, empty capture files
        ``<output_dir>/<capture_name>.out`` / ``.err`` (mode 0600). With ``output_limit``
        the files are trimmed to about that limit while the program runs."""
        parent = tempfile.gettempdir()
        root = _new_workspace_dir(parent) if directory else None
        stdout_file = stderr_file = None
        if capture_name is not None:
            capture_dir = os.fspath(output_dir) if output_dir is not None else parent
            stdout_file = os.path.join(capture_dir, f"{capture_name}.out")
            stderr_file = os.path.join(capture_dir, f"{capture_name}.err")
            try:
                _create_empty(stdout_file)
            except FileNotFoundError:  # the first request (or a removed output directory)
                os.makedirs(capture_dir, exist_ok=True)
                _create_empty(stdout_file)
            _create_empty(stderr_file)
        workspace = cls(root, stdout_file, stderr_file)
        if stdout_file is not None and stderr_file is not None and output_limit is not None:
            workspace._cap(output_limit)
        return workspace

    def _cap(self, output_limit: int) -> None:
        for path in (self.stdout_file, self.stderr_file):
            assert path is not None
            try:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
            except OSError:
                continue
            self._capped.append(_CappedFile(path, fd, output_limit + 1 + CAPTURE_MARGIN))
        _guard.add(id(self), self._capped)

    def read_output(self, limit: int, runs: Sequence[Run] = ()) -> CapturedOutput:
        """First ``limit`` bytes of each stream, UTF-8 with replacement (blocking: run it in
        the executor for big limits); ``runs``: the worker's order record in bytes, returned
        in characters of the two texts (EXTENSIONS §16)."""
        output = self.read_small_output(limit, None, runs)
        assert output is not None  # no size bound: always read
        return output

    def read_small_output(
        self, limit: int, at_most: int | None, runs: Sequence[Run] = ()
    ) -> CapturedOutput | None:
        """``read_output`` when both capture files together hold at most ``at_most`` bytes
        (cheap enough for the event loop; None: any size), else None."""
        if self.stdout_file is None or self.stderr_file is None or limit <= 0:
            return NO_OUTPUT
        fds: list[int] = []
        try:
            for path in (self.stdout_file, self.stderr_file):
                try:
                    fds.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
                except OSError:
                    fds.append(-1)  # a missing capture file reads as empty
            if at_most is not None and sum(os.fstat(fd).st_size for fd in fds if fd >= 0) > at_most:
                return None
            out, out_more = _read_head_fd(fds[0], limit)
            err, err_more = _read_head_fd(fds[1], limit)
            order = runs_in_characters(runs, out, err) if runs else ()
            return CapturedOutput(
                out.decode("utf-8", errors="replace"),
                err.decode("utf-8", errors="replace"),
                out_more,
                err_more,
                tuple(order),
            )
        finally:
            for fd in fds:
                if fd >= 0:
                    os.close(fd)

    def output_tail(self) -> dict[str, str] | None:
        """Last 4096 bytes of each stream, for the log after a timeout or crash."""
        if self.stdout_file is None:
            return None
        return {
            "stdout": _read_tail(self.stdout_file, OUTPUT_TAIL_BYTES),
            "stderr": _read_tail(self.stderr_file, OUTPUT_TAIL_BYTES),
        }

    def remove(self) -> None:
        """Remove the workspace and the capture files in every case (the log keeps only
        ``output_tail``)."""
        self.remove_capture()
        if self.root is not None:
            # a tree the program shaped (any depth, permissions taken away, links):
            # iterative and never raising (shutil.rmtree's recursion failed the request
            # with a 500 and left the directory, audit F1)
            remove_tree(self.root)

    def remove_capture(self) -> None:
        """Stop trimming and delete the capture files (two unlinks: fine on the event loop).
        A capped file is deleted only while its name still means this request's file."""
        _guard.discard(id(self))
        inodes = {capped.path: capped.inode for capped in self._capped}
        self._capped = []
        for path in (self.stdout_file, self.stderr_file):
            if path is None:
                continue
            with contextlib.suppress(OSError):
                if path in inodes and os.stat(path).st_ino != inodes[path]:
                    continue  # already another request's file of the same name
                os.unlink(path)

    def remove_if_empty(self) -> bool:
        """Remove the capture files, and the workspace when the program left it empty (one
        ``rmdir``, cheap enough for the event loop); False when it holds anything, then
        ``remove`` must run."""
        self.remove_capture()
        if self.root is None:
            return True
        try:
            os.rmdir(self.root)
        except FileNotFoundError:
            return True  # the program removed its own (empty) workspace
        except OSError:
            return False  # not empty, or made unremovable: the full walk handles it
        return True


def _new_workspace_dir(parent: str) -> str:
    """A new ``kcoral-program-*`` directory in ``parent``: ``mkdtemp`` without its
    generality (``mkdir`` never follows or reuses an existing name, so a random suffix and a
    retry on collision are all it takes)."""
    prefix = f"{parent}{os.sep}{instance_prefix(PROGRAM_PREFIX, parent)}"
    for _ in range(100):
        root = f"{prefix}{secrets.token_hex(5)}"  # unpredictable, like ``mkdtemp``
        try:
            os.mkdir(root, 0o700)
            return root
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused workspace name", prefix)


def _create_empty(path: str) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600))


def _read_head_fd(fd: int, limit: int) -> tuple[bytes, bool]:
    if fd < 0:
        return b"", False
    chunks = []
    wanted = limit + 1
    try:
        while wanted > 0:
            chunk = os.read(fd, min(wanted, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            wanted -= len(chunk)
    except OSError:
        return b"", False
    data = b"".join(chunks)
    return data[:limit], len(data) > limit


def _read_tail(path: str | None, count: int) -> str:
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
