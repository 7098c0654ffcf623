"""Launching, talking to and killing one worker process.

Who can reach what: the worker runs *programs* (uploaded code). Its environment starts from
``sandbox.worker_base_environment`` (no KCoral secret, no ``--worker-env-deny``ed variable)
in every sandbox mode and on both launch paths (forked from the launcher, or spawned), and
it runs inside its limits (``kcoral_server.limits``) from its first instruction.

A handle owns the process and its IPC channel, which hands it every message as soon as its
frame is read. Lease messages are answered here (the front-end arbitrates and measures lease
timings itself); everything else goes to the inbox for whoever drives the current request or
start-up (``receive``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kcoral_server import ipc, limits
from kcoral_server.launcher import (
    ForkedProcess,
    Launcher,
    LauncherError,
    cleanup_confirm_seconds,
    shared_launcher,
    supervised_command,
)
from kcoral_server.lease import GpuQuarantined, LeaseArbiter
from kcoral_server.pidfd import open_pidfd
from kcoral_server.rank_variables import is_rank_variable
from kcoral_server.sandbox import SandboxDir, SandboxError, worker_base_environment
from kcoral_server.worker.confinement import clear_workspace

STARTUP_TIMEOUT_SECONDS = 60.0


class WorkerGone(Exception):
    """The worker's channel broke: the process died or spoke garbage."""

    def __init__(self, reason: str, *, invalid: bool = False) -> None:
        super().__init__(reason)
        self.invalid = invalid  # True: it sent something unreadable, not just EOF


class ReceiveInterrupted(Exception):
    """``receive`` was woken by ``interrupt_receive`` (the request is being cancelled)."""


class WorkerStartError(Exception):
    """The worker did not become ready."""


@dataclass
class LeaseClock:
    """Lease timings of the current request, measured by the front-end (seconds)."""

    wait_total: float = 0.0
    held_total: float = 0.0
    waiting_since: float | None = None
    held_since: float | None = None

    def wait_so_far(self, now: float) -> float:
        return self.wait_total + (now - self.waiting_since if self.waiting_since else 0.0)

    def held_so_far(self, now: float) -> float:
        return self.held_total + (now - self.held_since if self.held_since else 0.0)


@dataclass
class WorkerInfo:
    pid: int
    target: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    device_uuid: str | None = None


def worker_environment(
    device: str, gpu_ids: Sequence[int], gpu_uuids: Sequence[str], deny: Sequence[str] = ()
) -> dict:
    """Environment of a new worker: the front-end's without KCoral secrets and ``deny``ed
    variables; otherwise unchanged on CPU, pinned to its GPUs on a GPU."""
    env = worker_base_environment(os.environ, deny)
    if device == "cpu":
        return env
    for name in list(env):
        if is_rank_variable(name):
            del env[name]
    devices = [
        uuid if uuid else str(gpu)
        for gpu, uuid in zip(gpu_ids, _padded(gpu_uuids, gpu_ids), strict=False)
    ]
    env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    return env


def _padded(uuids: Sequence[str], ids: Sequence[int]) -> list[str]:
    return list(uuids) + [""] * (len(ids) - len(uuids))


def _sandbox_dir(config: Any, device: str, gpu_ids: Sequence[int], env: dict) -> SandboxDir:
    paths = getattr(config, "sandbox_readonly_paths", None) or []
    token_file = getattr(config, "auth_token_file", None)
    return SandboxDir(
        readonly_paths=paths,
        device=device,
        gpu_ids=gpu_ids,
        environ=env,
        hidden_paths=[token_file] if token_file is not None else [],
    )


