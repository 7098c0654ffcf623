"""A fork server for workers (SERVER §1): one preloaded process forks each new worker.

Spawning ``python -m kcoral_server.worker`` costs an interpreter start plus the worker's
imports (~1 s on a loaded machine); forking a process that already imported them costs
~25 ms. The launcher imports the worker modules and, when asked (``--preload torch``, the
server's ``--worker-preload``) and installed, torch with numpy, so a worker that touches a
tensor does not pay ``import torch`` (~1.2 s of CPU) either.

The fork rule (SERVER §1): the launcher forks only while it is single-threaded and CUDA is
not initialized, so a fork is as clean as a spawn. Before every fork it checks

* CUDA: ``torch.cuda.is_initialized()`` is False (the only ``torch.cuda`` function the
  launcher calls: it reads a flag and caches no device count). The child sets its own
  environment (``CUDA_VISIBLE_DEVICES`` included) before anything initializes CUDA, which
  a GPU worker does later, under its lease.
* Python threads: none but the main thread (``threading.enumerate()``).
* native threads: none but the main thread (``/proc/self/task``). numpy's bundled OpenBLAS
  starts its pool threads when it loads; OpenBLAS's own ``pthread_atfork`` handler would
  stop them during ``fork()``, but the launcher stops them itself right after the preload
  (``blas_thread_shutdown_``, the function that handler calls), so the rule holds literally
  at every instant the launcher forks. A worker's first BLAS call starts the pool again with
  the usual number of threads: workers' BLAS stays multi-threaded. torch's own pools start
  at its first parallel operation, which the launcher never runs.

A launcher that finds the rule broken refuses to fork: the front-end receives the reason
(``LauncherRefused``), the worker start fails with it in the event log and the request that
waited for the worker, and the remedy is ``--worker-preload none``. It never silently
falls back to a spawn, which would hide a launcher that forks unsafely.

The preload waits until the launcher has had no request for ``PRELOAD_IDLE_SECONDS``, or
``PRELOAD_LATEST_SECONDS`` after it started at the latest: the pool's first workers are
forked (and the server ready) as fast as without it, the import runs while the server
waits for its first request, and a fork request arriving during the import waits for it.
Workers forked before it import torch themselves, as they did without a preload. The
preload's own ``weakref.finalize`` callbacks are not run at a worker's exit (see
``keep_preload_finalizers_from_exit``).

Protocol on the launcher's ``AF_UNIX`` ``SOCK_SEQPACKET`` control socket: the front-end
sends ``{"env": {...}, "cgroups": [...]}`` (JSON) with the worker's socketpair end; the
launcher forks, the child moves itself into the listed ``cgroup.procs`` files before it runs
anything else (the per-worker limits, ``kcoral_server.processes.limits``), and the launcher
answers ``{"pid": N, "preloaded": [...]}`` with the read end of a status pipe, on which it
writes the child's exit code (``subprocess`` convention: ``-signal`` when killed) and the
number of orphans that survived ``SIGKILL`` once it reaped it; or ``{"error": "..."}``
(with ``"refused": true`` when the fork rule forbade the fork). Workers are children of
the launcher, not of the front-end, hence ``ForkedProcess`` instead of ``subprocess.Popen``.

Under bubblewrap each seat has its own launcher started *inside* that seat's sandbox
(``Launcher(wrap=SandboxDir.command)``), so a sandboxed worker is a fork too. Such a
launcher lives in a PID namespace and cannot see the front-end: it is not given
``--parent`` (bwrap's ``--die-with-parent`` ties it to the front-end instead), its pids are
translated to host pids by the front-end (``NSpid``), and its child waits for the front-end's
"go" (a pipe sent with the request) while the front-end moves it into its cgroups, which
the sandbox cannot reach.

Who can reach what: a *program* in a forked worker reads ``/proc/self/environ``, which is
the launcher's own start-up environment, not the worker's: the launcher is therefore started
with the scrubbed worker environment (no KCoral secret, no denied variable).

Lifetimes (SERVER §11): the launcher is a child subreaper, so whatever a dead worker left
running (``setsid`` daemons included) is re-parented to it; it kills those orphans at once
and reports a worker's exit code only once no orphan is left, so "exited" means "and its
descendants are gone". An orphan that outlives ``SIGKILL`` for ``orphan_kill_seconds()``
(uninterruptible sleep) is reported as a survivor: the front-end then cannot confirm the
clean-up and quarantines the worker's GPUs (SERVER §8, §11). It watches the front-end
through a pidfd and, when the front-end dies, kills every worker and exits; each worker
gets ``SIGKILL`` when the launcher dies (``PR_SET_PDEATHSIG``; the launcher is
single-threaded when it forks, see the fork rule, so that is exact). When the
front-end only closes the control socket the launcher forks nothing more and exits once its
last worker has.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import importlib.util
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from kcoral_server.processes.limits import enter_cgroups
from kcoral_server.processes.pidfd import open_pidfd
from kcoral_server.processes.procfs import children, is_alive, kill_process, namespace_pid
from kcoral_server.worker.reaper import become_subreaper, tie_to_parent

_STATUS = struct.Struct("<ii")  # exit code, orphans that survived SIGKILL
_MAX_MESSAGE = 1 << 20  # the environment travels in one datagram
REAP_WAIT_SECONDS = 0.05  # the most ``poll`` waits for the launcher to report an exit
ORPHAN_POLL_SECONDS = 0.01  # how often the launcher looks again while orphans are dying
STUCK_POLL_SECONDS = 0.5  # ... and once they have outlived ``orphan_kill_seconds()``
#: a worker's exit is reported after this even if an orphan refuses to die (D state)
ORPHAN_KILL_SECONDS = 10.0
#: overrides ``ORPHAN_KILL_SECONDS`` (tests shorten it); read by the front-end and, through
#: the inherited environment, by the launcher and the supervisors
ORPHAN_KILL_ENV = "KCORAL_ORPHAN_KILL_SECONDS"


def orphan_kill_seconds() -> float:
    """How long orphans may take to die after ``SIGKILL`` before they count as survivors."""
    try:
        value = float(os.environ.get(ORPHAN_KILL_ENV, ORPHAN_KILL_SECONDS))
    except ValueError:
        return ORPHAN_KILL_SECONDS
    return value if value > 0 else ORPHAN_KILL_SECONDS


def cleanup_confirm_seconds() -> float:
    """How long the front-end waits, after ``SIGKILL``, for a worker's exit report before it
    declares the clean-up unconfirmed: longer than the launcher holds a report back."""
    return orphan_kill_seconds() * 1.5 + 1.0


#: imported by the launcher before it forks anything (what every worker imports anyway)
PRELOADED = (
    "kcoral_server.worker.main",
    "kcoral_server.worker.engine",
    "kcoral.protocol.validate",
    "kcoral.protocol.values",
)


#: what ``--preload`` may name: modules the launcher imports once idle, when installed
PRELOADABLE = ("torch",)
#: how long the launcher must have had no request before it starts the preload
PRELOAD_IDLE_SECONDS = 0.2
#: ... or this long after it started at the latest, however busy (a seat replaced
#: back-to-back never leaves its launcher idle)
PRELOAD_LATEST_SECONDS = 2.0


class LauncherError(OSError):
    """The launcher could not fork a worker (the caller may fall back to spawning)."""


class LauncherRefused(LauncherError):
    """The launcher broke the fork rule (a thread, or CUDA initialized) and refused to
    fork: a configuration or environment problem to report, not to work around."""


class ForkedProcess:
    """The ``subprocess.Popen`` subset ``WorkerHandle`` uses, for a launcher's child."""

    def __init__(self, pid: int, status_fd: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        #: orphans that survived ``SIGKILL`` (known with the exit code); -1: unknown, the
        #: launcher went away before it reported
        self.survivors = 0
        #: the modules the launcher had preloaded when it forked this worker
        self.preloaded: tuple[str, ...] = ()
        #: the other workers of its launcher (``worker_strays`` leaves their orphans alone)
        self.forks: Forks | None = None
        self._status_fd: int | None = status_fd
        os.set_blocking(status_fd, False)

    def poll(self) -> int | None:
        if self.returncode is not None or self._status_fd is None:
            return self.returncode
        try:
            data = os.read(self._status_fd, _STATUS.size)
        except BlockingIOError:
            if is_alive(self.pid):
                return None
            # Exited (its pidfd already says so) but not yet reaped by the launcher, which
            # writes the code within moments: wait for it rather than report "running".
            select.select([self._status_fd], [], [], REAP_WAIT_SECONDS)
            try:
                data = os.read(self._status_fd, _STATUS.size)
            except BlockingIOError:
                return None
            except OSError:
                data = b""
        except OSError:
            data = b""
        if len(data) == _STATUS.size:
            self.returncode, self.survivors = _STATUS.unpack(data)
        elif is_alive(self.pid):
            return None  # the launcher died first; the worker itself still runs
        else:
            self.returncode = -signal.SIGKILL  # exit code lost with the launcher
            self.survivors = -1  # and with it, who looked after the worker's orphans
        self._close()
        return self.returncode

    @property
    def status_fd(self) -> int | None:
        """Readable once the exit code is there (or the launcher went away); None after
        ``poll`` returned the code."""
        return self._status_fd

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
            if self._status_fd is not None:
                # the status pipe turns readable at exit (or when the launcher goes away)
                select.select(
                    [self._status_fd], [], [], 0.05 if remaining is None else min(remaining, 0.05)
                )
            else:
                time.sleep(0.01)
        return self.returncode  # type: ignore[return-value]

    def _close(self) -> None:
        if self._status_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._status_fd)
            self._status_fd = None

    def __del__(self) -> None:
        self._close()


