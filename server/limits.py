"""Per-worker resource limits: memory and process count, on by default (README "Limits").

Who can reach what: a *program* can make its worker start processes and allocate memory;
these limits stop one program from taking the whole machine from the other seats and the
front-end (a fork bomb, a runaway allocation).

* Memory (``--worker-memory-limit-bytes``): a cgroup v2 ``memory.max`` where a writable cgroup
  v2 with the memory controller is available (or a v1 ``memory.limit_in_bytes``; the kernel
  then OOM-kills the worker, and the front-end names the limit), else an rlimit the worker
  sets on itself at start-up (``RLIMIT_AS``; ``RLIMIT_DATA`` for CUDA workers, whose driver
  reserves far more address space than it uses), so an allocation fails with
  ``MemoryError`` inside the program.
  Default (``None``): ``default_memory_limit`` (physical memory shared by the seats, at
  least 4 GiB), enforced only by a cgroup: an address-space rlimit nobody asked for would
  break programs that reserve far more than they touch.
* Processes (``--worker-process-limit``; else the environment variable
  ``KCORAL_WORKER_PROCESS_LIMIT``; default ``DEFAULT_PROCESS_LIMIT``): a cgroup ``pids.max``
  (v2, or the v1 ``pids`` hierarchy); it counts threads too. ``RLIMIT_NPROC`` is not used:
  it counts per user and does not apply to root.

The worker's tree is placed in its cgroup before anything runs: a spawned worker's launch
command is wrapped in ``/bin/sh`` that writes its own pid into ``cgroup.procs`` and then
``exec``s the real command, so every later process (bwrap, the worker, its children) starts
inside; a worker forked by the launcher writes its pid there itself right after the fork,
before it runs anything else (``enter_cgroups``), so limits cost the fork server nothing.

Stdlib only: the worker imports the environment-variable names and the helpers at the end.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROCESS_LIMIT_ENV = "KCORAL_WORKER_PROCESS_LIMIT"  # front-end setting (--worker-process-limit)
# Far above what a real GPU program needs (torch's thread pools, compile workers and data
# loaders stay in the hundreds even on big hosts), far below what exhausts a machine.
DEFAULT_PROCESS_LIMIT = 4096
# The default memory share never goes below this: a torch + CUDA worker needs a few GiB.
MIN_DEFAULT_MEMORY_BYTES = 4 * 1024**3
# Set in a worker's environment by the front-end:
MEMORY_LIMIT_ENV = "KCORAL_WORKER_MEMORY_LIMIT_BYTES"  # the limit, for messages
MEMORY_RLIMIT_ENV = "KCORAL_WORKER_MEMORY_RLIMIT"  # "AS" or "DATA" when the worker enforces it
PROCESS_LIMIT_NOTE_ENV = "KCORAL_WORKER_PROCESS_LIMIT_ENFORCED"  # the enforced pids.max

CGROUP_MOUNT = Path("/sys/fs/cgroup")
CGROUP_PREFIX = "kcoral-worker-"
# Writes its pid into each cgroup.procs given before "--", then becomes the command.
SHIM = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


@dataclass(frozen=True)
class WorkerLimits:
    memory_bytes: int = 0  # 0 = none
    processes: int = 0  # 0 = none
    #: the memory limit is the default one: a cgroup enforces it or nothing does
    memory_cgroup_only: bool = False


def default_memory_limit(seats: int) -> int:
    """Physical memory shared by ``seats`` workers, at least 4 GiB (never more than the
    machine has): together the workers cannot push the front-end out of memory, and one
    worker gets its fair share, which a real program stays within (0: memory unknown)."""
    from kcoral_server.config import physical_memory_bytes

    memory = physical_memory_bytes()
    if not memory:
        return 0
    return max(memory // max(1, seats), min(memory, MIN_DEFAULT_MEMORY_BYTES))


_MISSING = object()


def limits_from_config(
    config: Any, environ: Mapping[str, str] | None = None, *, seats: int = 1
) -> WorkerLimits:
    """The limits of ``config`` (a ``ServerConfig``, or any object whose missing fields mean
    no limit); ``None`` fields take the defaults, ``seats`` workers sharing the memory."""
    if config is None:
        return WorkerLimits()
    environ = os.environ if environ is None else environ
    from_env: int | None = None
    with contextlib.suppress(ValueError):
        raw_env = environ.get(PROCESS_LIMIT_ENV, "")
        from_env = max(0, int(raw_env)) if raw_env else None
    processes = getattr(config, "worker_process_limit", _MISSING)
    if processes is _MISSING:
        processes = from_env or 0
    elif processes is None:
        processes = DEFAULT_PROCESS_LIMIT if from_env is None else from_env
    memory = getattr(config, "worker_memory_limit_bytes", 0)
    if memory is None:
        return WorkerLimits(default_memory_limit(seats), int(processes), memory_cgroup_only=True)
    return WorkerLimits(int(memory or 0), int(processes))


def _own_cgroups() -> dict[str, str]:
    """``controller -> path`` from ``/proc/self/cgroup`` (``""`` is the v2 hierarchy)."""
    found: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return found
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(",") if parts[1] else [""]:
            found[controller] = parts[2]
    return found


def _cgroup2_mount() -> Path | None:
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _sep, right = line.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup2":
            return Path(left.split()[4])
    return None


def _write(path: Path, text: str) -> bool:
    try:
        path.write_text(text)
    except OSError:
        return False
    return True


def _v2_parent(controllers: tuple[str, ...]) -> Path | None:
    """Our own v2 cgroup when it can hand ``controllers`` to a child we create."""
    mount = _cgroup2_mount()
    own = _own_cgroups().get("")
    if mount is None or own is None:
        return None
    parent = mount / own.lstrip("/")
    try:
        available = (parent / "cgroup.controllers").read_text().split()
        enabled = (parent / "cgroup.subtree_control").read_text().split()
    except OSError:
        return None
    for name in controllers:
        if name not in available:
            return None
        # Fails (EBUSY) in a non-root cgroup that holds processes itself: then no v2 here.
        if name not in enabled and not _write(parent / "cgroup.subtree_control", f"+{name}"):
            return None
    return parent if os.access(parent, os.W_OK) else None


@dataclass
class WorkerCgroup:
    """The cgroup(s) one worker's process tree runs in."""

    paths: list[Path] = field(default_factory=list)
    memory_bytes: int = 0  # enforced by memory.max (0: not by the cgroup)
    processes: int = 0  # enforced by pids.max (0: not enforced)

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a new worker writes its pid into (``enter_cgroups``)."""
        return [str(p / "cgroup.procs") for p in self.paths]

    def wrap(self, command: list[str]) -> list[str]:
        if not self.paths:
            return command
        return ["/bin/sh", "-c", SHIM, "kcoral-cgroup", *self.procs_files, "--", *command]

    def _counter(self, filename: str, key: str) -> int:
        for path in self.paths:
            try:
                lines = (path / filename).read_text().splitlines()
            except OSError:
                continue
            for line in lines:
                name, _sep, value = line.partition(" ")
                if name == key:
                    with contextlib.suppress(ValueError):
                        return int(value)
        return 0

    def memory_limit_hit(self) -> bool:
        """Whether the kernel OOM-killed something of this worker at its ``memory.max``."""
        if not self.memory_bytes:
            return False
        # v2 counts in memory.events, v1 in memory.oom_control
        kills = self._counter("memory.events", "oom_kill")
        return kills > 0 or self._counter("memory.oom_control", "oom_kill") > 0

    def process_limit_hit(self) -> bool:
        return bool(self.processes) and self._counter("pids.events", "max") > 0

    def pids(self) -> list[int]:
        found: list[int] = []
        for path in self.paths:
            with contextlib.suppress(OSError, ValueError):
                found += [int(p) for p in (path / "cgroup.procs").read_text().split()]
        return sorted(set(found))

    def kill_all(self) -> None:
        """SIGKILL everything still in the cgroup (nothing of a worker may outlive it)."""
        for path in self.paths:
            _write(path / "cgroup.kill", "1")
        for pid in self.pids():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def remove(self) -> bool:
        """Remove the cgroup(s); False while processes remain."""
        removed = True
        for path in self.paths:
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                removed = False
        return removed


def create_cgroup(limits: WorkerLimits) -> WorkerCgroup:
    """A cgroup enforcing what it can of ``limits`` (an empty one when none is writable)."""
    cgroup = WorkerCgroup()
    if not limits.memory_bytes and not limits.processes:
        return cgroup
    # The front-end's pid in the name: a front-end killed outright leaves empty cgroups that
    # the next server start removes (``remove_stale_cgroups``).
    name = f"{CGROUP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
    wanted = tuple(
        c for c, on in (("memory", limits.memory_bytes), ("pids", limits.processes)) if on
    )
    parent = _v2_parent(wanted)
    if parent is None and limits.memory_bytes:
        parent = _v2_parent(("memory",))
    if parent is None and limits.processes:
        parent = _v2_parent(("pids",))
    if parent is not None:
        path = parent / name
        try:
            path.mkdir()
        except OSError:
            path = None
        if path is not None:
            cgroup.paths.append(path)
            if limits.memory_bytes and _write(path / "memory.max", str(limits.memory_bytes)):
                _write(path / "memory.swap.max", "0")
                _write(path / "memory.oom.group", "1")  # kill the whole tree, not one child
                cgroup.memory_bytes = limits.memory_bytes
            if limits.processes and _write(path / "pids.max", str(limits.processes)):
                cgroup.processes = limits.processes
    if limits.memory_bytes and not cgroup.memory_bytes:
        _add_v1_memory(cgroup, name, limits.memory_bytes)
    if limits.processes and not cgroup.processes:
        own = _own_cgroups().get("pids")
        if own is not None:
            path = CGROUP_MOUNT / "pids" / own.lstrip("/") / name
            try:
                path.mkdir()
            except OSError:
                path = None
            if path is not None:
                if _write(path / "pids.max", str(limits.processes)):
                    cgroup.paths.append(path)
                    cgroup.processes = limits.processes
                else:
                    with contextlib.suppress(OSError):
                        path.rmdir()
    if not cgroup.memory_bytes and not cgroup.processes:
        cgroup.remove()
        cgroup.paths.clear()
    return cgroup


def _add_v1_memory(cgroup: WorkerCgroup, name: str, memory_bytes: int) -> None:
    """A cgroup v1 ``memory`` hierarchy's ``memory.limit_in_bytes`` (hosts without a v2
    memory controller); swap is capped at the same total where it is accounted."""
    own = _own_cgroups().get("memory")
    if own is None:
        return
    path = CGROUP_MOUNT / "memory" / own.lstrip("/") / name
    try:
        path.mkdir()
    except OSError:
        return
    if _write(path / "memory.limit_in_bytes", str(memory_bytes)):
        _write(path / "memory.memsw.limit_in_bytes", str(memory_bytes))
        cgroup.paths.append(path)
        cgroup.memory_bytes = memory_bytes
    else:
        with contextlib.suppress(OSError):
            path.rmdir()


def worker_limit_environment(limits: WorkerLimits, cgroup: WorkerCgroup, device: str) -> dict:
    """Variables telling the worker which limits apply and which it must set itself."""
    env: dict[str, str] = {}
    if limits.memory_bytes and (cgroup.memory_bytes or not limits.memory_cgroup_only):
        env[MEMORY_LIMIT_ENV] = str(limits.memory_bytes)
        if not cgroup.memory_bytes:
            env[MEMORY_RLIMIT_ENV] = "DATA" if device == "gpu" else "AS"
    if cgroup.processes:
        env[PROCESS_LIMIT_NOTE_ENV] = str(cgroup.processes)
    return env


def _cgroup_parents() -> list[Path]:
    """The directories ``create_cgroup`` makes worker cgroups in."""
    parents = []
    mount, own = _cgroup2_mount(), _own_cgroups()
    if mount is not None and own.get("") is not None:
        parents.append(mount / own[""].lstrip("/"))
    for controller in ("pids", "memory"):
        if own.get(controller) is not None:
            parents.append(CGROUP_MOUNT / controller / own[controller].lstrip("/"))
    return parents


def remove_stale_cgroups() -> int:
    """Remove empty worker cgroups of front-ends that no longer run (killed before they
    could clean up); returns how many went. A live front-end's are never touched."""
    removed = 0
    for parent in _cgroup_parents():
        for path in parent.glob(f"{CGROUP_PREFIX}*"):
            owner = path.name[len(CGROUP_PREFIX) :].split("-", 1)[0]
            if owner.isdigit() and os.path.exists(f"/proc/{owner}"):
                continue
            with contextlib.suppress(OSError):
                path.rmdir()  # fails while processes remain: only empty ones go
                removed += 1
    return removed