class SeatSandbox:
    """One seat's bubblewrap sandbox, kept across its workers: a sandbox directory and a fork
    server started inside it, so that a fresh sandboxed worker is a fork (~25 ms) rather than
    a ``bwrap`` start plus an interpreter's imports.

    Who can reach what: everything a program leaves in the sandbox's ``HOME`` and caches
    stays for the seat's next workers, so the sandbox belongs to one ``identity`` at a time
    (``Pool.serve_identity`` discards it for another); the workspace and ``/tmp`` are emptied
    before every new worker. Created lazily, in the launch thread (directories, processes)."""

    def __init__(self, *, config: Any, device: str, gpu_ids: Sequence[int]) -> None:
        self.config = config
        self.device = device
        self.gpu_ids = list(gpu_ids)
        self.identity: str | None = None
        self.dir: SandboxDir | None = None
        self._launcher: Launcher | None = None
        self._lock = threading.Lock()
        self._closed = False

    def launch(self, fd: int, env: dict[str, str], cgroups: Sequence[str]) -> ForkedProcess:
        """Fork a worker inside the sandbox (blocking). ``env`` is the worker's environment
        outside; it is translated (§14 variables). Raises ``LauncherError``."""
        with self._lock:
            if self._closed:
                raise LauncherError("the seat's sandbox is closed")
            if self.dir is not None and not clear_workspace(str(self.dir.host_dir)):
                self._discard()  # a workspace the front-end cannot empty: start afresh
            if self.dir is None:
                self.dir = _sandbox_dir(self.config, self.device, self.gpu_ids, env)
                self._launcher = Launcher(wrap=self.dir.command)
            assert self._launcher is not None
            launcher_env = self.dir.environment(env)
            for name in list(launcher_env):
                if name.startswith("KCORAL_WORKER_"):
                    del launcher_env[name]  # per-worker limit notes
            return self._launcher.launch(
                fd, self.dir.environment(env), cgroups=cgroups, launcher_env=launcher_env
            )

    def _discard(self) -> None:
        if self._launcher is not None:
            self._launcher.close()
            self._launcher = None
        if self.dir is not None:
            self.dir.remove()
            self.dir = None

    def close(self) -> None:
        """Stop the fork server (its workers are gone already) and remove the directory
        (blocking)."""
        with self._lock:
            self._closed = True
            self._discard()


