"""Worker cgroups: the per-worker limits of ``limits.WorkerLimits`` enforced by the kernel.

* Each worker's process tree runs in a cgroup of its own (``WorkerCgroup``, made by
  ``create_cgroup``): a v2 cgroup with ``memory.max`` and ``pids.max`` where a writable cgroup
  v2 hands out those controllers, else the v1 ``memory`` and ``pids`` hierarchies; the kernel
  OOM-kills a worker at its memory limit (``limit_message`` names it afterwards), and
  ``pids.max`` counts threads too.
* The whole worker tree (issue 28): every worker cgroup of a front-end lives under one
  parent, ``kcoral-workers-<front-end pid>`` (``WorkerTree``), whose memory limit is the
  workers' memory (``limits.workers_memory_bytes``). Under cgroup v2 a cgroup that hands
  controllers to children may hold no process itself ("no internal processes"), so the
  front-end (with its launchers) first moves into a leaf of its own, ``kcoral-front-end``,
  next to the workers' parent. ``memory_ceiling`` reads the limit of the cgroup the
  front-end was started in, before it moves.

The worker's tree is placed in its cgroup before anything runs: a spawned worker's launch
command is wrapped in ``/bin/sh`` that writes its own pid into ``cgroup.procs`` and then
``exec``s the real command (``WorkerCgroup.wrap``), so every later process (bwrap, the
worker, its children) starts inside; a worker forked by the launcher writes its pid there
itself right after the fork, before it runs anything else (``enter_cgroups``), so limits
cost the fork server nothing. A front-end killed outright leaves empty cgroups that the
next server start removes (``remove_stale_cgroups``).

Stdlib only: the forked worker's first step (``enter_cgroups``) runs in the fork server.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kcoral_server.processes.procfs import read_kernel_file

if TYPE_CHECKING:
    from kcoral_server.processes.limits import WorkerLimits

CGROUP_MOUNT = Path("/sys/fs/cgroup")
CGROUP_PREFIX = "kcoral-worker-"
# The parent of one front-end's worker cgroups (its pid follows), and the v2 leaf the
# front-end moves into so that its own cgroup may hand controllers to that parent.
TREE_PREFIX = "kcoral-workers-"
FRONT_END_LEAF = "kcoral-front-end"
# Writes its pid into each cgroup.procs given before "--", then becomes the command.
SHIM = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


_ceilings: dict[int, int] = {}  # by pid: read once, before the front-end moves into its leaf


def memory_ceiling() -> int:
    """The memory limit of the cgroup the front-end was started in (``_own_memory_ceiling``),
    read once per process, before the front-end may move into its leaf."""
    pid = os.getpid()
    if pid not in _ceilings:
        _ceilings[pid] = _own_memory_ceiling()
    return _ceilings[pid]


def _own_memory_ceiling() -> int:
    """The smallest memory limit of the cgroup the front-end runs in and its ancestors (a
    container's, a systemd unit's or slice's ``MemoryMax``), 0 when none is set or
    readable."""
    own = _own_cgroups()
    hierarchies = []
    mount = _cgroup2_mount()
    if mount is not None and own.get("") is not None:
        hierarchies.append((mount, own[""], "memory.max"))
    if own.get("memory") is not None:
        hierarchies.append((CGROUP_MOUNT / "memory", own["memory"], "memory.limit_in_bytes"))
    found = 0
    for root, path, filename in hierarchies:
        cgroup = root / path.lstrip("/")
        for directory in [cgroup, *cgroup.parents]:
            if directory != root and root not in directory.parents:
                break  # above the hierarchy's mount
            with contextlib.suppress(OSError, ValueError):
                value = int((directory / filename).read_text().strip())
                if 0 < value < 1 << 60:  # v1 writes "no limit" as a huge number
                    found = min(found, value) if found else value
    return found


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


def _write_raw(path: Path | str, data: bytes) -> None:
    """Write ``data`` to a cgroup file by raw calls (raises ``OSError``): a worker's
    cgroups take five writes per start and one or two moves, and a file object
    (``Path.write_text``, ``open``) cost three more system calls and more Python than the
    write itself; in a fresh fork, also pages of the fork server's heap copied."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _write(path: Path | str, text: str) -> bool:
    """``_write_raw``; False when the kernel refused it."""
    try:
        _write_raw(path, text.encode())
    except OSError:
        return False
    return True


def _enable(cgroup: Path, controller: str) -> bool:
    """Hand ``controller`` to the children of ``cgroup`` (fails, EBUSY, in a non-root v2
    cgroup that holds processes itself)."""
    try:
        if controller in (cgroup / "cgroup.subtree_control").read_text().split():
            return True
    except OSError:
        return False
    return _write(cgroup / "cgroup.subtree_control", f"+{controller}")


def _move_front_end_to_leaf(parent: Path) -> None:
    """Move every process of ``parent`` (the front-end, its launchers and, on a node, its
    supervisor) into the leaf ``parent/kcoral-front-end``: cgroup v2's "no internal
    processes" rule lets ``parent`` hand its controllers to the workers' parent only once it
    holds no process itself. ``parent`` is the cgroup the front-end was started in: its
    systemd unit's (``Delegate=yes``: all of it is the unit's) or its container's, so what
    else runs there moves along, as in a delegated container's own init."""
    leaf = parent / FRONT_END_LEAF
    try:
        leaf.mkdir(exist_ok=True)
        pids = (parent / "cgroup.procs").read_text().split()
    except OSError:
        return
    for pid in pids:
        _write(leaf / "cgroup.procs", pid)  # a process gone meanwhile: nothing to move


def _v2_tree(name: str) -> tuple[Path | None, tuple[str, ...]]:
    """This front-end's workers' parent in the v2 hierarchy and the controllers it hands to
    worker cgroups (``None`` where no writable v2 cgroup with ``memory`` or ``pids`` is)."""
    mount = _cgroup2_mount()
    own = _own_cgroups().get("")
    if mount is None or own is None:
        return None, ()
    parent = mount / own.lstrip("/")
    try:
        available = (parent / "cgroup.controllers").read_text().split()
    except OSError:
        return None, ()
    wanted = [c for c in ("memory", "pids") if c in available]
    if not wanted or not os.access(parent, os.W_OK):
        return None, ()
    if not _enable(parent, wanted[0]):
        _move_front_end_to_leaf(parent)
    handed = [c for c in wanted if _enable(parent, c)]
    if not handed:
        return None, ()
    tree = parent / name
    try:
        tree.mkdir(exist_ok=True)
    except OSError:
        return None, ()
    return tree, tuple(c for c in handed if _enable(tree, c))


def _v1_tree(name: str) -> Path | None:
    """This front-end's workers' parent in the v1 ``memory`` hierarchy (hosts without a v2
    memory controller); v1 has no rule against processes next to child cgroups."""
    own = _own_cgroups().get("memory")
    if own is None:
        return None
    tree = CGROUP_MOUNT / "memory" / own.lstrip("/") / name
    try:
        tree.mkdir(exist_ok=True)
    except OSError:
        return None
    return tree


def _set_v1_memory_limit(path: Path, memory_bytes: int) -> bool:
    """``memory.limit_in_bytes`` and, where swap is accounted, the same total for memory
    plus swap (the kernel wants memsw >= the limit at every step: the order depends)."""
    if _write(path / "memory.limit_in_bytes", str(memory_bytes)):
        _write(path / "memory.memsw.limit_in_bytes", str(memory_bytes))
        return True
    _write(path / "memory.memsw.limit_in_bytes", str(memory_bytes))
    return _write(path / "memory.limit_in_bytes", str(memory_bytes))


@dataclass
class WorkerTree:
    """The parent of all of one front-end's worker cgroups, in each hierarchy that has one,
    and the memory limit that holds for all its workers together (0: none enforced)."""

    v2: Path | None = None
    v2_controllers: tuple[str, ...] = ()
    v1_memory: Path | None = None
    memory_bytes: int = 0

    def limit_memory(self, memory_bytes: int) -> None:
        """Make ``memory_bytes`` the limit of the whole tree (no swap beyond it)."""
        if not memory_bytes or memory_bytes == self.memory_bytes:
            return
        enforced = False
        if self.v2 is not None and "memory" in self.v2_controllers:
            enforced = _write(self.v2 / "memory.max", str(memory_bytes))
            if enforced:
                _write(self.v2 / "memory.swap.max", "0")
        if self.v1_memory is not None:
            enforced = _set_v1_memory_limit(self.v1_memory, memory_bytes) or enforced
        if enforced:
            self.memory_bytes = memory_bytes

    def remove(self) -> None:
        """Remove the parents once their worker cgroups are gone (at the front-end's exit;
        ``remove_stale_cgroups`` takes those of a front-end that was killed)."""
        for path in (self.v2, self.v1_memory):
            if path is not None:
                with contextlib.suppress(OSError):
                    path.rmdir()


_trees: dict[int, WorkerTree] = {}  # by pid: a forked child never uses its parent's
_trees_lock = threading.Lock()


def worker_tree(all_workers_memory_bytes: int = 0) -> WorkerTree:
    """This front-end's ``WorkerTree`` (made on first use, removed at exit), its memory
    limited to ``all_workers_memory_bytes`` where that is given."""
    with _trees_lock:
        tree = _trees.get(os.getpid())
        if tree is None:
            memory_ceiling()  # read before the front-end may move into its leaf
            name = f"{TREE_PREFIX}{os.getpid()}"
            v2, controllers = _v2_tree(name)
            tree = WorkerTree(v2, controllers, None if "memory" in controllers else _v1_tree(name))
            _trees[os.getpid()] = tree
            atexit.register(tree.remove)
        tree.limit_memory(all_workers_memory_bytes)
        return tree


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
        """The processes in the cgroup(s); read after every program (the strays check,
        SERVER §8)."""
        found: list[int] = []
        for path in self.paths:  # a string join: ``Path /`` cost more than the read here
            with contextlib.suppress(OSError, ValueError):
                found += [int(p) for p in read_kernel_file(f"{path}/cgroup.procs").split()]
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
    tree = worker_tree(limits.all_workers_memory_bytes if limits.memory_bytes else 0)
    usable = [c for c in wanted if c in tree.v2_controllers]
    if tree.v2 is not None and usable:
        path: Path | None = tree.v2 / name
        try:
            path.mkdir()  # type: ignore[union-attr]
        except OSError:
            path = None
        if path is not None:
            cgroup.paths.append(path)
            if "memory" in usable and _write(path / "memory.max", str(limits.memory_bytes)):
                _write(path / "memory.swap.max", "0")
                _write(path / "memory.oom.group", "1")  # kill the whole tree, not one child
                cgroup.memory_bytes = limits.memory_bytes
            if "pids" in usable and _write(path / "pids.max", str(limits.processes)):
                cgroup.processes = limits.processes
    if limits.memory_bytes and not cgroup.memory_bytes and tree.v1_memory is not None:
        _add_v1_memory(cgroup, tree.v1_memory / name, limits.memory_bytes)
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


def _add_v1_memory(cgroup: WorkerCgroup, path: Path, memory_bytes: int) -> None:
    """A cgroup v1 ``memory`` hierarchy's ``memory.limit_in_bytes`` at ``path`` (hosts
    without a v2 memory controller); swap is capped at the same total where it is
    accounted."""
    try:
        path.mkdir()
    except OSError:
        return
    if _set_v1_memory_limit(path, memory_bytes):
        cgroup.paths.append(path)
        cgroup.memory_bytes = memory_bytes
    else:
        with contextlib.suppress(OSError):
            path.rmdir()


def _cgroup_parents() -> list[Path]:
    """The directories that hold worker cgroups and workers' parents (``create_cgroup``)."""
    parents = []
    mount, own = _cgroup2_mount(), _own_cgroups()
    if mount is not None and own.get("") is not None:
        parents.append(mount / own[""].lstrip("/"))
    for controller in ("pids", "memory"):
        if own.get(controller) is not None:
            parents.append(CGROUP_MOUNT / controller / own[controller].lstrip("/"))
    return parents


def _owner_runs(path: Path, prefix: str) -> bool:
    owner = path.name[len(prefix) :].split("-", 1)[0]
    return owner.isdigit() and os.path.exists(f"/proc/{owner}")


def remove_stale_cgroups() -> int:
    """Remove empty worker cgroups (and workers' parents) of front-ends that no longer run
    (killed before they could clean up); returns how many went. A live front-end's are
    never touched."""
    removed = 0
    for parent in _cgroup_parents():
        trees = [t for t in parent.glob(f"{TREE_PREFIX}*") if not _owner_runs(t, TREE_PREFIX)]
        # worker cgroups of the old flat layout (and v1 pids), then inside dead parents
        for holder in [parent, *trees]:
            for path in holder.glob(f"{CGROUP_PREFIX}*"):
                if _owner_runs(path, CGROUP_PREFIX):
                    continue
                with contextlib.suppress(OSError):
                    path.rmdir()  # fails while processes remain: only empty ones go
                    removed += 1
        for tree in trees:
            with contextlib.suppress(OSError):
                tree.rmdir()
                removed += 1
    return removed


def unenforced(limits: WorkerLimits) -> list[str]:
    """The limits of ``limits`` that no cgroup here can enforce (a trial cgroup is made and
    removed): said once at start-up, so that a missing limit is never silent. Each is named
    as the warning's list reads after "no writable cgroup enforces": ``memory``,
    ``processes``, or ``memory (an rlimit does instead)`` (it said "(not enforced)" after
    each, the warning's own words again)."""
    cgroup = create_cgroup(limits)
    try:
        missing = []
        if limits.memory_bytes and not cgroup.memory_bytes:
            missing.append(
                "memory" if limits.memory_cgroup_only else "memory (an rlimit does instead)"
            )
        if limits.processes and not cgroup.processes:
            missing.append("processes")
        return missing
    finally:
        cgroup.remove()


def enter_cgroups(procs_files: Sequence[str], pid: int = 0) -> None:
    """Move ``pid`` into the cgroups whose ``cgroup.procs`` files ``procs_files`` names (0,
    cgroup v1 and v2 alike: the writer itself, a freshly forked worker before it runs
    anything; the front-end moves each sandboxed worker by its pid); raises ``OSError``:
    the worker must then not run, unlimited."""
    data = b"0" if pid == 0 else str(pid).encode()
    for path in procs_files:
        _write_raw(path, data)


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