class Forks:
    """The front-end's record of the workers one ``Launcher`` forked: which live, and
    whether a fork is in flight (its child may already be among the launcher's children,
    not yet known here). Updated from the launching thread, read on the IO loop."""

    def __init__(self) -> None:
        self.started = 0  # launch requests begun ...
        self.done = 0  # ... and ended (the child, if any, recorded before this moves)
        self._workers: weakref.WeakValueDictionary[int, ForkedProcess] = (
            weakref.WeakValueDictionary()
        )

    @contextlib.contextmanager
    def in_flight(self) -> Iterator[None]:
        self.started += 1
        try:
            yield
        finally:
            self.done += 1

    def add(self, process: ForkedProcess) -> ForkedProcess:
        process.forks = self
        self._workers[process.pid] = process
        return process

    @property
    def settled(self) -> bool:
        """No fork in flight: every child of the launcher that is a worker is in ``live``
        (ask before ``live``)."""
        return self.started == self.done

    def live(self) -> set[int]:
        """Host pids of the workers whose exit has not been seen."""
        return {pid for pid, p in list(self._workers.items()) if p.returncode is None}


class Launcher:
    """The front-end's handle on its launcher process (started on first use).

    ``wrap`` turns the launcher's command into the command that runs it (``bwrap ... --``:
    a launcher inside a sandbox, see the module docstring); ``preload`` names modules of
    ``PRELOADABLE`` it imports too (those installed)."""

    def __init__(
        self,
        wrap: Callable[[list[str]], list[str]] | None = None,
        preload: Sequence[str] = (),
    ) -> None:
        unknown = sorted(set(preload) - set(PRELOADABLE))
        if unknown:
            raise ValueError(f"cannot preload {', '.join(unknown)}")
        self._wrap = wrap
        self.preload = tuple(preload)
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        # replaced launchers still serving their workers; polled (reaped) on later starts
        self._retired: list[subprocess.Popen] = []
        self.forks = Forks()

    def launch(
        self,
        worker_fd: int,
        env: dict[str, str],
        *,
        cgroups: Sequence[str] = (),
        launcher_env: Mapping[str, str] | None = None,
    ) -> ForkedProcess:
        """Fork a worker on ``worker_fd`` with environment ``env``, inside the cgroups whose
        ``cgroup.procs`` files ``cgroups`` names (blocking; call it off the IO loop).
        ``launcher_env`` is the environment of a launcher this call has to start (the
        default: ``kcoral_server.processes.sandbox.worker_base_environment()``). Raises
        ``LauncherError``."""
        sandboxed = self._wrap is not None
        # A sandboxed child cannot reach the cgroup files: it waits for the front-end's go.
        request = {"env": env, "cgroups": [] if sandboxed else list(cgroups), "go": sandboxed}
        payload = json.dumps(request).encode()
        # one request in flight: replies need no matching
        with self._lock, self.forks.in_flight():
            for attempt in (1, 2):  # a launcher that died is restarted once
                go_r, go_w = os.pipe() if sandboxed else (-1, -1)
                data = b""
                try:
                    sock = self._ensure_started(launcher_env)
                    sent = [worker_fd, go_r] if sandboxed else [worker_fd]
                    socket.send_fds(sock, [payload], sent)
                    data, fds, _flags, _addr = socket.recv_fds(sock, _MAX_MESSAGE, 1)
                except OSError as exc:
                    self._stop_locked()
                    if attempt == 2:
                        raise LauncherError(f"worker launcher failed: {exc}") from None
                    continue
                finally:
                    if sandboxed:
                        os.close(go_r)  # the child has its own copy
                        if not data:
                            os.close(go_w)
                if sandboxed and data:
                    try:
                        return self._go(data, fds, go_w, cgroups)
                    finally:
                        os.close(go_w)  # without a go first, the child exits
                if not data:
                    self._stop_locked()
                    if attempt == 2:
                        raise LauncherError("worker launcher exited")
                    continue
                reply = json.loads(data)
                if "pid" not in reply or len(fds) != 1:
                    for fd in fds:
                        os.close(fd)
                    raise _reply_error(reply)
                return self.forks.add(_forked(int(reply["pid"]), fds[0], reply))
        raise LauncherError("worker launcher failed")  # pragma: no cover

    def _go(self, data: bytes, fds: list[int], go: int, cgroups: Sequence[str]) -> ForkedProcess:
        """A sandboxed launcher's reply: the child's host pid, moved into ``cgroups``, then
        told to go on (it has run nothing of its own yet)."""
        reply = json.loads(data)
        if "pid" not in reply or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise _reply_error(reply)
        assert self._process is not None
        pid = host_pid(self._process.pid, int(reply["pid"]))
        try:
            if pid is None:
                raise OSError(f"worker {reply['pid']} not found under the sandbox")
            for path in cgroups:
                with open(path, "w") as f:
                    f.write(str(pid))
            os.write(go, b"g")
        except OSError as exc:
            os.close(fds[0])
            raise LauncherError(f"cannot start the sandboxed worker: {exc}") from None
        return self.forks.add(_forked(pid, fds[0], reply))

    def start(self) -> None:
        """Start the launcher now (e.g. in the background while the server starts)."""
        with self._lock:
            self._ensure_started()

    def _ensure_started(self, env: Mapping[str, str] | None = None) -> socket.socket:
        if self._sock is not None and self._process is not None and self._process.poll() is None:
            return self._sock
        self._retire_locked()
        if env is None:
            from kcoral_server.processes.sandbox import worker_base_environment

            env = worker_base_environment()
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        command = [
            sys.executable,
            "-m",
            "kcoral_server.processes.launcher",
            "--fd",
            str(child.fileno()),
        ]
        if self.preload:
            command += ["--preload", ",".join(self.preload)]
        if self._wrap is None:
            command += ["--parent", str(os.getpid())]
        else:
            command = self._wrap(command)  # the front-end's pid means nothing in there
        try:
            self._process = subprocess.Popen(
                command,
                pass_fds=(child.fileno(),),
                start_new_session=True,
                env=dict(env),  # forked workers' /proc/self/environ: no secrets there
            )
        except OSError:
            parent.close()
            raise
        finally:
            child.close()
        self._sock = parent
        return parent

    def close(self) -> None:
        """Stop the launcher; workers it forked that are still running are killed with it."""
        with self._lock:
            self._retire_locked()
            for process in self._retired:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(2)
                if process.poll() is None:
                    process.kill()
                    process.wait()
            self._retired.clear()

    def _stop_locked(self) -> None:
        """Give up on the current launcher after a failed exchange (a new one starts on the
        next launch)."""
        self._retire_locked()

    def _retire_locked(self) -> None:
        if self._sock is not None:
            # On EOF the launcher forks nothing more and exits after its last worker: the
            # workers keep their parent (and their exit reports) meanwhile.
            self._sock.close()
            self._sock = None
        if self._process is not None:
            self._retired.append(self._process)
            self._process = None
        self._retired = [p for p in self._retired if p.poll() is None]


