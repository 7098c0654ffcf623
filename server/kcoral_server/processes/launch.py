"""Where a worker process comes from: its environment, its seat's sandbox, the fork server.

Who can reach what: the worker runs *programs* (uploaded code). Its environment starts from
``sandbox.worker_base_environment`` (no KCoral secret, no ``--worker-env-deny``ed variable)
in every sandbox mode and on both launch paths (forked from a launcher, or spawned).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kcoral_server.processes import limits
from kcoral_server.processes.launcher.front_end import (
    ForkedProcess,
    Launcher,
    LauncherError,
    LauncherRefused,
    shared_launcher,
)
from kcoral_server.processes.rank_variables import is_rank_variable
from kcoral_server.processes.sandbox import (
    DEFAULT_TMPFS_BYTES,
    SandboxDir,
    server_private_paths,
    worker_base_environment,
)
from kcoral_server.worker.confinement import clear_workspace


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


#: ``--worker-preload`` values -> the modules the fork servers import (SERVER §1)
WORKER_PRELOADS = {"torch": ("torch",), "none": ()}


def preload_for(config: Any) -> tuple[str, ...]:
    """The modules a fork server of a server configured with ``config`` preloads."""
    return WORKER_PRELOADS.get(getattr(config, "worker_preload", "torch"), ())


#: the smallest size of a sandbox's /tmp, /var/tmp and /dev/shm
MIN_TMPFS_BYTES = 64 * 1024**2


def tmpfs_bytes_for(config: Any, seats: int) -> int:
    """The size of each of a sandbox's ``/tmp``, ``/var/tmp`` and ``/dev/shm``: a quarter of
    the worker's memory share (``--worker-memory-limit-bytes`` or the default share, also
    where nothing enforces it), at least 64 MiB. Their pages count against the worker's
    memory cgroup, so together with its own memory they can never pass the share; the
    size bounds them where no cgroup does."""
    wanted = limits.limits_from_config(config, {}, seats=seats)
    share = wanted.memory_bytes or limits.default_memory_limit(limits.worker_seats(config, seats))
    if not share:
        return DEFAULT_TMPFS_BYTES
    return max(MIN_TMPFS_BYTES, share // 4)


def private_paths_of(config: Any) -> list[Path]:
    """What the server configured with ``config`` writes or reads for itself and no program
    may read (SERVER §14): the client token file, the event log (every identity's program
    sources, events and output capture), the disk cache (every identity's uploads), and
    what ``sandbox.keep_from_programs`` registered (the ready file). The job spill
    directory lies in the temporary directory, which no bind may contain (its ancestors
    are refused, ``check_readonly_paths``), and each sandbox has its own ``/tmp``.

    The log and disk cache directories are made now when missing, so that a sandbox hides
    them even if the server creates them only later (0700, as their owners make them)."""
    paths = [Path(p) for p in server_private_paths()]
    token_file = getattr(config, "auth_token_file", None)
    if token_file is not None:
        paths.append(Path(token_file))
    directories = [getattr(config, "log_dir", None)]
    if getattr(config, "disk_cache_capacity_mbytes", 0):
        directories.append(getattr(config, "disk_cache_dir", None))
    for directory in directories:
        if directory is None or str(directory) == "":
            continue
        path = Path(os.path.abspath(directory))
        with contextlib.suppress(OSError):
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        paths.append(path)
    return paths


def sandbox_dir_for(
    config: Any, device: str, gpu_ids: Sequence[int], env: dict, seats: int = 1
) -> SandboxDir:
    paths = getattr(config, "sandbox_readonly_paths", None) or []
    return SandboxDir(
        readonly_paths=paths,
        device=device,
        gpu_ids=gpu_ids,
        environ=env,
        hidden_paths=private_paths_of(config),
        tmpfs_bytes=tmpfs_bytes_for(config, seats),
    )


class SeatSandbox:
    """One seat's bubblewrap sandbox, kept across its workers: a sandbox directory and a fork
    server started inside it, so that a fresh sandboxed worker is a fork (~25 ms) rather than
    a ``bwrap`` start plus an interpreter's imports.

    Who can reach what: everything a program leaves in the sandbox's ``HOME`` and caches
    stays for the seat's next workers, so the sandbox belongs to one ``identity`` at a time
    (``Pool.serve_identity`` discards it for another); the workspace and ``/tmp`` are emptied
    before every new worker. Created lazily, in the launch thread (directories, processes)."""

    def __init__(self, *, config: Any, device: str, gpu_ids: Sequence[int], seats: int = 1) -> None:
        self.config = config
        self.device = device
        self.gpu_ids = list(gpu_ids)
        self.seats = seats  # the pool's stateless seats, for the tmpfs size
        self.identity: str | None = None
        self.dir: SandboxDir | None = None
        self._launcher: Launcher | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._abandoned = False  # the server is stopping (``abandon``)
        #: a program passed --workspace-limit-bytes here: the next worker gets a fresh
        #: directory (what it left in HOME and caches would end the next programs too)
        self.spoiled = False
        #: discarded directories that could not be removed yet
        self._leftovers: list[SandboxDir] = []

    def launch(
        self,
        fd: int,
        env: dict[str, str],
        cgroups: Sequence[str],
        *,
        hold: bool = False,
        after_preload: bool = False,
    ) -> ForkedProcess:
        """Fork a worker inside the sandbox (blocking). ``env`` is the worker's environment
        outside; it is translated (§14 variables). ``hold``: a worker forked ahead, while
        another may still run in the directory, which it leaves alone until ``release``
        empties it. ``after_preload``: see ``Launcher.launch``. Raises ``LauncherError``."""
        with self._lock:
            if self._closed or self._abandoned:
                raise LauncherError("the seat's sandbox is closed")
            if not hold:
                self._empty_locked()
            if self.dir is None:
                self.dir = sandbox_dir_for(self.config, self.device, self.gpu_ids, env, self.seats)
                self._launcher = Launcher(wrap=self.dir.command, preload=preload_for(self.config))
                if self._abandoned:  # came while it was made (``abandon`` saw no launcher)
                    self._launcher.abandon()
            assert self._launcher is not None
            worker_env = self.dir.environment(env)
            launcher_env = {  # without the per-worker limit notes
                name: value
                for name, value in worker_env.items()
                if not name.startswith("KCORAL_WORKER_")
            }
            return self._launcher.launch(
                fd,
                worker_env,
                cgroups=cgroups,
                launcher_env=launcher_env,
                hold=hold,
                after_preload=after_preload,
            )

    def release(self, process: ForkedProcess) -> None:
        """Empty the directory for ``process``, forked ahead here, and tell it to go on
        (blocking). Raises ``LauncherError`` when it cannot: the directory was replaced
        since (another identity, a workspace that could not be emptied) or the worker is
        gone; the caller kills it and forks anew."""
        with self._lock:
            if self._closed:
                raise LauncherError("the seat's sandbox is closed")
            launcher = self._launcher
            if launcher is None or process.forks is not launcher.forks:
                raise LauncherError("the seat's sandbox was replaced since the worker forked")
            if not self._empty_locked(held=process):
                raise LauncherError("the seat's sandbox could not be emptied")
            try:
                process.release()
            except OSError as exc:
                raise LauncherError(f"the worker forked ahead is gone: {exc}") from None

    def _empty_locked(self, held: ForkedProcess | None = None) -> bool:
        """Empty the workspace for the next worker; a spoiled directory, or one the
        front-end cannot empty, is discarded (its fork server and workers with it), and
        ``held``, a worker forked ahead in it, dropped first (a fork server stops only once
        its last child has exited). False when it was discarded."""
        # clear_workspace never raises (a tree of any depth a program of any token holder
        # left: audit F1); whatever still went wrong discards the directory, never the seat
        try:
            kept = self.dir is None or (
                not self.spoiled and clear_workspace(str(self.dir.host_dir))
            )
        except Exception:
            kept = False
        if not kept:
            if held is not None:
                held.drop()
            self._discard()  # a workspace the front-end cannot empty: start afresh
        self.spoiled = False
        return kept

    def _discard(self) -> None:
        """Stop the directory's fork server and remove the directory; the next worker gets
        a fresh one. What cannot be removed (never by a program's shape: ``storage.trees``
        copes with any depth and permissions) stays for the next ``close``."""
        if self._launcher is not None:
            self._launcher.close()
            self._launcher = None
        if self.dir is not None:
            if not self.dir.remove():
                self._leftovers.append(self.dir)
            self.dir = None
        self._leftovers = [old for old in self._leftovers if not old.remove()]

    def abandon(self) -> None:
        """The server is stopping: hang up on the fork server now (``Launcher.abandon``),
        without the lock a launch in flight holds; ``close`` follows."""
        self._abandoned = True
        launcher = self._launcher
        if launcher is not None:
            launcher.abandon()

    def close(self) -> None:
        """Stop the fork server (its workers are gone already) and remove the directory
        (blocking)."""
        with self._lock:
            self._closed = True
            self._discard()


#: ``spawn`` turns the fork server off (every worker is a new interpreter)
LAUNCH_ENV = "KCORAL_WORKER_LAUNCH"


def workers_are_spawned() -> bool:
    """Whether the fork server is turned off (``LAUNCH_ENV=spawn``)."""
    return os.environ.get(LAUNCH_ENV, "fork") == "spawn"


def fork_worker(
    fd: int,
    env: dict[str, str],
    cgroups: Sequence[str],
    deny: Sequence[str],
    config: Any = None,
    *,
    hold: bool = False,
    after_preload: bool = False,
) -> ForkedProcess | None:
    """An unsandboxed worker is forked from the preloaded launcher (~25 ms instead of an
    interpreter start plus imports); it moves itself into ``cgroups`` first (and with
    ``hold`` waits there for its release). ``None``: spawn it. Raises ``LauncherRefused``
    when the launcher broke the fork rule (SERVER §1)."""
    if workers_are_spawned():
        return None
    try:
        return shared_launcher(preload_for(config)).launch(
            fd,
            env,
            cgroups=cgroups,
            launcher_env=worker_base_environment(os.environ, deny),
            hold=hold,
            after_preload=after_preload,
        )
    except LauncherRefused:
        raise  # a launcher that forks unsafely is reported, not worked around
    except LauncherError:
        return None  # the launcher is broken: spawning still works
