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
  Default (``None``): ``default_memory_limit`` (the workers' memory, below, shared by every
  seat that can hold a worker, at least 4 GiB or all of it), enforced only by a cgroup: an
  address-space rlimit nobody asked for would break programs that reserve far more than
  they touch.
* The whole worker tree (issue 28): every worker cgroup of a front-end lives under one
  parent whose memory limit is the workers' memory (``workers_memory_bytes``: the
  machine's, or the front-end's own cgroup limit where smaller, less ``memory_reserve`` for
  the front-end and the system). A per-worker limit alone, even a fair share, would let all
  seats together (or an explicit ``--worker-memory-limit-bytes`` times the seats) push the
  front-end out of memory; under the parent the kernel OOM-kills a worker first.
* Processes (``--worker-process-limit``; else the environment variable
  ``KCORAL_WORKER_PROCESS_LIMIT``; default ``DEFAULT_PROCESS_LIMIT``): a cgroup ``pids.max``
  (v2, or the v1 ``pids`` hierarchy); it counts threads too. ``RLIMIT_NPROC`` is not used:
  it counts per user and does not apply to root.

This module decides the limits (``limits_from_config``) and what the worker is told
(``worker_limit_environment``); ``kcoral_server.processes.cgroups`` enforces them (the
cgroups, the workers' parent, how a worker enters its cgroup before anything runs).

Stdlib only: the worker imports the environment-variable names and the helpers at the end.
"""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kcoral_server.processes.cgroups import memory_ceiling

if TYPE_CHECKING:
    from kcoral_server.processes.cgroups import WorkerCgroup

PROCESS_LIMIT_ENV = "KCORAL_WORKER_PROCESS_LIMIT"  # front-end setting (--worker-process-limit)
# Far above what a real GPU program needs (torch's thread pools, compile workers and data
# loaders stay in the hundreds even on big hosts), far below what exhausts a machine.
DEFAULT_PROCESS_LIMIT = 4096
# The default memory share never goes below this (nor above the workers' memory): a torch +
# CUDA worker needs a few GiB; the workers' parent limit still protects the front-end.
MIN_DEFAULT_MEMORY_BYTES = 4 * 1024**3
GIB = 1024**3
# Kept out of the workers' reach besides the front-end's memory cache
# (--cache-capacity-bytes): the front-end's own objects, the system and a shell; a
# sixteenth of the memory, between 1 and 4 GiB.
MIN_MEMORY_RESERVE_BYTES = GIB
MAX_MEMORY_RESERVE_BYTES = 4 * GIB
# Set in a worker's environment by the front-end:
MEMORY_LIMIT_ENV = "KCORAL_WORKER_MEMORY_LIMIT_BYTES"  # the limit, for messages
MEMORY_RLIMIT_ENV = "KCORAL_WORKER_MEMORY_RLIMIT"  # "AS" or "DATA" when the worker enforces it
PROCESS_LIMIT_NOTE_ENV = "KCORAL_WORKER_PROCESS_LIMIT_ENFORCED"  # the enforced pids.max


@dataclass(frozen=True)
class WorkerLimits:
    memory_bytes: int = 0  # 0 = none
    processes: int = 0  # 0 = none
    #: the memory limit is the default one: a cgroup enforces it or nothing does
    memory_cgroup_only: bool = False
    #: the limit of the parent of all of a front-end's workers (0 = none): see WorkerTree
    all_workers_memory_bytes: int = 0


def memory_reserve(memory: int, cache_bytes: int = 0) -> int:
    """What the workers' parent limit keeps free of ``memory`` for the front-end (its memory
    cache of ``cache_bytes`` and a sixteenth, between 1 and 4 GiB, for the rest of it and
    the system), never more than half of the memory."""
    base = min(max(memory // 16, MIN_MEMORY_RESERVE_BYTES), MAX_MEMORY_RESERVE_BYTES)
    return min(base + max(0, cache_bytes), memory // 2)


def workers_memory_bytes(cache_bytes: int = 0) -> int:
    """All the memory the workers may hold together (the parent limit): the machine's, or
    the front-end's own cgroup limit where smaller, less ``memory_reserve`` (0: unknown)."""
    from kcoral_server.settings.config import physical_memory_bytes

    memory = physical_memory_bytes() or 0
    ceiling = memory_ceiling()
    if ceiling:
        memory = min(memory, ceiling) if memory else ceiling
    if not memory:
        return 0
    return _whole_pages(memory - memory_reserve(memory, cache_bytes))