def _forked(pid: int, status_fd: int, reply: dict) -> ForkedProcess:
    process = ForkedProcess(pid, status_fd)
    process.preloaded = tuple(str(name) for name in reply.get("preloaded", ()))
    return process


def _reply_error(reply: dict) -> LauncherError:
    """The exception for a launcher's answer without a worker."""
    message = str(reply.get("error", "worker launcher failed"))
    return LauncherRefused(message) if reply.get("refused") else LauncherError(message)


PR_SET_DUMPABLE = 4


def set_dumpable(dumpable: bool) -> bool:
    """``PR_SET_DUMPABLE`` (Linux): a non-dumpable process cannot be ptraced, nor its
    ``/proc/<pid>/mem`` and ``environ`` read, by other processes of its user without
    ``CAP_SYS_PTRACE``. False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_DUMPABLE, int(dumpable), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def host_pid(root: int, ns_pid: int) -> int | None:
    """The host pid of the process below ``root`` whose pid in its own (innermost) PID
    namespace is ``ns_pid`` (``NSpid`` in ``/proc/<pid>/status``)."""
    stack = [root]
    while stack:
        for pid in children(stack.pop()):
            if namespace_pid(pid) == str(ns_pid):
                return pid
            stack.append(pid)
    return None


_shared: dict[tuple[str, ...], Launcher] = {}
_shared_lock = threading.Lock()


def shared_launcher(preload: Sequence[str] = ()) -> Launcher:
    """The process-wide unsandboxed launcher preloading ``preload`` (one per front-end and
    preload: servers in one process may be configured differently)."""
    key = tuple(preload)
    with _shared_lock:
        if key not in _shared:
            _shared[key] = Launcher(preload=key)
        return _shared[key]


# ---------------------------------------------------------------------- launcher process


@dataclass
class Child:
    """What a freshly forked child runs once the launcher's stack is unwound."""

    worker_fd: int
    env: dict[str, str]
    cgroups: list[str] = field(default_factory=list)