class WorkerHandle:
    """One worker process of a seat (or a transient GPU-set worker)."""

    def __init__(
        self,
        *,
        seat_id: str,
        generation: int,
        device: str,
        gpu_ids: Sequence[int],
        gpu_uuids: Sequence[str],
        arbiter: LeaseArbiter | None,
        sandbox: str = "none",
        log_programs: bool = True,
        allowed_serialization: Sequence[str] = ("json", "pickle"),
        transient: bool = False,
        on_gone: Callable[[WorkerHandle], None] | None = None,
        config: Any = None,
        events: Any = None,
        seats: int = 1,
        seat_sandbox: SeatSandbox | None = None,
    ) -> None:
        self.seat_id = seat_id
        self.generation = generation
        self.device = device
        self.gpu_ids = list(gpu_ids)
        self.gpu_uuids = list(gpu_uuids)
        self.arbiter = arbiter if device != "cpu" else None
        self.sandbox = sandbox
        self.log_programs = log_programs
        self.allowed_serialization = list(allowed_serialization)
        self.transient = transient
        self.on_gone = on_gone
        self.config = config  # ServerConfig: read-only paths and limits (None: no limits)
        self.events = events  # EventLog for worker_limit_exceeded (optional)
        self.seats = seats  # workers sharing the machine's memory (the default memory limit)
        self.seat_sandbox = seat_sandbox if sandbox == "bubblewrap" else None
        self._identity: str | None = None
        self._owns_sandbox_dir = True  # False: the seat's sandbox directory, not removed here
        self.sandbox_dir: SandboxDir | None = None
        self._launch_lock = threading.Lock()
        self._abandoned = False
        self.cgroup: limits.WorkerCgroup | None = None
        self.process: subprocess.Popen | ForkedProcess | None = None
        self.channel: ipc.AsyncChannel | None = None
        self.info: WorkerInfo | None = None
        # A deque and the futures of waiting receives, not an ``asyncio.Queue``: ``receive``
        # is on every request's path (~6 messages each), and its timeout is a timer on the
        # waiter rather than ``wait_for`` (a task per call before Python 3.12).
        self._inbox: deque[Any] = deque()
        self._receivers: list[asyncio.Future] = []
        self.gone: WorkerGone | None = None
        self.request_id: str | None = None
        self.lease = LeaseClock()
        self.holds_lease = False
        self._acquire_task: asyncio.Task | None = None
        self._exit_event = asyncio.Event()
        self._exit_watch: asyncio.Task | None = None
        #: told "lease_wait" / "lease_held" during a request (jobs report lease phases)
        self.on_lease: Callable[[str], None] | None = None
        self._interrupted = False
        #: why ``kill`` could not confirm that the process tree is gone (None: confirmed or
        #: not killed yet); the pool quarantines the worker's GPUs (SERVER §8, §11)
        self.cleanup_unconfirmed: str | None = None
        self.killed = False  # ``kill`` ran to its end (it is not repeated)
        #: set when a GPU this worker needs was quarantined: its request answers 503
        self.quarantined = False

    @property
    def identity(self) -> str | None:
        """The identity whose programs this worker (and its seat's sandbox) ran: a worker
        never serves two, the pool replaces it first (``Pool.serve_identity``)."""
        if self.seat_sandbox is not None:
            return self.seat_sandbox.identity
        return self._identity

    @identity.setter
    def identity(self, name: str | None) -> None:
        self._identity = name
        if self.seat_sandbox is not None:
            self.seat_sandbox.identity = name

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def survivors(self) -> int:
        """Descendants the launcher found alive after ``SIGKILL`` when it reported the exit
        (-1: unknown, the launcher went away); 0 for spawned workers, whose accountant does
        not exit while any remain."""
        return getattr(self.process, "survivors", 0)

    @property
    def returncode(self) -> int | None:
        return self.process.poll() if self.process is not None else None

    # ------------------------------------------------------------------ start-up

    async def start(self, timeout: float = STARTUP_TIMEOUT_SECONDS) -> WorkerInfo:
        """Launch the process and wait for ``WorkerReady`` (lease requests are served)."""
        loop = asyncio.get_running_loop()
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

        def launch() -> subprocess.Popen | ForkedProcess:
            process = self._fork_in_seat_sandbox(child.fileno())
            if process is None:
                process = self._fork_or_spawn(child.fileno())
            with self._launch_lock:
                self.process = process
                abandoned = self._abandoned
            if abandoned:
                self._kill_now()
            return process

        # Forking a big front-end takes a while; keep it off the IO loop.
        launching = loop.run_in_executor(None, launch)
        try:
            # shielded: a cancellation must not cancel the future the launch reports to
            self.process = await asyncio.shield(launching)
        except (OSError, SandboxError) as exc:
            parent.close()
            self._remove_confinement()
            raise WorkerStartError(f"cannot launch worker: {exc}") from None
        except asyncio.CancelledError:
            with self._launch_lock:
                self._abandoned = True  # a launch still running in the thread kills itself
                launched = self.process is not None
            if launched:
                self._kill_now()
            else:
                # Wait for that: a shutdown must not exit while the thread still creates a
                # sandbox directory or a process nobody would remove.
                with contextlib.suppress(BaseException):
                    await launching
                if self.process is None:
                    self._remove_confinement()  # the launch failed after making them
            parent.close()
            raise
        finally:
            child.close()
        self.channel = ipc.AsyncChannel(parent, sink=self._on_channel_item)
        self._exit_watch = asyncio.ensure_future(self._watch_exit())
        self.send(
            ipc.Configure(
                worker_id=self.seat_id,
                generation=self.generation,
                device=self.device,
                gpu_ids=self.gpu_ids,
                gpu_uuids=self.gpu_uuids,
                sandbox=self.sandbox,
                log_programs=self.log_programs,
                allowed_serialization=self.allowed_serialization,
                transient=self.transient,
            )
        )
        try:
            message, fds = await self.receive(timeout)
        except (asyncio.TimeoutError, TimeoutError):
            raise WorkerStartError("worker start-up timed out") from None
        except WorkerGone as exc:
            raise WorkerStartError(f"worker exited during start-up: {exc}") from None
        except asyncio.CancelledError:
            self._abandon()  # e.g. a replacement cancelled by shutdown: leave nothing behind
            raise
        _close_fds(fds)
        if isinstance(message, ipc.WorkerStartFailed):
            raise WorkerStartError(message.error)
        if not isinstance(message, ipc.WorkerReady):
            raise WorkerStartError(f"unexpected start-up message {message.tag!r}")
        if (
            self.device == "gpu"
            and self.gpu_uuids
            and len(self.gpu_ids) == 1
            and message.device_uuid
            and message.device_uuid != self.gpu_uuids[0]
        ):
            raise WorkerStartError(
                f"worker reports device {message.device_uuid}, expected {self.gpu_uuids[0]}"
            )
        self.info = WorkerInfo(message.pid, message.target, message.versions, message.device_uuid)
        self.release_lease()
        if self.request_id is None:
            self.lease = LeaseClock()  # start-up leasing of a seat is not part of a request
        return self.info

    def _fork_or_spawn(self, fd: int) -> subprocess.Popen | ForkedProcess:
        """Without a seat sandbox: forked from the shared launcher when unsandboxed (it
        enters its cgroup itself, before running anything), else spawned."""
        command, env = self._launch_command(fd)
        assert self.cgroup is not None
        if self.sandbox != "bubblewrap":
            process = _fork_worker(fd, env, self.cgroup.procs_files, self._deny)
            if process is not None:
                return process
        command = self.cgroup.wrap(command)
        if self.sandbox != "bubblewrap":
            # bubblewrap's PID namespace and --die-with-parent supervise a sandboxed worker;
            # any other spawned one gets a supervisor process (SERVER §11)
            command = supervised_command(command, env)
        return subprocess.Popen(command, pass_fds=(fd,), env=env, start_new_session=True)

    def _fork_in_seat_sandbox(self, fd: int) -> ForkedProcess | None:
        """A worker forked by the seat's sandboxed fork server, in its limits' cgroup; None
        when there is none (or it failed: the worker is then spawned in its own sandbox)."""
        if self.seat_sandbox is None or os.environ.get(LAUNCH_ENV, "fork") == "spawn":
            return None
        env = worker_environment(self.device, self.gpu_ids, self.gpu_uuids, self._deny)
        wanted = limits.limits_from_config(self.config, seats=self.seats)
        cgroup = limits.create_cgroup(wanted)
        env.update(limits.worker_limit_environment(wanted, cgroup, self.device))
        try:
            process = self.seat_sandbox.launch(fd, env, cgroup.procs_files)
        except (LauncherError, SandboxError, OSError):
            cgroup.remove()
            return None
        self.cgroup = cgroup
        self.sandbox_dir = self.seat_sandbox.dir
        self._owns_sandbox_dir = False
        return process

    @property
    def _deny(self) -> list[str]:
        return list(getattr(self.config, "worker_env_deny", None) or [])

    def _launch_command(self, fd: int) -> tuple[list[str], dict[str, str]]:
        """Command (in the sandbox when it is on; not yet in its cgroup: ``self.cgroup``
        wraps or the launcher moves it) and environment of the worker (SERVER §6, §14)."""
        env = worker_environment(self.device, self.gpu_ids, self.gpu_uuids, self._deny)
        command = [sys.executable, "-m", "kcoral_server.worker", "--fd", str(fd)]
        if self.sandbox == "bubblewrap":
            self.sandbox_dir = _sandbox_dir(self.config, self.device, self.gpu_ids, env)
            self._owns_sandbox_dir = True
            env = self.sandbox_dir.environment(env)
            command = self.sandbox_dir.command(command)
        wanted = limits.limits_from_config(self.config, seats=self.seats)
        self.cgroup = limits.create_cgroup(wanted)
        env.update(limits.worker_limit_environment(wanted, self.cgroup, self.device))
        return command, env

    def _kill_now(self) -> None:
        """Blocking SIGKILL of the tree, then clean-up: for a start-up that was cancelled
        (e.g. a replacement during shutdown), which nobody will ``kill``."""
        if self.process is not None and self.process.poll() is None:
            _signal_all(
                [self.process.pid, *descendants(self.process.pid)],
                signal.SIGKILL,
                group=self.process.pid,
            )
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(5)
        self._remove_confinement()

    def _abandon(self) -> None:
        self._kill_now()
        self.close()

    def _remove_confinement(self) -> None:
        """Drop the sandbox directory and the cgroup once the process tree is gone."""
        if self.cgroup is not None:
            self.cgroup.kill_all()
            if self.cgroup.remove():
                self.cgroup = None
        if self.sandbox_dir is not None:
            if self._owns_sandbox_dir:
                self.sandbox_dir.remove()
            self.sandbox_dir = None

    # ------------------------------------------------------------------ messages

    def send(self, message: ipc.Message, fds: Sequence[int] = ()) -> None:
        if self.channel is None or self.gone is not None:
            raise WorkerGone(str(self.gone) if self.gone else "worker not started")
        opened: list[int] = []
        try:
            if self.sandbox_dir is not None and isinstance(message, ipc.RunProgram):
                message, opened = self.sandbox_dir.run_program(message, len(fds))
            self.channel.send(message, [*fds, *opened])
        except OSError as exc:
            self._mark_gone(WorkerGone(f"cannot write to worker: {exc}"))
            raise self.gone from None  # type: ignore[misc]
        finally:
            _close_fds(opened)

    async def receive(self, timeout: float | None) -> tuple[ipc.Message, list[int]]:
        """Next non-lease message; ``TimeoutError`` after ``timeout``; ``WorkerGone``."""
        while True:
            if not self._inbox:
                await self._inbox_filled(timeout)
                if not self._inbox:
                    continue  # another receive took it first
            item = self._inbox.popleft()
            if isinstance(item, WorkerGone):
                self._inbox.append(item)  # every later receive fails the same way
                raise item
            if item is not _INTERRUPT:
                return item  # type: ignore[return-value]
            if self._interrupted:
                self._interrupted = False
                raise ReceiveInterrupted()
            # a stale wake-up (cleared after the request ended): skip it

    async def _inbox_filled(self, timeout: float | None) -> None:
        """Wait until something is put in the inbox; ``TimeoutError`` after ``timeout``."""
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._receivers.append(waiter)
        timer = loop.call_later(timeout, _expire, waiter) if timeout is not None else None
        try:
            filled = await waiter
        finally:
            if timer is not None:
                timer.cancel()
            with contextlib.suppress(ValueError):
                self._receivers.remove(waiter)
        if not filled:
            raise TimeoutError()

    def _put(self, item: Any) -> None:
        self._inbox.append(item)
        receivers, self._receivers = self._receivers, []
        for waiter in receivers:
            if not waiter.done():
                waiter.set_result(True)

    def interrupt_receive(self) -> None:
        """Wake the current (or next) ``receive`` with ``ReceiveInterrupted``."""
        self._interrupted = True
        self._put(_INTERRUPT)

    def clear_interrupt(self) -> None:
        """Forget a pending ``interrupt_receive`` (its request is over)."""
        self._interrupted = False

    def begin_request(self, request_id: str) -> None:
        self.request_id = request_id
        now = time.monotonic()
        self.lease = LeaseClock(
            waiting_since=now if self.lease.waiting_since else None,
            held_since=now if self.holds_lease else None,
        )

    def end_request(self) -> None:
        now = time.monotonic()
        if self.lease.waiting_since is not None:
            self.lease.wait_total += now - self.lease.waiting_since
            self.lease.waiting_since = None
        if self.lease.held_since is not None:
            self.lease.held_total += now - self.lease.held_since
            self.lease.held_since = None if not self.holds_lease else now

    def _on_channel_item(self, item: ipc.ChannelItem) -> None:
        """Called by the channel (from its reader callback) for each message, in order, and
        once with the exception that broke it."""
        if isinstance(item, BaseException):
            if isinstance(item, ipc.IpcError):
                self._mark_gone(WorkerGone(f"invalid worker message: {item}", invalid=True))
            else:
                self._mark_gone(WorkerGone(f"channel closed: {item}"))
            return
        message, fds = item
        if isinstance(message, ipc.LeaseAcquire):
            _close_fds(fds)
            self._on_lease_acquire()
        elif isinstance(message, ipc.LeaseRelease):
            _close_fds(fds)
            self.release_lease()
        else:
            self._put(item)

    def _on_lease_acquire(self) -> None:
        if self.arbiter is None or not self.gpu_ids:
            self._grant()  # a CPU worker should never ask; never leave it blocked
            return
        if self.holds_lease:
            self._grant()
            return
        if self._acquire_task is not None and not self._acquire_task.done():
            return
        self.lease.waiting_since = time.monotonic()
        self._lease_phase("lease_wait")
        self._acquire_task = asyncio.ensure_future(self._acquire())

    def _lease_phase(self, phase: str) -> None:
        if self.on_lease is not None:
            with contextlib.suppress(Exception):  # an observer never breaks leasing
                self.on_lease(phase)

    async def _acquire(self) -> None:
        assert self.arbiter is not None
        try:
            await self.arbiter.acquire(self, self.gpu_ids, request_id=self.request_id)
        except GpuQuarantined as exc:
            # The worker stays blocked (never granted); its request sees it gone and
            # answers 503, and whoever cleans up kills it without the lease.
            self.quarantined = True
            self._mark_gone(WorkerGone(str(exc)))
            return
        now = time.monotonic()
        if self.lease.waiting_since is not None:
            self.lease.wait_total += now - self.lease.waiting_since
            self.lease.waiting_since = None
        self.holds_lease = True
        self.lease.held_since = now
        if self.gone is not None:
            return  # the dead worker keeps it until whoever cleans up releases it
        self._lease_phase("lease_held")
        self._grant()

    def _grant(self) -> None:
        with contextlib.suppress(WorkerGone):
            self.send(ipc.LeaseGranted())

    @property
    def waiting_for_lease(self) -> bool:
        return self.lease.waiting_since is not None

    def release_lease(self) -> None:
        if self.lease.held_since is not None:
            self.lease.held_total += time.monotonic() - self.lease.held_since
            self.lease.held_since = None
        if self.arbiter is not None and self.holds_lease:
            self.arbiter.release(self, self.gpu_ids)
        self.holds_lease = False

    def _mark_gone(self, gone: WorkerGone) -> None:
        if self.gone is None:
            hit = limits.limit_message(self.cgroup)
            if hit is not None:
                gone = WorkerGone(f"{gone}; {hit}", invalid=gone.invalid)
                if self.events is not None:
                    self.events.emit(
                        "worker_limit_exceeded",
                        "WARNING",
                        worker_id=self.seat_id,
                        generation=self.generation,
                        pid=self.pid,
                        request_id=self.request_id,
                        message=hit,
                    )
            self.gone = gone
            self._put(gone)
            if self.on_gone is not None:
                self.on_gone(self)

    # ------------------------------------------------------------------ exit and kill

    async def _watch_exit(self) -> None:
        """Notice the process's death by its pid, not only by the channel's EOF (a forked
        descendant may hold the worker's end open): the channel then fails behind every
        frame already received. ``_exit_event`` is set once the exit code is known, which for
        a forked worker also means the launcher has killed what it left behind."""
        process = self.process
        assert process is not None
        # Both descriptors are the watcher's own: ``poll`` may close the status pipe's
        # original at any time, and the loop must never watch a closed (reusable) number.
        try:
            pidfd = open_pidfd(process.pid)  # None without pidfds: report or polling below
        except ProcessLookupError:
            pidfd = None  # already gone: the status pipe or poll() tells
        status_fd = getattr(process, "status_fd", None)
        report: int | None = None
        if status_fd is not None:
            with contextlib.suppress(OSError):
                report = os.dup(status_fd)
        try:
            watched = [fd for fd in (pidfd, report) if fd is not None]
            if watched:
                await _readable(watched)  # death, or the report of a death
            else:
                while process.poll() is None:
                    await asyncio.sleep(0.02)
            self._process_exited()
            if report is not None:
                await _readable([report])  # the exit code is written (or the launcher left)
        finally:
            for fd in (pidfd, report):
                if fd is not None:
                    os.close(fd)
        while process.poll() is None:
            await asyncio.sleep(0.02)  # a launcher that died before reporting
        self._exit_event.set()

    def _process_exited(self) -> None:
        if self.channel is not None and self.gone is None:
            self.channel.finish(EOFError("worker process exited"))

    async def wait_exit(self, timeout: float | None) -> bool:
        """Wait for the process to exit; True when it did within ``timeout``."""
        if self.process is None:
            return True
        try:
            await asyncio.wait_for(self._exit_event.wait(), timeout)
        except (asyncio.TimeoutError, TimeoutError):
            return self.process.poll() is not None
        return True

    async def stop(self, timeout: float, grace: float) -> bool:
        """Ask the worker to exit (``Shutdown``); True if it exited within ``timeout``.

        The lease is kept until the process is gone (a dying CUDA context must not overlap
        another one).
        """
        with contextlib.suppress(WorkerGone):
            self.send(ipc.Shutdown())
        exited = await self.wait_exit(timeout)
        if not exited:
            return False
        await self.kill(grace)  # stray descendants
        return True

    async def kill(self, grace: float) -> None:
        """Kill the whole process tree (SIGTERM, SIGKILL after ``grace``) and close up.

        The caller holds the lease (or ensures the GPU is not in use). Afterwards
        ``cleanup_unconfirmed`` says whether the tree's end could not be confirmed: no exit
        report within ``cleanup_confirm_seconds()`` of the SIGKILL, or one that counts
        descendants which survived it."""
        if self.process is None or self.killed:
            return
        # A spawned worker runs under an accountant (its supervisor, or bubblewrap with its
        # PID namespace) that exits only once everything below it is gone: it is never
        # signalled itself, so that its exit stays proof of the clean-up.
        process = self.process
        accountant = not isinstance(process, ForkedProcess)

        def tree(known: list[int]) -> list[int]:
            """The tree's live processes: ``known`` ones still alive, descendants found since,
            and the worker itself (first) unless an accountant looks after it."""
            found = [pid for pid in known if _alive(pid)]
            found += [pid for pid in descendants(process.pid) if pid not in found]
            if not accountant and process.poll() is None and process.pid not in found:
                found.insert(0, process.pid)
            return found

        def group() -> int | None:
            return None if accountant else self._group()

        try:
            pids = tree([])
            _signal_all(pids, signal.SIGTERM, group=group())
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                pids = tree(pids)
                if not pids and (not accountant or process.poll() is not None):
                    break
                await asyncio.sleep(0.02)
            _signal_all(tree(pids), signal.SIGKILL, group=group())
            confirm = cleanup_confirm_seconds()
            if not await self.wait_exit(confirm):
                self.cleanup_unconfirmed = (
                    f"worker {process.pid}: no exit report {confirm:g} s after SIGKILL"
                )
            elif self.survivors:
                survivors = self.survivors
                self.cleanup_unconfirmed = f"worker {process.pid}: " + (
                    "its launcher died before reporting on its descendants"
                    if survivors < 0
                    else f"{survivors} descendant(s) survived SIGKILL"
                )
            if self.cleanup_unconfirmed is None and (
                self.cgroup is not None or self.sandbox_dir is not None
            ):
                await asyncio.get_running_loop().run_in_executor(None, self._remove_confinement)
            self.close()
            self.killed = True
        except asyncio.CancelledError:
            self._abandon()  # e.g. shutdown cancelled a replacement while it killed the old one
            raise

    def _group(self) -> int | None:
        """The worker's process group while it can still have members: once the exit code
        is known the whole tree is gone (the launcher or the supervisor saw to it) and the
        number may name someone else's group."""
        if self.process is None or self.process.returncode is not None:
            return None
        return self.process.pid

    def close(self) -> None:
        if self._acquire_task is not None and not self._acquire_task.done():
            self._acquire_task.cancel()
        if self.arbiter is not None:
            self.arbiter.withdraw(self)
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.gone is None:
            self.gone = WorkerGone("worker closed")
            self._put(self.gone)
        if self.returncode is not None:
            self._remove_confinement()  # normally done by kill(); never leave it behind


