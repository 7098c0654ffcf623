"""How a worker process is launched (SERVER §6, §11, §14).

Three ways, tried in this order: forked by the seat's sandboxed fork server (bubblewrap
seats), forked by the shared launcher (unsandboxed workers: it enters its cgroup itself,
before running anything), else spawned (``python -m kcoral_server.worker``, wrapped into its
cgroup, in its own sandbox or under a supervisor). Each way confines the process from its
first instruction: limits' cgroup, environment without secrets (``processes.launch``).

``WorkerConfinement`` records what a launch created (cgroup, sandbox directory) as soon as it
exists, so that a launch failing half-way leaves nothing behind. ``WorkerProcess`` launches
in a thread (forking a big front-end takes a while) and, when its caller is cancelled
mid-launch, makes sure that neither a process nor its confinement outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from kcoral_server.processes import cgroups, ipc, limits
from kcoral_server.processes.exit import kill_tree_now
from kcoral_server.processes.launch import (
    SeatSandbox,
    fork_worker,
    sandbox_dir_for,
    worker_environment,
    workers_are_spawned,
)
from kcoral_server.processes.launcher.front_end import (
    ForkedProcess,
    LauncherError,
    LauncherRefused,
    supervised_command,
)
from kcoral_server.processes.sandbox import SandboxDir, SandboxError

__all__ = [
    "STARTUP_TIMEOUT_SECONDS",
    "LaunchSpec",
    "WorkerConfinement",
    "WorkerInfo",
    "WorkerProcess",
    "WorkerStartError",
    "launch_worker",
    "ready_info",
]

STARTUP_TIMEOUT_SECONDS = 60.0


class WorkerStartError(Exception):
    """The worker did not become ready."""


@dataclass
class WorkerInfo:
    pid: int
    target: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    device_uuid: str | None = None


@dataclass
class LaunchSpec:
    """What a worker is launched with (read from its handle at launch time)."""

    device: str
    gpu_ids: Sequence[int]
    gpu_uuids: Sequence[str]
    sandbox: str
    config: Any  # ServerConfig: read-only paths and limits (None: no limits)
    seats: int
    seat_sandbox: SeatSandbox | None
    #: no program waits for it (a spare): forked after its launcher's preload (``Launcher``)
    after_preload: bool = False

    @property
    def deny(self) -> list[str]:
        denied = list(getattr(self.config, "worker_env_deny", None) or [])
        return denied + list(getattr(self.config, "worker_env_withheld", None) or ())


class WorkerConfinement:
    """The cgroup and sandbox directory of one worker process, removed once it is gone."""

    def __init__(self) -> None:
        self.cgroup: cgroups.WorkerCgroup | None = None
        self.sandbox_dir: SandboxDir | None = None
        self.owns_sandbox_dir = True  # False: the seat's sandbox directory, not removed here

    @property
    def present(self) -> bool:
        return self.cgroup is not None or self.sandbox_dir is not None

    def remove(self) -> None:
        """Drop the sandbox directory and the cgroup once the process tree is gone."""
        if self.cgroup is not None:
            self.cgroup.kill_all()
            if self.cgroup.remove():
                self.cgroup = None
        if self.sandbox_dir is not None:
            if self.owns_sandbox_dir:
                self.sandbox_dir.remove()
            self.sandbox_dir = None


class WorkerProcess:
    """The operating-system side of one worker: its process, once launched, and its
    confinement."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | ForkedProcess | None = None
        self.confinement = WorkerConfinement()
        self._lock = threading.Lock()
        self._abandoned = False

    async def launch(
        self, spec: Callable[[], LaunchSpec], fd: int, *, hold: bool = False
    ) -> subprocess.Popen | ForkedProcess:
        """Launch the worker (``spec`` is read in the launching thread) with ``fd`` as its
        end of the channel; ``WorkerStartError`` when it cannot be launched. ``hold``: fork
        it ahead, held in its cgroups until ``release`` (only a fork can be held)."""
        loop = asyncio.get_running_loop()

        def launch() -> subprocess.Popen | ForkedProcess:
            process = launch_worker(spec(), self.confinement, fd, hold=hold)
            with self._lock:
                self.process = process
                abandoned = self._abandoned
            if abandoned:
                self.kill_now()
            return process

        # Forking a big front-end takes a while; keep it off the IO loop.
        launching = loop.run_in_executor(None, launch)
        try:
            # shielded: a cancellation must not cancel the future the launch reports to
            self.process = await asyncio.shield(launching)
        except (OSError, SandboxError) as exc:
            self.confinement.remove()
            raise WorkerStartError(f"cannot launch worker: {exc}") from None
        except Exception as exc:  # a bug must cost this start (retried), not the seat
            self.confinement.remove()
            raise WorkerStartError(f"cannot launch worker: {exc!r}") from None
        except asyncio.CancelledError:
            with self._lock:
                self._abandoned = True  # a launch still running in the thread kills itself
                launched = self.process is not None
            if launched:
                self.kill_now()
            else:
                # Wait for that: a shutdown must not exit while the thread still creates a
                # sandbox directory or a process nobody would remove.
                with contextlib.suppress(BaseException):
                    await launching
                if self.process is None:
                    self.confinement.remove()  # the launch failed after making them
            raise
        return self.process

    async def release(self, seat_sandbox: SeatSandbox | None) -> None:
        """Let a worker forked ahead go on, its seat's sandbox directory emptied first (in a
        thread: that is file work); ``WorkerStartError`` when it cannot."""
        process = self.process
        if not isinstance(process, ForkedProcess) or not process.held:
            return
        release = process.release
        if seat_sandbox is not None:  # its directory is emptied first
            release = partial(seat_sandbox.release, process)
        try:
            await asyncio.get_running_loop().run_in_executor(None, release)
        except OSError as exc:
            raise WorkerStartError(f"cannot start the worker forked ahead: {exc}") from None
        except Exception as exc:  # emptying its directory failed otherwise: killed, not kept
            raise WorkerStartError(f"cannot start the worker forked ahead: {exc!r}") from None

    def kill_now(self) -> None:
        """Blocking SIGKILL of the tree, then clean-up: for a start-up that was cancelled
        (e.g. a replacement during shutdown), which nobody will ``kill``."""
        if self.process is not None:
            kill_tree_now(self.process)
        self.confinement.remove()