@dataclass
class _Exited:
    pid: int
    code: int
    status_fd: int
    at: float


@dataclass
class Family:
    """The launcher's children: workers it forked (exit codes go out through their status
    pipes) and orphans a dead worker left, re-parented to the subreaper (killed at once)."""

    workers: dict[int, int] = field(default_factory=dict)  # pid -> status pipe write end
    exited: list[_Exited] = field(default_factory=list)  # reaped, not yet reported
    orphans: list[int] = field(default_factory=list)
    orphans_since: float | None = None  # when the current run of live orphans began
    reported: dict[int, int] = field(default_factory=dict)  # pid -> exit code, once reported
    kill_seconds: float = field(default_factory=orphan_kill_seconds)

    @property
    def poll_interval(self) -> float | None:
        """How long the loop may sleep before ``collect`` must run again (None: until a
        signal): briefly while orphans die, slowly once they have outlived ``SIGKILL``."""
        if self.exited:
            return ORPHAN_POLL_SECONDS
        if not self.orphans:
            return None
        since = self.orphans_since if self.orphans_since is not None else time.monotonic()
        if time.monotonic() - since < self.kill_seconds:
            return ORPHAN_POLL_SECONDS
        return STUCK_POLL_SECONDS

    @property
    def empty(self) -> bool:
        return not (self.workers or self.exited or self.orphans)

    def collect(self) -> None:
        """Reap what finished, kill orphans, report exits nothing is left behind for."""
        self._reap()
        # Children that are not workers can only be orphans: the launcher forks nothing else.
        self.orphans = [
            pid for pid in children(os.getpid()) if pid not in self.workers and is_alive(pid)
        ]
        for pid in self.orphans:
            kill_process(pid)  # our unreaped child: its pid cannot have been recycled
        now = time.monotonic()
        if not self.orphans:
            self.orphans_since = None
        elif self.orphans_since is None:
            self.orphans_since = now
        waiting = []
        for entry in self.exited:
            # An orphan may belong to any worker that died: hold every report until none is
            # left (orphans die within moments of a SIGKILL), so "exited" means "and its
            # descendants are gone" to the front-end. Past the limit the report says how
            # many survived, and the front-end quarantines instead of trusting it.
            if self.orphans and now - entry.at < self.kill_seconds:
                waiting.append(entry)
            else:
                _report(entry.status_fd, entry.code, len(self.orphans))
                self.reported[entry.pid] = entry.code
        self.exited = waiting

    def _reap(self) -> None:
        while True:
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            fd = self.workers.pop(pid, None)
            if fd is not None:
                code = os.waitstatus_to_exitcode(wait_status)
                self.exited.append(_Exited(pid, code, fd, time.monotonic()))

    def kill_all(self, timeout: float = 5.0) -> None:
        """The front-end is gone: kill every child (workers and orphans) and reap them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._reap()
            live = [pid for pid in children(os.getpid()) if is_alive(pid)]
            if not live:
                break
            for pid in live:
                kill_process(pid)
            time.sleep(ORPHAN_POLL_SECONDS)
        self._reap()
        survivors = sum(1 for pid in children(os.getpid()) if is_alive(pid))
        for entry in self.exited:
            _report(entry.status_fd, entry.code, survivors)
        self.exited = []

    def forget(self) -> None:
        """In a freshly forked worker: drop the launcher's bookkeeping and descriptors."""
        for fd in self.workers.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        for entry in self.exited:
            with contextlib.suppress(OSError):
                os.close(entry.status_fd)
        self.workers.clear()
        self.exited.clear()
        self.orphans.clear()

    def close(self) -> None:
        """The launcher leaves: running workers lose their exit reports (and, through the
        parent-death signal, their lives)."""
        self.forget()


