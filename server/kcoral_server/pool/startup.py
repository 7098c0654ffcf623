"""What a pool does on the host before its first workers start, and what it learns from the
first ones that did (SERVER.md §7 workspaces, §4 pool; README "Limits")."""

from __future__ import annotations

import asyncio
from typing import Any

from kcoral_server.pool.seat import GpuDevice, Seat
from kcoral_server.processes import cgroups, limits
from kcoral_server.processes.start import WorkerInfo
from kcoral_server.settings.config import ServerConfig
from kcoral_server.storage.event_log import EventLog
from kcoral_server.storage.workspace import remove_stale_workspaces


class PoolStartError(Exception):
    """The pool could not start (no worker came up, or mixed GPU architectures)."""


async def prepare_host(config: ServerConfig, seats: int, events: EventLog) -> None:
    """Tidy what killed servers left (workspaces whose lock is free, cgroups) and say once
    which per-worker limits no cgroup enforces, so that such a limit is never silent."""
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, remove_stale_workspaces)
    await loop.run_in_executor(None, cgroups.remove_stale_cgroups)
    wanted = limits.limits_from_config(config, seats=seats)
    missing = await loop.run_in_executor(None, cgroups.unenforced, wanted)
    if missing:
        events.emit(
            "worker_limits_unenforced",
            "WARNING",
            missing=missing,
            memory_bytes=wanted.memory_bytes,
            processes=wanted.processes,
            message="no writable cgroup enforces these per-worker limits: " + ", ".join(missing),
        )


def common_target(ready: list[Seat]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``target`` and ``versions`` the server reports, from the seats whose first worker
    started; ``PoolStartError`` when none did or their GPUs differ in architecture."""
    if not ready:
        raise PoolStartError("no worker could be started")
    infos = []
    for seat in ready:
        assert seat.worker is not None and seat.worker.info is not None  # it started
        infos.append(seat.worker.info)
    arches = {info.target.get("arch") for info in infos}
    if len(arches) > 1:
        raise PoolStartError(f"GPUs report different architectures: {sorted(arches, key=str)}")
    return dict(infos[0].target), dict(infos[0].versions)


def emit_ready(
    events: EventLog,
    seat: Seat,
    pid: int | None,
    info: WorkerInfo,
    gpu: GpuDevice | None,
    mode: str,
    **fields: Any,
) -> None:
    """The ``worker_ready`` event (SERVER.md §13) of ``seat``'s new worker in a ``mode``
    pool; ``fields`` add to it (``started_ahead``: a spare took over, SERVER §6). ``pid`` is
    the host's, as in ``worker_retired`` and ``request_routed`` (a sandboxed worker's own,
    in ``info``, is its PID namespace's)."""
    events.emit(
        "worker_ready",
        worker_id=seat.id,
        gpu_id=seat.gpu_id,
        generation=seat.generation,
        pid=pid if pid is not None else info.pid,
        device=info.device_uuid or (gpu.uuid if gpu and gpu.uuid else mode),
        arch=info.target.get("arch"),
        **fields,
    )


def emit_failed(events: EventLog, seat: Seat, generation: int, phase: str, error: object) -> None:
    """The ``worker_failed`` event (SERVER.md §13) of ``seat``'s worker ``generation`` that
    did not start (``phase``: ``startup``, ``respawn`` or ``spare``, SERVER §6)."""
    events.emit(
        "worker_failed",
        "ERROR",
        worker_id=seat.id,
        gpu_id=seat.gpu_id,
        generation=generation,
        phase=phase,
        error=str(error),
    )