_INTERRUPT = object()


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(False)  # a result, not an exception: none left unretrieved


async def _readable(fds: Sequence[int]) -> None:
    """Wait until one of ``fds`` is readable (the readers are gone again on return)."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    for fd in fds:
        loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        for fd in fds:
            loop.remove_reader(fd)


#: ``spawn`` turns the fork server off (every worker is a new interpreter)
LAUNCH_ENV = "KCORAL_WORKER_LAUNCH"


def _fork_worker(
    fd: int, env: dict[str, str], cgroups: Sequence[str], deny: Sequence[str]
) -> ForkedProcess | None:
    """An unsandboxed worker is forked from the preloaded launcher (~25 ms instead of an
    interpreter start plus imports); it moves itself into ``cgroups`` first. ``None``: spawn
    it."""
    if os.environ.get(LAUNCH_ENV, "fork") == "spawn":
        return None
    try:
        return shared_launcher().launch(
            fd, env, cgroups=cgroups, launcher_env=worker_base_environment(os.environ, deny)
        )
    except LauncherError:
        return None  # the launcher is broken: spawning still works


def descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (walking ``/proc/<pid>/task/*/children``)."""
    found: list[int] = []
    stack = [pid]
    while stack:
        current = stack.pop()
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{current}/task/{task}/children") as f:
                    children = [int(c) for c in f.read().split()]
            except (OSError, ValueError):
                continue
            for child in children:
                if child not in found:
                    found.append(child)
                    stack.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _signal_all(pids: Sequence[int], sig: int, *, group: int | None) -> None:
    if group is not None:
        with contextlib.suppress(OSError):
            os.killpg(group, sig)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def _close_fds(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