def launch_worker(
    spec: LaunchSpec, confinement: WorkerConfinement, fd: int, *, hold: bool = False
) -> subprocess.Popen | ForkedProcess:
    """Start the worker process with ``fd`` as its end of the channel (blocking: run it in
    a thread, forking a big front-end takes a while); ``hold``: see ``WorkerProcess``."""
    forked = _fork_in_seat_sandbox(spec, confinement, fd, hold=hold)
    return forked if forked is not None else _fork_or_spawn(spec, confinement, fd, hold=hold)


def _fork_or_spawn(
    spec: LaunchSpec, confinement: WorkerConfinement, fd: int, *, hold: bool = False
) -> subprocess.Popen | ForkedProcess:
    """Without a seat sandbox: forked from the shared launcher when unsandboxed (it
    enters its cgroup itself, before running anything), else spawned. Only a fork can be
    held: a spawned worker would run at once, so it is started when it is needed."""
    if hold and spec.sandbox == "bubblewrap":
        raise LauncherError("only a worker forked by its seat's sandbox can be started ahead")
    command, env = _launch_command(spec, confinement, fd)
    cgroup = confinement.cgroup
    assert cgroup is not None
    if spec.sandbox != "bubblewrap":
        process = fork_worker(
            fd,
            env,
            cgroup.procs_files,
            spec.deny,
            spec.config,
            hold=hold,
            after_preload=spec.after_preload,
        )
        if process is not None:
            return process
    if hold:  # the caller removes the confinement
        raise LauncherError("only a forked worker can be started ahead")
    command = cgroup.wrap(command)
    if spec.sandbox != "bubblewrap":
        # bubblewrap's PID namespace and --die-with-parent supervise a sandboxed worker;
        # any other spawned one gets a supervisor process (SERVER §11)
        command = supervised_command(command, env)
    # Never the front-end's stdio (the server's console): a program would read every
    # identity's console lines there, or write forged ones (launcher.log_relay).
    return subprocess.Popen(
        command,
        pass_fds=(fd,),
        env=env,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _fork_in_seat_sandbox(
    spec: LaunchSpec, confinement: WorkerConfinement, fd: int, *, hold: bool = False
) -> ForkedProcess | None:
    """A worker forked by the seat's sandboxed fork server, in its limits' cgroup; None
    when there is none (or it failed: the worker is then spawned in its own sandbox)."""
    seat_sandbox = spec.seat_sandbox
    if seat_sandbox is None or workers_are_spawned():
        return None
    env = worker_environment(spec.device, spec.gpu_ids, spec.gpu_uuids, spec.deny)
    wanted = limits.limits_from_config(spec.config, seats=spec.seats)
    cgroup = cgroups.create_cgroup(wanted)
    env.update(limits.worker_limit_environment(wanted, cgroup, spec.device))
    try:
        process = seat_sandbox.launch(
            fd, env, cgroup.procs_files, hold=hold, after_preload=spec.after_preload
        )
    except LauncherRefused:
        cgroup.remove()
        raise  # the fork rule was broken (SERVER §1): reported, not worked around
    except (LauncherError, SandboxError, OSError):
        cgroup.remove()
        return None
    confinement.cgroup = cgroup
    confinement.sandbox_dir = seat_sandbox.dir
    confinement.owns_sandbox_dir = False
    return process


def _launch_command(
    spec: LaunchSpec, confinement: WorkerConfinement, fd: int
) -> tuple[list[str], dict[str, str]]:
    """Command (in the sandbox when it is on; not yet in its cgroup: the cgroup wraps it or
    the launcher moves it) and environment of the worker (SERVER §6, §14)."""
    env = worker_environment(spec.device, spec.gpu_ids, spec.gpu_uuids, spec.deny)
    command = [sys.executable, "-m", "kcoral_server.worker", "--fd", str(fd)]
    if spec.sandbox == "bubblewrap":
        sandbox_dir = sandbox_dir_for(spec.config, spec.device, spec.gpu_ids, env, spec.seats)
        confinement.sandbox_dir = sandbox_dir
        confinement.owns_sandbox_dir = True
        env = sandbox_dir.environment(env)
        command = sandbox_dir.command(command)
    wanted = limits.limits_from_config(spec.config, seats=spec.seats)
    confinement.cgroup = cgroups.create_cgroup(wanted)
    env.update(limits.worker_limit_environment(wanted, confinement.cgroup, spec.device))
    return command, env


def ready_info(spec: LaunchSpec, message: ipc.Message) -> WorkerInfo:
    """The worker's first message as its ``WorkerInfo``; ``WorkerStartError`` unless it is a
    ``WorkerReady`` on the GPU it was launched for."""
    if isinstance(message, ipc.WorkerStartFailed):
        raise WorkerStartError(message.error)
    if not isinstance(message, ipc.WorkerReady):
        raise WorkerStartError(f"unexpected start-up message {message.tag!r}")
    if (
        spec.device == "gpu"
        and spec.gpu_uuids
        and len(spec.gpu_ids) == 1
        and message.device_uuid
        and message.device_uuid != spec.gpu_uuids[0]
    ):
        raise WorkerStartError(
            f"worker reports device {message.device_uuid}, expected {spec.gpu_uuids[0]}"
        )
    return WorkerInfo(message.pid, message.target, message.versions, message.device_uuid)