def _report(fd: int, code: int, survivors: int = 0) -> None:
    if fd < 0:
        return  # a supervisor's worker: the code becomes the supervisor's own
    with contextlib.suppress(OSError):
        os.write(fd, _STATUS.pack(code, survivors))
    with contextlib.suppress(OSError):
        os.close(fd)


def _watch_parent(parent: int | None) -> tuple[bool, int | None]:
    """``(alive, pidfd)`` for the front-end: a pidfd turns readable when the whole process
    is gone (unlike the parent-death signal, which follows the thread that forked us)."""
    if parent is None:
        return True, None
    try:
        pidfd = open_pidfd(parent)
    except ProcessLookupError:
        return False, None
    if pidfd is None:
        # No pidfds (Linux < 5.3, gVisor): the parent-death signal is the next best thing.
        if not tie_to_parent(parent):
            return False, None
    # Checked after the pidfd is open: a parent that died before cannot be missed.
    if os.getppid() != parent:
        if pidfd is not None:
            os.close(pidfd)
        return False, None
    return True, pidfd


def preload(names: Sequence[str]) -> list[str]:
    """Import the installed modules of ``names`` (a failure is printed: the workers then
    import them themselves), then stop the native threads their loading started (the fork
    rule); returns the modules now loaded."""
    loaded = []
    for name in names:
        if importlib.util.find_spec(name) is None:
            continue  # not installed: nothing to preload
        try:
            importlib.import_module(name)
        except Exception as exc:
            print(f"kcoral launcher: cannot preload {name}: {exc}", file=sys.stderr, flush=True)
            continue
        loaded.append(name)
    stop_blas_pools()
    keep_preload_finalizers_from_exit()
    _freeze_heap()
    return loaded


