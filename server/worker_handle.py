"""One worker process: launch, exit, kill (SERVER §6, §8, §11).

A handle owns the process and composes the worker's other two ideas: its ``channel``
(``WorkerChannel``: the inbox of messages, interrupts) and its ``lease``
(``LeaseHolder``: the GPUs it may use and the current request's lease clock). Whoever
drives a request receives through ``handle.channel`` and times through ``handle.lease``;
only the pool starts, stops and kills a handle.

Who can reach what: the worker runs *programs* (uploaded code). It is launched by
``kcoral_server.worker_launch`` (environment without secrets, seat sandbox, fork server)
and runs inside its limits (``kcoral_server.limits``) from its first instruction.
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kcoral_server import ipc, limits, procfs
from kcoral_server.launcher import (
    ForkedProcess,
    LauncherError,
    LauncherRefused,
    cleanup_confirm_seconds,
    supervised_command,
)
from kcoral_server.lease import LeaseArbiter
from kcoral_server.pidfd import open_pidfd
from kcoral_server.sandbox import SandboxDir, SandboxError
from kcoral_server.worker_channel import ReceiveInterrupted, WorkerChannel, WorkerGone, close_fds
from kcoral_server.worker_launch import (
    LAUNCH_ENV,
    SeatSandbox,
    fork_worker,
    sandbox_dir_for,
    worker_environment,
)
from kcoral_server.worker_lease import LeaseHolder

__all__ = ["ReceiveInterrupted", "SeatSandbox", "WorkerGone", "WorkerHandle", "WorkerStartError"]

STARTUP_TIMEOUT_SECONDS = 60.0


class WorkerStartError(Exception):
    """The worker did not become ready."""


@dataclass
class WorkerInfo:
    pid: int
    target: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    device_uuid: str | None = None


def event_fields(handle: WorkerHandle) -> dict[str, Any]:
    """Who a worker is in an event: its seat, generation, pid and current request."""
    return {
        "worker_id": handle.seat_id,
        "generation": handle.generation,
        "pid": handle.pid,
        "request_id": handle.request_id,
    }


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
        self.gpu_uuids = list(gpu_uuids)
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
        self.info: WorkerInfo | None = None
        self.lease = LeaseHolder(
            arbiter if device != "cpu" else None,
            gpu_ids,
            grant=self._grant,
            refused=lambda why: self.channel.fail(WorkerGone(why)),
        )
        self.channel = WorkerChannel(
            on_lease=self._lease_message, describe=self._describe_gone, on_gone=self._gone
        )
        self._exit_event = asyncio.Event()
        self._exit_watch: asyncio.Task | None = None
        #: why ``kill`` could not confirm that the process tree is gone (None: confirmed or
        #: not killed yet); the pool quarantines the worker's GPUs (SERVER §8, §11)
        self.cleanup_unconfirmed: str | None = None
        self.killed = False  # ``kill`` ran to its end (it is not repeated)
        # ipc.ProgressSlot shared with this process; unmapped with the handle (not by
        # ``close``: a crashed program's instruction is read from it after the kill)
        self._progress: ipc.ProgressSlot | None = None
        self._progress_unavailable = False

    @property
    def gpu_ids(self) -> list[int]:
        return self.lease.gpu_ids

    @property
    def gone(self) -> WorkerGone | None:
        """Why the worker's channel broke (None while it works)."""
        return self.channel.gone

    @property
    def request_id(self) -> str | None:
        """The request this worker runs (or ran last)."""
        return self.lease.request_id

    async def take_gpu_set(
        self, count: int, request_id: str, uuid_of: Callable[[int], str]
    ) -> list[int]:
        """PROTOCOL §6.5: lease any ``count`` GPUs before this (transient) worker starts;
        they become its GPUs. See ``LeaseHolder.take_set``."""
        gpu_ids = await self.lease.take_set(count, request_id)
        uuids = [uuid_of(gpu) for gpu in gpu_ids]
        self.gpu_uuids = uuids if all(uuids) else []
        return gpu_ids

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
        self.channel.attach(parent)
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
            message, fds = await self.channel.receive(timeout)
        except (asyncio.TimeoutError, TimeoutError):
            raise WorkerStartError("worker start-up timed out") from None
        except WorkerGone as exc:
            raise WorkerStartError(f"worker exited during start-up: {exc}") from None
        except asyncio.CancelledError:
            self._abandon()  # e.g. a replacement cancelled by shutdown: leave nothing behind
            raise
        close_fds(fds)
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
        self.lease.release()
        self.lease.forget_start_up()
        return self.info

    def _fork_or_spawn(self, fd: int) -> subprocess.Popen | ForkedProcess:
        """Without a seat sandbox: forked from the shared launcher when unsandboxed (it
        enters its cgroup itself, before running anything), else spawned."""
        command, env = self._launch_command(fd)
        assert self.cgroup is not None
        if self.sandbox != "bubblewrap":
            process = fork_worker(fd, env, self.cgroup.procs_files, self._deny, self.config)
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
        except LauncherRefused:
            cgroup.remove()
            raise  # the fork rule was broken (SERVER §1): reported, not worked around
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
            self.sandbox_dir = sandbox_dir_for(self.config, self.device, self.gpu_ids, env)
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
            procfs.signal_all(
                [self.process.pid, *procfs.descendants(self.process.pid)],
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
        """Send ``message``; a ``RunProgram`` to a sandboxed worker gets the descriptors of
        its capture files, opened by the front-end (SERVER §14)."""
        opened: list[int] = []
        try:
            if (
                self.sandbox_dir is not None
                and isinstance(message, ipc.RunProgram)
                and self.channel.gone is None
            ):
                try:
                    message, opened = self.sandbox_dir.run_program(message, len(fds))
                except OSError as exc:
                    self.channel.fail(WorkerGone(f"cannot write to worker: {exc}"))
                    raise self.channel.gone from None  # type: ignore[misc]
            self.channel.send(message, [*fds, *opened])
        finally:
            close_fds(opened)

    def progress_slot(self) -> tuple[ipc.ProgressSlot | None, int | None]:
        """This worker's progress slot, plus its memfd when the worker has not been sent it
        yet (the caller sends it with the program, then closes it). ``(None, None)`` where
        memfds cannot be sealed: the worker then reports every instruction by frame."""
        if self._progress is not None or self._progress_unavailable:
            return self._progress, None
        try:
            self._progress, fd = ipc.ProgressSlot.create()
        except (OSError, AttributeError, ValueError):  # no memfd_create, seals or mmap
            self._progress_unavailable = True
            return None, None
        return self._progress, fd

    def _lease_message(self, message: ipc.Message) -> None:
        if isinstance(message, ipc.LeaseAcquire):
            self.lease.worker_asks(lambda: self.gone is not None)
        else:
            self.lease.release()

    def _grant(self) -> None:
        with contextlib.suppress(WorkerGone):
            self.channel.send(ipc.LeaseGranted())

    def _describe_gone(self, gone: WorkerGone) -> WorkerGone:
        """Name the limit the worker hit, if that is why it is gone (and log it)."""
        hit = limits.limit_message(self.cgroup)
        if hit is None:
            return gone
        if self.events is not None:
            self.events.emit("worker_limit_exceeded", "WARNING", **event_fields(self), message=hit)
        return WorkerGone(f"{gone}; {hit}", invalid=gone.invalid)

    def _gone(self) -> None:
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
            self.channel.process_exited()
            if report is not None:
                await _readable([report])  # the exit code is written (or the launcher left)
        finally:
            for fd in (pidfd, report):
                if fd is not None:
                    os.close(fd)
        while process.poll() is None:
            await asyncio.sleep(0.02)  # a launcher that died before reporting
        self._exit_event.set()

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
            self.channel.send(ipc.Shutdown())
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
            found = [pid for pid in known if procfs.is_alive(pid)]
            found += [pid for pid in procfs.descendants(process.pid) if pid not in found]
            if not accountant and process.poll() is None and process.pid not in found:
                found.insert(0, process.pid)
            return found

        def group() -> int | None:
            return None if accountant else self._group()

        try:
            pids = tree([])
            procfs.signal_all(pids, signal.SIGTERM, group=group())
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                pids = tree(pids)
                if not pids and (not accountant or process.poll() is not None):
                    break
                await asyncio.sleep(0.02)
            procfs.signal_all(tree(pids), signal.SIGKILL, group=group())
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
        """Stop asking for the lease and reading the channel (the process is not touched)."""
        self.lease.withdraw()
        self.channel.close()
        if self.returncode is not None:
            self._remove_confinement()  # normally done by kill(); never leave it behind


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
