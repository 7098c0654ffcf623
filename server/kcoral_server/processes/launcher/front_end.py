"""The front-end's side of its fork servers: ``Launcher`` and the workers they fork.

Runs in the server process. ``Launcher`` starts a fork server (``python -m
kcoral_server.processes.launcher``, see the package docstring) on first use and asks it for
workers over the control socket (``wire``); ``ForkedProcess`` is one forked worker as the
front-end sees it (its parent is the launcher, not the front-end), ``Forks`` the record of a
launcher's workers. ``supervised_command`` wraps a spawned worker's command in a spawn
supervisor instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence

from kcoral_server.processes.cgroups import enter_cgroups
from kcoral_server.processes.launcher.log_relay import log_relay
from kcoral_server.processes.launcher.wire import (
    ENTRY_MODULE,
    MAX_MESSAGE,
    PRELOADABLE,
    STATUS,
    SUPERVISE_ENV,
    LaunchReply,
    LaunchRequest,
    orphan_kill_seconds,
)
from kcoral_server.processes.procfs import (
    Identity,
    children,
    identity,
    is_alive,
    kill_identity,
    namespace_init,
    namespace_pid,
)
from kcoral_server.processes.procfs import parent as procfs_parent

REAP_WAIT_SECONDS = 0.05  # the most ``poll`` waits for the launcher to report an exit


def cleanup_confirm_seconds() -> float:
    """How long the front-end waits, after ``SIGKILL``, for a worker's exit report before it
    declares the clean-up unconfirmed: longer than the launcher holds a report back."""
    return orphan_kill_seconds() * 1.5 + 1.0


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
        #: the init of its sandbox's PID namespace (None unsandboxed): once that has
        #: exited, nothing the worker left can run, even when the launcher that would have
        #: reported on its orphans went away first (``exit.kill_tree``)
        self.namespace_init: Identity | None = None
        #: the worker as forked (pid and start time): its launcher reaps it, so once it has
        #: exited its number may name another process, which a signal must never reach
        self.forked_as: Identity | None = None
        self._status_fd: int | None = status_fd
        os.set_blocking(status_fd, False)
        #: a worker forked ahead: the write end of its go pipe until ``release``
        self._go: int | None = None
        #: forked ahead and never told to go on: it ran nothing of its own (``poll``)
        self.ran_nothing = False
        #: the launcher's own process (``bwrap``, for a seat's sandbox), and how it ended
        #: when the worker's exit code was lost with it: a SIGTERM there is not the server's
        #: (it hangs up on a launcher, or kills it), so the answer can say where it came from
        self.launcher: subprocess.Popen[bytes] | None = None
        self.launcher_returncode: int | None = None

    def hold(self, go: int) -> None:
        """Keep ``go``, the write end of the worker's go pipe, until ``release``."""
        self._go = go
        self.ran_nothing = True

    @property
    def held(self) -> bool:
        """Forked ahead and waiting for its go (``Launcher.launch(hold=True)``)."""
        return self._go is not None

    def release(self) -> None:
        """Tell a worker forked ahead to go on: it is in its cgroups and has run nothing of
        its own yet. Raises ``OSError`` when it is gone."""
        go, self._go = self._go, None
        if go is None:
            return
        try:
            os.write(go, b"g")
            self.ran_nothing = False  # from here on it may run a program (and leave orphans)
        finally:
            os.close(go)
        # The program it was forked beside runs as its user in its sandbox and may have
        # stopped it (SIGSTOP): the seat then waited out the start-up timeout (60 s) for
        # it, every identity's next program with it. That program's tree is gone by now.
        if self.returncode is None and self.forked_as is not None:
            kill_identity(self.forked_as, signal.SIGCONT)

    def poll(self) -> int | None:
        if self.returncode is not None or self._status_fd is None:
            return self.returncode
        try:
            data = os.read(self._status_fd, STATUS.size)
        except BlockingIOError:
            if is_alive(self.pid):
                return None
            # Exited (its pidfd already says so) but not yet reaped by the launcher, which
            # writes the code within moments: wait for it rather than report "running".
            select.select([self._status_fd], [], [], REAP_WAIT_SECONDS)
            try:
                data = os.read(self._status_fd, STATUS.size)
            except BlockingIOError:
                return None
            except OSError:
                data = b""
        except OSError:
            data = b""
        if len(data) == STATUS.size:
            self.returncode, self.survivors = STATUS.unpack(data)
        elif is_alive(self.pid):
            return None  # the launcher died first; the worker itself still runs
        else:
            self.returncode = -signal.SIGKILL  # exit code lost with the launcher
            if self.launcher is not None:
                self.launcher_returncode = self.launcher.poll()
            # and with it, who looked after the worker's orphans: unknown (-1), unless the
            # worker was forked ahead and never let go, so ran nothing that could leave any.
            # (A seat's sandbox closed for another identity takes its fork server with it;
            # a worker held there must not read as an unconfirmed end, which stops the
            # whole pool admitting.)
            self.survivors = 0 if self.ran_nothing else -1
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

    def drop(self) -> None:
        """Give up on a worker forked ahead: it reads EOF for its go and exits (125)
        without running anything, so its launcher is free to stop too."""
        go, self._go = self._go, None
        if go is not None:
            with contextlib.suppress(OSError):
                os.close(go)

    def _close(self) -> None:
        self.drop()  # never released: it exits without running
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

    def add(
        self, process: ForkedProcess, launcher: subprocess.Popen[bytes] | None = None
    ) -> ForkedProcess:
        process.forks = self
        process.launcher = launcher
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
    a launcher inside a sandbox, see the package docstring); ``preload`` names modules of
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
        self._process: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        # replaced launchers still serving their workers; polled (reaped) on later starts
        self._retired: list[subprocess.Popen[bytes]] = []
        #: a sandboxed fork server's host pid, learnt from its first child (for that process)
        self._server_host: tuple[subprocess.Popen[bytes], int] | None = None
        #: the current launcher's stderr pipe, relayed until it first answers (``log_relay``)
        self._start_log: int | None = None
        self.forks = Forks()
        #: the server is stopping (``abandon``): no launch, and no new launcher
        self.abandoned = False

    def launch(
        self,
        worker_fd: int,
        env: dict[str, str],
        *,
        cgroups: Sequence[str] = (),
        launcher_env: Mapping[str, str] | None = None,
        hold: bool = False,
        after_preload: bool = False,
    ) -> ForkedProcess:
        """Fork a worker on ``worker_fd`` with environment ``env``, inside the cgroups whose
        ``cgroup.procs`` files ``cgroups`` names (blocking; call it off the IO loop).
        ``launcher_env`` is the environment of a launcher this call has to start (the
        default: ``kcoral_server.processes.sandbox.worker_base_environment()``). ``hold``:
        the worker waits, in its cgroups, until ``ForkedProcess.release`` (a spare forked
        ahead, SERVER §6). ``after_preload``: a launcher whose preload is still to come does
        it before this fork (a spare, ``LaunchRequest``). Raises ``LauncherError``."""
        sandboxed = self._wrap is not None
        # A sandboxed child cannot reach the cgroup files: it waits for the front-end's go.
        waits = sandboxed or hold
        request = LaunchRequest(
            env, () if sandboxed else tuple(cgroups), go=waits, after_preload=after_preload
        )
        payload = request.encode()
        # one request in flight: replies need no matching
        with self._lock, self.forks.in_flight():
            for attempt in (1, 2):  # a launcher that died is restarted once
                if self.abandoned:
                    raise LauncherError("worker launcher stopped: the server is stopping")
                go_r, go_w = os.pipe() if waits else (-1, -1)
                data = b""
                try:
                    sock = self._ensure_started(launcher_env)
                    sent = [worker_fd, go_r] if waits else [worker_fd]
                    socket.send_fds(sock, [payload], sent)
                    data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 1)
                    if data:
                        self._answered_locked()
                except OSError as exc:
                    self._stop_locked()
                    if attempt == 2:
                        raise LauncherError(f"worker launcher failed: {exc}") from None
                    continue
                finally:
                    if waits:
                        os.close(go_r)  # the child has its own copy
                        if not data:
                            os.close(go_w)
                if waits and data:
                    try:
                        process = self._placed(data, fds, cgroups if sandboxed else ())
                    except BaseException:
                        os.close(go_w)  # without a go, the child exits
                        raise
                    process.hold(go_w)
                    if not hold:
                        try:
                            process.release()
                        except OSError as exc:
                            raise LauncherError(f"cannot start the worker: {exc}") from None
                    return process
                if not data:
                    self._stop_locked()
                    if attempt == 2:
                        raise LauncherError("worker launcher exited")
                    continue
                reply = _forked_reply(data, fds)
                assert reply.pid is not None
                return self.forks.add(_forked(reply.pid, fds[0], reply), self._process)
        raise LauncherError("worker launcher failed")  # pragma: no cover

    def _placed(self, data: bytes, fds: list[int], cgroups: Sequence[str]) -> ForkedProcess:
        """The reply for a child that waits for its go: the child, by its host pid, moved
        into ``cgroups`` (a sandboxed launcher's child cannot move itself)."""
        reply = _forked_reply(data, fds)
        assert self._process is not None and reply.pid is not None
        pid = reply.pid if self._wrap is None else self._child_host_pid(reply.pid)
        try:
            if pid is None:
                raise OSError(f"worker {reply.pid} not found under the sandbox")
            enter_cgroups(cgroups, pid)
        except OSError as exc:
            os.close(fds[0])
            raise LauncherError(f"cannot start the sandboxed worker: {exc}") from None
        return self.forks.add(_forked(pid, fds[0], reply), self._process)

    def _child_host_pid(self, ns_pid: int) -> int | None:
        """The host pid of the sandboxed fork server's child ``ns_pid``: among the fork
        server's children it does not know yet once it knows the fork server's host pid
        (walking the whole tree below ``bwrap`` read ~5 ``/proc`` status files per start)."""
        assert self._process is not None
        server = self._server_host
        if server is not None and server[0] is self._process:
            known = self.forks.live()
            for child in children(server[1]):
                if child not in known and namespace_pid(child) == str(ns_pid):
                    return child
        found = host_pid(self._process.pid, ns_pid)
        if found is not None and (launcher := procfs_parent(found)) is not None:
            self._server_host = (self._process, launcher)
        return found

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
            ENTRY_MODULE,
            "--fd",
            str(child.fileno()),
        ]
        if self.preload:
            command += ["--preload", ",".join(self.preload)]
        # Never the front-end's own stdio (the server's console; ``log_relay``): the
        # launcher's messages on a pipe only it holds, bwrap's on one relayed until then.
        log_r, log_w = os.pipe()
        start_r, start_w = os.pipe()
        command += ["--log-fd", str(log_w)]
        if self._wrap is None:
            command += ["--parent", str(os.getpid())]
        else:
            command = self._wrap(command)  # the front-end's pid means nothing in there
        try:
            self._process = subprocess.Popen(
                command,
                pass_fds=(child.fileno(), log_w),
                stdin=subprocess.DEVNULL,
                stdout=start_w,
                stderr=start_w,
                start_new_session=True,
                env=dict(env),  # forked workers' /proc/self/environ: no secrets there
            )
        except OSError:
            parent.close()
            os.close(log_r)
            os.close(start_r)
            raise
        finally:
            child.close()
            os.close(log_w)
            os.close(start_w)
        relay = log_relay()
        relay.follow(log_r)
        relay.follow(start_r)
        self._start_log = start_r
        self._sock = parent
        if self.abandoned:  # came while it started (``abandon`` saw no socket)
            self.abandon()
        return parent

    def _answered_locked(self) -> None:
        """The launcher answered: what bwrap had to say came before, and what reaches its
        stderr pipe from now on may come from a program (``log_relay``)."""
        if self._start_log is not None:
            log_relay().stop(self._start_log)
            self._start_log = None

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

    def abandon(self) -> None:
        """Hang up on the launcher now, from any thread, without waiting for a launch in
        flight (it holds the lock): the server is stopping. The launch in flight fails with
        ``LauncherError`` and starts no new launcher. The launcher exits after its last
        worker, whose exit reports still arrive, even in the middle of a preload
        (``fork_server.ExitOnHangup``); ``close`` then finds it gone or going."""
        self.abandoned = True
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):  # closed meanwhile: hung up already
                sock.shutdown(socket.SHUT_RDWR)

    def _stop_locked(self) -> None:
        """Give up on the current launcher after a failed exchange (a new one starts on the
        next launch)."""
        self._retire_locked()

    def _retire_locked(self) -> None:
        self._answered_locked()  # a launcher that never answered said why before it ended
        if self._sock is not None:
            # On EOF the launcher forks nothing more and exits after its last worker: the
            # workers keep their parent (and their exit reports) meanwhile.
            self._sock.close()
            self._sock = None
        if self._process is not None:
            self._retired.append(self._process)
            self._process = None
        self._retired = [p for p in self._retired if p.poll() is None]