def keep_preload_finalizers_from_exit() -> int:
    """Mark the ``weakref.finalize`` callbacks registered so far as not run at exit; returns
    how many. torch registers one per operator library (~130, ~25-80 ms at every worker's
    exit, which a transient worker's next request waits for); they only tidy registries of
    the exiting process itself. A program's own finalizers still run at its exit."""
    registry = getattr(weakref.finalize, "_registry", {})  # no public way to list them
    marked = 0
    for finalizer in list(registry):
        with contextlib.suppress(AttributeError, TypeError):
            if finalizer.atexit:
                finalizer.atexit = False
                marked += 1
    return marked


def _freeze_heap() -> None:
    import gc

    gc.collect()
    gc.freeze()  # pages the children never write stay shared, collections skip them


#: the function OpenBLAS's own ``pthread_atfork`` prepare handler calls: it joins the pool
#: threads, and the next BLAS call starts them again
_BLAS_SHUTDOWN = "blas_thread_shutdown_"


def stop_blas_pools() -> int:
    """Stop the thread pool of every OpenBLAS loaded here (numpy's bundled one included);
    returns how many were stopped. Each starts again, with its configured number of
    threads, at the first BLAS call of the process that makes it (a forked worker)."""
    stopped = 0
    for path in _loaded_libraries():
        if "openblas" not in os.path.basename(path).lower():
            continue
        try:
            library = ctypes.CDLL(path)  # already loaded: the same handle, no new init
            getattr(library, _BLAS_SHUTDOWN)()
        except (OSError, AttributeError):
            continue  # not an OpenBLAS we know how to stop: the thread check will say so
        stopped += 1
    return stopped


def _loaded_libraries() -> list[str]:
    """Paths of the shared objects mapped into this process."""
    found: dict[str, None] = {}
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and ".so" in fields[5]:
                    found.setdefault(fields[5].strip(), None)
    except OSError:
        return []
    return list(found)


def fork_hazards() -> list[str]:
    """What breaks the fork rule right now (see the module docstring); empty: fork."""
    hazards = []
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    # is_initialized reads torch's flag; it neither initializes CUDA nor caches a count
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        hazards.append("CUDA is initialized")
    main = threading.main_thread()
    python = [thread.name for thread in threading.enumerate() if thread is not main]
    if python:
        hazards.append(f"Python thread(s) besides the main one: {', '.join(sorted(python))}")
    native = _other_native_threads()
    if native:
        hazards.append(f"native thread(s) besides the main one: {', '.join(native)}")
    return hazards


def _other_native_threads() -> list[str]:
    """``tid (name)`` of this process's threads other than the main one ([] if /proc cannot
    say)."""
    try:
        tids = os.listdir("/proc/self/task")
        # "<pid>/task/<tid>" as this /proc numbers them (a sandbox mounts its own)
        own = os.readlink("/proc/thread-self").rsplit("/", 1)[-1]
    except OSError:
        return []
    others = []
    for tid in sorted(tids, key=int):
        if tid == own:
            continue
        try:
            with open(f"/proc/self/task/{tid}/comm") as comm:
                name = comm.read().strip()
        except OSError:
            continue  # it ended meanwhile
        others.append(f"{tid} ({name})")
    return others


def refusal_message(hazards: Sequence[str]) -> str:
    """The error a launcher that breaks the fork rule answers with."""
    return (
        "the worker fork server refused to fork: "
        + "; ".join(hazards)
        + " (a fork now could deadlock the worker or break CUDA in it, SERVER §1;"
        " --worker-preload none turns the preload off if it caused this)"
    )