def unenforced(limits: WorkerLimits) -> list[str]:
    """The limits of ``limits`` that no cgroup here can enforce (a trial cgroup is made and
    removed): said once at start-up, so that a missing limit is never silent."""
    cgroup = create_cgroup(limits)
    try:
        missing = []
        if limits.memory_bytes and not cgroup.memory_bytes:
            missing.append(
                "memory (not enforced)"
                if limits.memory_cgroup_only
                else "memory (enforced by an rlimit instead)"
            )
        if limits.processes and not cgroup.processes:
            missing.append("processes (not enforced)")
        return missing
    finally:
        cgroup.remove()


def enter_cgroups(procs_files: list[str]) -> None:
    """In a freshly forked worker, before it runs anything: move into its cgroups (raises
    ``OSError``; the caller must then exit rather than run unlimited)."""
    for path in procs_files:
        with open(path, "w") as f:
            f.write("0")  # "0" is the writer itself (cgroup v1 and v2)


def limit_message(cgroup: WorkerCgroup | None) -> str | None:
    """Text naming the limit a dead worker hit, if its cgroup recorded one."""
    if cgroup is None:
        return None
    if cgroup.memory_limit_hit():
        return (
            f"the worker hit its memory limit of {cgroup.memory_bytes} bytes "
            "(--worker-memory-limit-bytes) and was killed"
        )
    if cgroup.process_limit_hit():
        return f"the worker hit its process limit of {cgroup.processes}"
    return None


# ---------------------------------------------------------------- worker side


def apply_memory_rlimit(environ: Mapping[str, str] | None = None) -> int:
    """Set the rlimit the front-end asked for (soft and hard, so a program cannot raise it
    again without privileges); returns the limit or 0."""
    environ = os.environ if environ is None else environ
    kind = environ.get(MEMORY_RLIMIT_ENV)
    try:
        limit = int(environ.get(MEMORY_LIMIT_ENV, "0") or "0")
    except ValueError:
        return 0
    if not kind or limit <= 0:
        return 0
    which = resource.RLIMIT_DATA if kind == "DATA" else resource.RLIMIT_AS
    _soft, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(which, (limit, limit))
    return limit


def memory_limit(environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    try:
        return int(environ.get(MEMORY_LIMIT_ENV, "0") or "0")
    except ValueError:
        return 0


def process_limit(environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    try:
        return int(environ.get(PROCESS_LIMIT_NOTE_ENV, "0") or "0")
    except ValueError:
        return 0