def _forked_reply(data: bytes, fds: list[int]) -> LaunchReply:
    """The launcher's reply to a launch request, with the worker's status pipe in ``fds``;
    raises ``LauncherError`` (``LauncherRefused`` under the fork rule) for any other."""
    try:
        reply = LaunchReply.decode(data)
    except ValueError:
        reply = LaunchReply(error="worker launcher failed")
    if reply.pid is None or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        message = reply.error or "worker launcher failed"
        raise LauncherRefused(message) if reply.refused else LauncherError(message)
    return reply


def _forked(pid: int, status_fd: int, reply: LaunchReply) -> ForkedProcess:
    process = ForkedProcess(pid, status_fd)
    process.preloaded = reply.preloaded
    process.namespace_init = namespace_init(pid)
    process.forked_as = identity(pid)  # held on its go pipe: it is alive
    return process


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


def supervised_command(command: list[str], env: dict[str, str]) -> list[str]:
    """Run a spawned worker ``command`` under a one-worker supervisor (SERVER §11): it is a
    child subreaper that kills what the worker leaves behind before it exits with the
    worker's code, dies with the front-end, and takes the worker with it. ``env`` (the
    worker's environment, passed to ``Popen``) receives the command."""
    env[SUPERVISE_ENV] = json.dumps(command)
    return [
        sys.executable,
        "-m",
        ENTRY_MODULE,
        "--supervise",
        str(os.getpid()),
    ]