def serve(
    control: socket.socket, parent: int | None = None, preload_names: Sequence[str] = ()
) -> Child | None:
    """The launcher loop; returns ``None`` in the launcher (exit) or a ``Child`` in a child.

    ``parent`` is the front-end's pid: the launcher kills its workers and exits when it dies.
    ``preload_names`` are imported once the launcher is idle (the module docstring).
    """
    for name in PRELOADED:
        __import__(name)
    _freeze_heap()
    pending = list(preload_names)
    loaded: list[str] = []
    last_request = started = time.monotonic()
    become_subreaper()
    # Programs run as the same user in the same sandbox as their launcher: non-dumpable, it
    # cannot be ptraced or have its memory read or written by them (each child resets it).
    set_dumpable(False)
    alive, parent_fd = _watch_parent(parent)
    if not alive:
        return None
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the select below
    family = Family()
    accepting = True
    try:
        while True:
            watched: list = [wake_r]
            if accepting:
                watched.append(control)
            if parent_fd is not None:
                watched.append(parent_fd)
            timeout = family.poll_interval
            if pending and accepting:
                due = min(last_request + PRELOAD_IDLE_SECONDS, started + PRELOAD_LATEST_SECONDS)
                remaining = max(0.0, due - time.monotonic())
                timeout = remaining if timeout is None else min(timeout, remaining)
            readable, _w, _x = select.select(watched, [], [], timeout)
            if parent_fd is not None and parent_fd in readable:
                family.kill_all()  # the front-end died (SIGKILL): nothing may outlive it
                return None
            now = time.monotonic()
            idle = control not in readable and now - last_request >= PRELOAD_IDLE_SECONDS
            if pending and accepting and (idle or now - started >= PRELOAD_LATEST_SECONDS):
                loaded = preload(pending)  # blocks; requests queue on the socket meanwhile
                pending = []
            if wake_r in readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 512)
            family.collect()
            if control in readable:
                try:
                    data, fds, _flags, _addr = socket.recv_fds(control, _MAX_MESSAGE, 4)
                except OSError:
                    data, fds = b"", []
                last_request = time.monotonic()
                if data:
                    fds_to_close = (wake_r, wake_w, *(() if parent_fd is None else (parent_fd,)))
                    child = _fork(control, data, fds, family, fds_to_close, loaded)
                    if child is not None:
                        parent_fd = None  # closed in the child already
                        return child
                else:
                    accepting = False  # the front-end closed the socket: fork no more
            if not accepting and family.empty:
                return None
    finally:
        family.close()
        if parent_fd is not None:
            with contextlib.suppress(OSError):
                os.close(parent_fd)


def _fork(
    control: socket.socket,
    data: bytes,
    fds: list[int],
    family: Family,
    launcher_fds: tuple[int, ...],
    preloaded: Sequence[str] = (),
) -> Child | None:
    try:
        request = json.loads(data)
        env = request["env"]
        cgroups = [str(path) for path in request.get("cgroups", [])]
        wanted = 2 if request.get("go") else 1
        if len(fds) != wanted:
            raise ValueError(f"expected {wanted} descriptor(s), got {len(fds)}")
    except (ValueError, KeyError, TypeError) as exc:
        for fd in fds:
            os.close(fd)
        _reply(control, {"error": f"bad launch request: {exc}"}, [])
        return None
    hazards = fork_hazards()
    if hazards:
        for fd in fds:
            os.close(fd)
        message = refusal_message(hazards)
        print(f"kcoral launcher: {message}", file=sys.stderr, flush=True)
        _reply(control, {"error": message, "refused": True}, [])
        return None
    worker_fd = fds[0]
    go = fds[1] if len(fds) == 2 else None
    status_r, status_w = os.pipe()
    launcher = os.getpid()
    try:
        pid = os.fork()
    except OSError as exc:
        for fd in (*fds, status_r, status_w):
            os.close(fd)
        _reply(control, {"error": f"fork failed: {exc}"}, [])
        return None
    if pid == 0:  # the worker
        set_dumpable(True)  # the worker's /proc files stay its own (tools read them)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        if not tie_to_parent(launcher):
            os._exit(1)  # the launcher died before the prctl: nobody will supervise us
        if go is not None:
            # The front-end moves this process into its cgroups, then says go; nothing of
            # the worker runs before (an empty read: it gave up, so never run unlimited).
            try:
                if os.read(go, 1) != b"g":
                    os._exit(125)
            except OSError:
                os._exit(125)
            os.close(go)
        try:
            enter_cgroups(cgroups)  # before anything else runs: limits hold from the start
        except OSError:
            os._exit(125)  # never run a worker outside its limits (like the spawn shim)
        control.close()
        for fd in (status_r, status_w, *launcher_fds):
            with contextlib.suppress(OSError):
                os.close(fd)
        family.forget()
        os.setsid()  # like start_new_session=True: the front-end kills the whole group
        return Child(worker_fd, env, cgroups)
    for fd in fds:
        os.close(fd)
    family.workers[pid] = status_w
    _reply(control, {"pid": pid, "preloaded": list(preloaded)}, [status_r])
    os.close(status_r)
    return None


def _reply(control: socket.socket, reply: dict, fds: list[int]) -> None:
    with contextlib.suppress(OSError):
        socket.send_fds(control, [json.dumps(reply).encode()], fds)


# ---------------------------------------------------------------------- spawn supervisor

