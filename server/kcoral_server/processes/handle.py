"""One worker process: its life from launch to kill (SERVER §6, §8, §11).

A handle owns the process and composes the worker's other ideas: its ``channel``
(``WorkerChannel``: the inbox of messages, interrupts), its ``lease`` (``LeaseHolder``: the
GPUs it may use and the current request's lease clock), how it is launched
(``processes.start``: fork, spawn, seat sandbox, its ``WorkerConfinement``) and how its exit is
noticed and its tree killed (``processes.exit``). Whoever drives a request receives through
``handle.channel`` and times through ``handle.lease``; only the pool starts, stops and
kills a handle.

Who can reach what: the worker runs *programs* (uploaded code). It is launched by
``kcoral_server.processes.start`` (environment without secrets, seat sandbox, fork server)
and runs inside its limits (``kcoral_server.processes.limits``, enforced by
``kcoral_server.processes.cgroups``) from its first instruction.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kcoral_server.gpu.lease import LeaseArbiter
from kcoral_server.gpu.worker_lease import LeaseHolder
from kcoral_server.processes import cgroups, ipc
from kcoral_server.processes.channel import WorkerChannel, WorkerGone, close_fds
from kcoral_server.processes.exit import kill_tree, poll_exit, survivors_of, watch_exit
from kcoral_server.processes.launch import SeatSandbox
from kcoral_server.processes.launcher.front_end import ForkedProcess
from kcoral_server.processes.progress_slot import ProgressSlot
from kcoral_server.processes.sandbox import SandboxDir
from kcoral_server.processes.start import (
    STARTUP_TIMEOUT_SECONDS,
    LaunchSpec,
    WorkerConfinement,
    WorkerInfo,
    WorkerProcess,
    WorkerStartError,
    ready_info,
)
from kcoral_server.processes.strays import StrayWatch, stray_watch

if TYPE_CHECKING:
    from kcoral_server.settings.config import ServerConfig
    from kcoral_server.storage.event_log import EventLog


def event_fields(handle: WorkerHandle) -> dict[str, Any]:
    """Who a worker is in an event: its seat, generation, pid and current request."""
    return {
        "worker_id": handle.seat_id,
        "generation": handle.generation,
        "pid": handle.pid,
        "request_id": handle.request_id,
    }


def described(handle: WorkerHandle, gone: WorkerGone) -> WorkerGone:
    """``gone``, naming the limit the worker hit if that is why it is gone (and logging it);
    not after a believed exit report, which decided the answer (SERVER §8)."""
    hit = None if handle.exit_announced else cgroups.limit_message(handle.cgroup)
    if hit is None:
        return gone
    if handle.events is not None:
        handle.events.emit("worker_limit_exceeded", "WARNING", **event_fields(handle), message=hit)
    return WorkerGone(f"{gone}; {hit}", invalid=gone.invalid, too_large=gone.too_large)


def worker_frame_limit(config: ServerConfig | None) -> int:
    """The largest message the front-end takes from a worker: what an answer may carry plus
    its envelope. A program owns its worker's end of the channel, and frames of up to 512
    MiB, read whole before they are decoded, took the front-end (which serves every
    identity) past a gigabyte for one message (SERVER §14)."""
    if config is None:
        return ipc.MAX_FRAME_BYTES
    return config.max_response_bytes + ipc.FRAME_ENVELOPE_BYTES


def configure_message(handle: WorkerHandle) -> ipc.Configure:
    """What ``handle``'s worker is told to be (its first message)."""
    return ipc.Configure(
        worker_id=handle.seat_id,
        generation=handle.generation,
        device=handle.device,
        gpu_ids=handle.gpu_ids,
        gpu_uuids=handle.gpu_uuids,
        sandbox=handle.sandbox,
        log_programs=handle.log_programs,
        allowed_serialization=handle.allowed_serialization,
        transient=handle.transient,
        warm_up=handle.transient and handle.configured_ahead,
    )


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
        config: ServerConfig | None = None,
        events: EventLog | None = None,
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
        self.os_process = WorkerProcess()  # the process and its confinement
        self.info: WorkerInfo | None = None
        #: configured while no program waits for it (a CPU spare): it may warm up first
        self.configured_ahead = False
        self.lease = LeaseHolder(
            arbiter if device != "cpu" else None,
            gpu_ids,
            grant=lambda: self._answer_lease(ipc.LeaseGranted()),
            refused=lambda why: self.channel.fail(WorkerGone(why)),
            withdrawn=lambda: self._answer_lease(ipc.LeaseWithdrawn()),
        )
        self.channel = WorkerChannel(
            on_lease=self._lease_message,
            describe=lambda gone: described(self, gone),
            on_gone=self._gone,
        )
        self._exit_event = asyncio.Event()
        self._exit_watch: asyncio.Task | None = None
        #: why ``kill`` could not confirm that the process tree is gone (None: confirmed or
        #: not killed yet); the pool quarantines the worker's GPUs (SERVER §8, §11)
        self.cleanup_unconfirmed: str | None = None
        self.killed = False  # ``kill`` ran to its end (it is not repeated)
        self.exit_announced = False  # its exit report was believed (SERVER §8, exit_report)
        # ProgressSlot shared with this process; unmapped with the handle (not by
        # ``close``: a crashed program's instruction is read from it after the kill)
        self.progress: ProgressSlot | None = None
        self._progress_unavailable = False
        #: where processes its programs leave are found (SERVER §8); set once it is ready
        self.strays: StrayWatch | None = None

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
        return survivors_of(self.process)

    @property
    def process(self) -> subprocess.Popen | ForkedProcess | None:
        return self.os_process.process

    @property
    def confinement(self) -> WorkerConfinement:
        return self.os_process.confinement

    @property
    def cgroup(self) -> cgroups.WorkerCgroup | None:
        return self.confinement.cgroup

    @property
    def sandbox_dir(self) -> SandboxDir | None:
        return self.confinement.sandbox_dir

    @property
    def returncode(self) -> int | None:
        return self.process.poll() if self.process is not None else None

    @property
    def launcher_returncode(self) -> int | None:
        """How the launcher that forked the worker ended, where the worker's exit code was
        lost with it (None otherwise)."""
        process = self.process
        return process.launcher_returncode if isinstance(process, ForkedProcess) else None

    # ------------------------------------------------------------------ start-up

    async def start(self, timeout: float = STARTUP_TIMEOUT_SECONDS) -> WorkerInfo:
        """Launch the process and wait for ``WorkerReady`` (lease requests are served)."""
        await self.launch()
        return await self.configure(timeout)

    async def launch(self, *, hold: bool = False, after_preload: bool = False) -> None:
        """Start the process (fork, spawn, seat sandbox); until ``configure`` it imports
        nothing more, initialises no GPU and runs no program (a spare worker, SERVER §6).
        ``hold``: forked ahead, it waits until ``os_process.release`` (``SpareWorkers``).
        ``after_preload``: no program waits for it, so its launcher preloads first."""
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        spec = functools.partial(launch_spec, self, after_preload)
        try:
            await self.os_process.launch(spec, child.fileno(), hold=hold)
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        assert self.process is not None
        self.channel.attach(parent, worker_frame_limit(self.config))
        self._exit_watch = asyncio.ensure_future(
            watch_exit(self.process, self.channel.process_exited, self._exit_event)
        )

    async def configure(self, timeout: float = STARTUP_TIMEOUT_SECONDS) -> WorkerInfo:
        """Send ``Configure`` to the launched worker and wait for ``WorkerReady``: a GPU
        worker initialises CUDA now, under the lease (SERVER §6 step 4); ``timeout`` counts
        its own work, not its wait for the lease (``startup_reply``)."""
        assert self.process is not None, "configure follows launch"
        try:
            self.send(configure_message(self))
            message, fds = await startup_reply(self.channel, self.lease, timeout)
        except (asyncio.TimeoutError, TimeoutError):
            raise WorkerStartError("worker start-up timed out") from None
        except WorkerGone as exc:
            raise WorkerStartError(f"worker exited during start-up: {exc}") from None
        except asyncio.CancelledError:
            self._abandon()  # e.g. a replacement cancelled by shutdown: leave nothing behind
            raise
        close_fds(fds)
        self.info = ready_info(launch_spec(self), message)
        # now, before any program: what is there belongs to the worker itself
        self.strays = stray_watch(self.process, self.cgroup)
        self.lease.release()
        self.lease.forget_start_up()
        return self.info

    def _abandon(self) -> None:
        """Leave nothing behind of a start-up or kill that was cancelled (e.g. a
        replacement during shutdown), which nobody will ``kill``."""
        self.os_process.kill_now()
        self.close()

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

    def progress_slot(self) -> tuple[ProgressSlot | None, int | None]:
        """This worker's progress slot, plus its memfd when the worker has not been sent it
        yet (the caller sends it with the program, then closes it). ``(None, None)`` where
        memfds cannot be sealed: the worker then reports every instruction by frame."""
        if self.progress is not None or self._progress_unavailable:
            return self.progress, None
        try:
            self.progress, fd = ProgressSlot.create()
        except (OSError, AttributeError, ValueError):  # no memfd_create, seals or mmap
            self._progress_unavailable = True
            return None, None
        return self.progress, fd

    def _lease_message(self, message: ipc.Message) -> None:
        if isinstance(message, ipc.LeaseAcquire):
            self.lease.worker_asks(lambda: self.gone is not None)
        else:
            self.lease.release()

    def _answer_lease(self, answer: ipc.Message) -> None:
        with contextlib.suppress(WorkerGone):
            self.channel.send(answer)

    def _gone(self) -> None:
        if self.on_gone is not None:
            self.on_gone(self)

    # ------------------------------------------------------------------ exit and kill

    async def wait_exit(self, timeout: float | None) -> bool:
        """Wait for the process to exit; True when it did within ``timeout``."""
        if self.process is None:
            return True
        if self._exit_watch is None:  # its launch was cancelled: nothing watches the exit
            return await poll_exit(self.process, timeout)
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
        ``cleanup_unconfirmed`` says whether the tree's end could not be confirmed
        (``exit.kill_tree``); only a confirmed end removes the confinement."""
        if self.process is None or self.killed:
            return
        try:
            self.cleanup_unconfirmed = await kill_tree(self.process, grace, self.wait_exit)
            if self.cleanup_unconfirmed is None and self.confinement.present:
                await asyncio.get_running_loop().run_in_executor(None, self.confinement.remove)
            self.close()
            self.killed = True
        except asyncio.CancelledError:
            self._abandon()  # e.g. shutdown cancelled a replacement while it killed the old one
            raise

    def close(self) -> None:
        """Stop asking for the lease and reading the channel (the process is not touched)."""
        self.lease.withdraw()
        self.channel.close()
        if self.returncode is not None:
            self.confinement.remove()  # normally done by kill(); never leave it behind


def launch_spec(handle: WorkerHandle, after_preload: bool = False) -> LaunchSpec:
    """What ``handle``'s worker is launched with, read when it is launched."""
    return LaunchSpec(
        device=handle.device,
        gpu_ids=handle.gpu_ids,
        gpu_uuids=handle.gpu_uuids,
        sandbox=handle.sandbox,
        config=handle.config,
        seats=handle.seats,
        seat_sandbox=handle.seat_sandbox,
        after_preload=after_preload,
    )


async def startup_reply(
    channel: WorkerChannel, lease: LeaseHolder, timeout: float
) -> tuple[ipc.Message, list[int]]:
    """The worker's answer to ``Configure`` within ``timeout`` seconds, not counting the time
    it waits for its GPU's lease, as a program's timeout does not (SERVER §5): a program of
    another worker holding the GPU for minutes made a new worker's start-up time out (team
    soak: a session behind a 300 s program failed `worker start-up timed out`), and the
    worker's kill then waited for that lease all the same."""
    started = time.monotonic()
    waited_before = lease.wait_so_far(started)
    while True:
        now = time.monotonic()
        waited = max(0.0, lease.wait_so_far(now) - waited_before)
        remaining = started + timeout + waited - now
        if remaining <= 0:
            raise TimeoutError()
        try:
            return await channel.receive(remaining)
        except TimeoutError:
            continue  # the deadline moved by the lease wait since, or it is past