def _whole_pages(size: int) -> int:
    """``size`` rounded down to whole pages, as the kernel keeps a memory limit."""
    return size - size % resource.getpagesize()


def default_memory_limit(seats: int, cache_bytes: int = 0) -> int:
    """One worker's default memory share: the workers' memory divided over ``seats`` (every
    worker that can be alive at once: ``worker_seats``), at least 4 GiB unless the workers'
    memory is smaller (then all of it). Together the workers stay within their parent limit;
    one worker gets its fair share, which a real program stays within (0: memory unknown).
    ``cache_bytes``: the front-end's memory cache, which the reserve keeps out of the
    workers' reach."""
    memory = workers_memory_bytes(cache_bytes)
    if not memory:
        return 0
    return _whole_pages(max(memory // max(1, seats), min(memory, MIN_DEFAULT_MEMORY_BYTES)))


def keeps_spare_workers(config: Any) -> bool:
    """Whether each stateless seat keeps a spare worker started ahead (SERVER §6): every
    worker serves one program and ``--no-spare-workers`` is not given."""
    return getattr(config, "max_requests_per_worker", 1) == 1 and bool(
        getattr(config, "spare_workers", False)
    )


def worker_seats(config: Any, stateless_seats: int) -> int:
    """Every worker that can be alive at once, each a memory share: the pool's stateless
    seats (twice, when each keeps a spare) and its session seats (``--max-sessions``)."""
    sessions = getattr(config, "max_sessions", 0) or 0
    per_seat = 2 if keeps_spare_workers(config) else 1
    return max(1, stateless_seats * per_seat + int(sessions))


_MISSING = object()


def limits_from_config(
    config: Any, environ: Mapping[str, str] | None = None, *, seats: int = 1
) -> WorkerLimits:
    """The limits of ``config`` (a ``ServerConfig``, or any object whose missing fields mean
    no limit); ``None`` fields take the defaults, the memory shared by the ``seats``
    stateless seats and the config's session seats (``worker_seats``)."""
    if config is None:
        return WorkerLimits()
    environ = os.environ if environ is None else environ
    from_env: int | None = None
    with contextlib.suppress(ValueError):
        raw_env = environ.get(PROCESS_LIMIT_ENV, "")
        from_env = max(0, int(raw_env)) if raw_env else None
    configured: Any = getattr(config, "worker_process_limit", _MISSING)
    if configured is _MISSING:
        processes = from_env or 0
    elif configured is None:
        processes = DEFAULT_PROCESS_LIMIT if from_env is None else from_env
    else:
        processes = int(configured)
    memory = getattr(config, "worker_memory_limit_bytes", 0)
    cache = int(getattr(config, "cache_capacity_bytes", 0) or 0)
    if memory is None:
        share = default_memory_limit(worker_seats(config, seats), cache_bytes=cache)
        return WorkerLimits(
            share,
            processes,
            memory_cgroup_only=True,
            all_workers_memory_bytes=workers_memory_bytes(cache),
        )
    if not memory:
        return WorkerLimits(0, processes)  # the operator turned memory limits off
    # an explicit share times the seats may exceed the machine: the parent still holds
    return WorkerLimits(
        int(memory), processes, all_workers_memory_bytes=workers_memory_bytes(cache)
    )


def worker_limit_environment(
    limits: WorkerLimits, cgroup: WorkerCgroup, device: str
) -> dict[str, str]:
    """Variables telling the worker which limits apply and which it must set itself."""
    env: dict[str, str] = {}
    if limits.memory_bytes and (cgroup.memory_bytes or not limits.memory_cgroup_only):
        env[MEMORY_LIMIT_ENV] = str(limits.memory_bytes)
        if not cgroup.memory_bytes:
            env[MEMORY_RLIMIT_ENV] = "DATA" if device == "gpu" else "AS"
    if cgroup.processes:
        env[PROCESS_LIMIT_NOTE_ENV] = str(cgroup.processes)
    return env


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