#: the supervised command (a JSON list); in the environment, not argv, so that process
#: listings show ``kcoral_server.worker`` for the worker only
SUPERVISE_ENV = "KCORAL_SUPERVISE_COMMAND"


def supervised_command(command: list[str], env: dict[str, str]) -> list[str]:
    """Run a spawned worker ``command`` under a one-worker supervisor (SERVER §11): it is a
    child subreaper that kills what the worker leaves behind before it exits with the
    worker's code, dies with the front-end, and takes the worker with it. ``env`` (the
    worker's environment, passed to ``Popen``) receives the command."""
    env[SUPERVISE_ENV] = json.dumps(command)
    return [
        sys.executable,
        "-m",
        "kcoral_server.processes.launcher",
        "--supervise",
        str(os.getpid()),
    ]


def supervise(parent: int) -> int:
    """The supervisor process: fork and exec the command, wait for it and its orphans."""
    command = json.loads(os.environ.pop(SUPERVISE_ENV))
    become_subreaper()
    alive, parent_fd = _watch_parent(parent)
    if not alive:
        return 1
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    # SIGTERM is for the worker (the kill path signals every process of the tree): the
    # supervisor stays to clean up after it. Handlers are reset by exec in the child.
    signal.signal(signal.SIGTERM, lambda *_: None)
    own = {wake_r, wake_w, *(() if parent_fd is None else (parent_fd,))}
    supervisor = os.getpid()
    pid = os.fork()
    if pid == 0:
        signal.set_wakeup_fd(-1)
        if not tie_to_parent(supervisor):
            os._exit(1)
        for fd in own:
            os.close(fd)
        try:
            os.execvp(command[0], command)
        finally:
            os._exit(127)
    # The worker's descriptors (its IPC end above all) must close when the worker dies.
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in own:
            with contextlib.suppress(OSError):
                os.close(fd)
    family = Family()
    family.workers[pid] = -1
    # The supervisor's exit is the worker's exit report, so it stays while an orphan
    # survives SIGKILL: the front-end, which never signals the supervisor itself, then sees
    # no exit and quarantines instead of trusting a clean-up that did not happen.
    while pid not in family.reported or family.orphans:
        watched = [wake_r] if parent_fd is None else [wake_r, parent_fd]
        readable, _w, _x = select.select(watched, [], [], family.poll_interval)
        if parent_fd is not None and parent_fd in readable:
            family.kill_all()
            return 1
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 512)
        family.collect()
    code = family.reported[pid]
    if code < 0:  # killed by a signal: end the same way, so the front-end sees the same code
        with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code if code >= 0 else 128 - code


def run_child(child: Child) -> int:
    """In the forked worker: take the requested environment, then run the worker."""
    os.environ.clear()
    os.environ.update(child.env)
    from kcoral_server.worker import __main__ as entry
    from kcoral_server.worker.main import main as worker_main

    sys.argv = [entry.__file__, "--fd", str(child.worker_fd)]  # as if spawned

    return worker_main(["--fd", str(child.worker_fd)])


_USAGE = (
    "usage: python -m kcoral_server.processes.launcher --fd N [--parent PID] [--preload MODULE,...]"
    " | --supervise PARENT_PID"
)


def _parse_launcher_args(args: Sequence[str]) -> dict[str, str] | None:
    """``--fd``, ``--parent`` and ``--preload`` (each at most once, ``--fd`` required), or
    None for anything else."""
    if len(args) % 2:
        return None
    options = dict(zip(args[::2], args[1::2], strict=True))
    if len(options) != len(args) // 2 or "--fd" not in options:
        return None
    if not set(options) <= {"--fd", "--parent", "--preload"}:
        return None
    if not all(options[name].isdigit() for name in ("--fd", "--parent") if name in options):
        return None
    preload_names = options.get("--preload", "").split(",") if "--preload" in options else []
    if not set(preload_names) <= set(PRELOADABLE):
        return None
    return options


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "--supervise":
        return supervise(int(args[1]))
    options = _parse_launcher_args(args)
    if options is None:
        print(_USAGE, file=sys.stderr)
        return 2
    control = socket.socket(fileno=int(options["--fd"]))
    parent = int(options["--parent"]) if "--parent" in options else None
    names = options["--preload"].split(",") if "--preload" in options else []
    child = serve(control, parent, names)
    if child is None:
        return 0
    code = run_child(child)
    _quick_exit(code)
    return code  # pragma: no cover


def _quick_exit(code: int) -> None:
    """Exit a forked worker without interpreter finalization: tearing down every module
    touches (and so copies) every page shared with the launcher, ~15 ms per worker. What a
    program could observe still happens: atexit handlers, finalizers of its garbage, flushed
    stdio."""
    import atexit
    import gc

    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    with contextlib.suppress(BaseException):
        gc.collect()  # start-up objects are frozen: this only walks what programs left
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
